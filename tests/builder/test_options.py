"""``BuildOptions``: ``build()``'s options as one checked object, or the same fields as
keywords; every option checked before the model file is imported."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qkan_pack import BuildOptions, OptionError, ShapeSpecError, build, read_artifact
from qkan_pack.cli import cli

from ..conftest import MODELS

MLP = MODELS / "plain_mlp.py"
#: A model file whose import would fail: options must be refused before it is imported.
EXPLODES = "raise SystemExit('the model file was imported')\n"


def test_options_and_keywords_build_the_same_artifact(tmp_path: Path) -> None:
    chosen = {"seed": 7, "labels": {"team": "search"}, "pad": {"x": 0.0}, "progress": False}
    by_keywords = build(MLP, "1x2,4x2", output=tmp_path / "a", **chosen)
    by_options = build(MLP, "1x2,4x2",
                       options=BuildOptions(output=tmp_path / "b", **chosen))
    assert by_options.digest == by_keywords.digest
    assert read_artifact(tmp_path / "b").manifest.padding is not None


def test_an_unknown_keyword_names_the_options() -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['pads'\]; options: .*'pad'"):
        build(MLP, "1x2", pads={"x": 0})


def test_options_and_keywords_together_are_refused() -> None:
    with pytest.raises(TypeError, match="either options=BuildOptions"):
        build(MLP, "1x2", options=BuildOptions(), seed=1)


@pytest.mark.parametrize(("option", "value", "says"), [
    # a lone string was iterated: submodules "Block" recorded as classes B, l, o, c, k
    ("submodules", "Block", "a list of class names"),
    # ... and includes "helper.py" as files h, e, l, ... ("--include h is not a .py file")
    ("includes", "helper.py", "a list of file paths"),
    # any truthy value replaced an existing artifact
    ("force", "no", "True or False"),
    ("allow_constant_references", 1, "True or False"),
    ("progress", "off", "True or False"),
    ("output", 3, "a file path"),
    ("weights", b"w.pt", "a file path"),
    ("batch_sizes", "1,8", "a list of batch sizes"),
    ("pad", [("x", 0)], "a mapping of input names"),
    ("entry", None, "text"),
    ("dtype", 5, "a dtype name"),
])
def test_an_option_outside_its_domain_is_refused_naming_it(tmp_path: Path, option: str,
                                                            value: object, says: str) -> None:
    model = tmp_path / "model.py"
    model.write_text(EXPLODES)
    with pytest.raises(OptionError, match=says) as caught:  # not ModelSourceError: no import
        build(model, "1x2", **{option: value})
    assert caught.value.option == option


@pytest.mark.parametrize(("options", "error"), [
    ({"capture": "always"}, ShapeSpecError),
    ({"capture": "full", "submodules": ["Block"]}, ShapeSpecError),
    ({"submodules": ["not a class"]}, ShapeSpecError),
    ({"seed": -1}, ShapeSpecError),
    ({"config": {"bad key": 1}}, ShapeSpecError),
    ({"labels": {"bad key": "x"}}, ShapeSpecError),
    ({"model_version": ""}, ShapeSpecError),
    ({"max_error": 0.1}, OptionError),
    ({"precision": "fp8"}, OptionError),
    ({"calibration": "inputs.npz"}, OptionError),
])
def test_options_are_checked_before_the_model_file_is_imported(tmp_path: Path, options: dict,
                                                              error: type) -> None:
    model = tmp_path / "model.py"
    model.write_text(EXPLODES)
    with pytest.raises(error):
        BuildOptions(**options)
    with pytest.raises(error):
        build(model, "1x2", output=tmp_path / "a", **options)


def test_options_are_normalised_and_frozen() -> None:
    options = BuildOptions(submodules=[" Block ", ""], includes=["a.py"], labels=None, pad={},
                           precision="bf16", config={"width": (1, 2)})
    assert options.submodules == ("Block",)
    assert options.includes == (Path("a.py"),)
    assert options.labels == {} and options.pad is None
    assert options.max_error is not None  # a reduced precision gets the default bound
    assert options.config == {"width": [1, 2]}  # as a load will see it
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 1  # type: ignore[misc]


def test_the_build_command_passes_its_options_by_their_build_names() -> None:
    """The command's options are BuildOptions fields of the same name (``--pad``: ``pad``,
    ``--license``: ``license``), besides the few the command reads itself."""
    command_only = {"model_py", "shapes", "inputs", "dtype", "warm_device", "as_json"}
    names = {param.name for param in cli.commands["build"].params} - command_only
    fields = {field.name for field in dataclasses.fields(BuildOptions)}
    assert names <= fields, names - fields
