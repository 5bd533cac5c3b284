"""What ``build()`` takes to draw reference inputs: ``input_range`` for float inputs, the
seed, the total size of the declared shapes, and Python spellings in a config (issue 32,
item 11). Each bad value is a ``ShapeSpecError`` raised before anything is allocated."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from safetensors.torch import load as load_tensors

from qkan_pack import ShapeSpecError, build, read_artifact
from qkan_pack.format import parse_config_items

from ..conftest import MODELS

MLP = MODELS / "plain_mlp.py"


def reference_input(path: Path, index: int = 0, name: str = "input.input") -> object:
    artifact = read_artifact(path)
    return load_tensors(bytes(artifact.files[artifact.manifest.shapes[index].reference]))[name]


def test_an_input_range_draws_float_inputs_uniformly_from_it(tmp_path: Path) -> None:
    """Audit: ``input_range`` was ignored for float inputs (standard normal references)
    though ``--help`` said uniform."""
    path = build(MLP, "64x2", output=tmp_path / "a", input_range=(2.0, 3.0), progress=False).path
    x = reference_input(path)
    assert x.dtype.is_floating_point and float(x.min()) >= 2.0 and float(x.max()) < 3.0
    assert float(x.max()) - float(x.min()) > 0.5  # spread over the range, not one value
    decl = read_artifact(path).manifest.inputs[0]
    assert (decl.low, decl.high, decl.range_source) == (2.0, 3.0, "--input-range")


def test_a_float_range_too_wide_for_the_dtype_is_refused(tmp_path: Path) -> None:
    """Values past float16's largest would be drawn as infinities."""
    model = tmp_path / "half_in.py"
    model.write_text(textwrap.dedent("""
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(2, 2)

            def forward(self, x):
                return self.linear(x.float())

        def build_model():
            return Net()
    """))
    with pytest.raises(ShapeSpecError, match="does not fit float16 inputs"):
        build(model, "1x2", output=tmp_path / "a", dtype="float16", input_range=(0, 1e5))
    assert not (tmp_path / "a").exists()
    build(model, "1x2", output=tmp_path / "b", dtype="float16", input_range=(0, 6e4),
          progress=False)


def test_an_input_range_the_example_input_hook_would_ignore_is_refused(tmp_path: Path) -> None:
    """The hook makes every reference input: a range given with it was silently ignored."""
    model = tmp_path / "hooked.py"
    model.write_text(textwrap.dedent("""
        import torch

        def example_input(name, shape, dtype, generator):
            return torch.zeros(shape, dtype=dtype)

        def build_model():
            return torch.nn.Linear(2, 2)
    """))
    with pytest.raises(ShapeSpecError, match=r"--input-range has no effect: .*example_input"):
        build(model, "1x2", output=tmp_path / "a", input_range=(0, 1))
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(("seed", "says"), [(2**63, "outside"), (-1, "outside"),
                                            (1e23, "integer"), (True, "boolean")])
def test_a_seed_torch_cannot_take_is_refused_before_the_model_runs(tmp_path: Path, seed: object,
                                                                   says: str) -> None:
    """Audit: such seeds ended in torch as ValueError/RuntimeError, after the model ran."""
    with pytest.raises(ShapeSpecError, match=says):
        build(tmp_path / "not_even_read.py", "1x2", output=tmp_path / "a", seed=seed)


def test_the_largest_seed_builds(tmp_path: Path) -> None:
    build(MLP, "1x2,2x2", output=tmp_path / "a", seed=2**63 - 1, progress=False)


@pytest.mark.parametrize("shapes", ["2147483647x2147483647", "1x2147483647", [(2**31 - 1,) * 8]])
def test_shapes_beyond_the_reference_byte_limit_are_refused(tmp_path: Path, shapes: object) -> None:
    """Audit: ``2147483647x2147483647`` ended as an unexpected RuntimeError from torch."""
    with pytest.raises(ShapeSpecError, match=r"needs .* of reference inputs.*at most 1 GiB"):
        build(MLP, shapes, output=tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_the_byte_limit_counts_every_shape_and_input(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """All declared shapes together: 1x2 (8 bytes) fits 64, 8x2 (64 more) does not."""
    monkeypatch.setattr("qkan_pack.format._grammar.MAX_REFERENCE_BYTES", 64)
    with pytest.raises(ShapeSpecError, match=r"shape input 8x2 \(float32\) needs 64 B of "
                                             r"reference inputs after 8 B for the shapes before"):
        build(MLP, "1x2,8x2", output=tmp_path / "a")
    build(MLP, "1x2,7x2", output=tmp_path / "b", progress=False)


def test_python_api_shapes_beyond_the_format_limits_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ShapeSpecError, match="at most 8 positive integers up to 2147483647"):
        build(MLP, [(2**31, 1)], output=tmp_path / "a")
    with pytest.raises(ShapeSpecError, match="at most 8"):
        build(MLP, [(1,) * 9], output=tmp_path / "a")


def test_config_false_builds_the_model_it_says(tmp_path: Path) -> None:
    """Audit: ``--config bias=False`` passed the string "False" (truthy): a biased model."""
    model = tmp_path / "biased.py"
    model.write_text("import torch\n\n\ndef build_model(bias=True):\n"
                     "    return torch.nn.Linear(2, 2, bias=bias)\n")
    result = build(model, "1x2", output=tmp_path / "a", progress=False,
                   config=parse_config_items(["bias=False"]))
    assert result.manifest.model.config == {"bias": False}
    assert result.manifest.model.parameters == 4
