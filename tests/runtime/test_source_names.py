"""Verified model source is compiled and given to ``linecache`` under a content-addressed
``<qkan-pack sha256:...>`` name: no source of a load is ever read from disk, two artifacts
never share a name, the host's own pseudo-files (``<string>``) are never touched, and the
lines leave ``linecache`` when the last predictor using them closes.

Each model source carries its test's name in a comment, so that no other test of the
session holds the same lines.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import json
import linecache
import sys
import traceback
from pathlib import Path
from types import ModuleType

import pytest
import torch

from qkan_pack import Predictor, SelfTestError, build, read_artifact
from qkan_pack.runtime import content_name

from ..conftest import forget_imports

MODEL = '''\
# {tag}
MARKER = "a line of the artifact's source"
import torch


def shift(x: torch.Tensor) -> torch.Tensor:
    return x + {offset}


class Shift(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shift(x) * self.scale


def explode() -> None:
    raise ValueError("explode was called")


def build_model() -> torch.nn.Module:
    return Shift()
'''


def write_model(folder: Path, tag: str, offset: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.py"
    path.write_text(MODEL.format(tag=tag, offset=offset))
    return path


def build_one(folder: Path, tag: str, offset: float) -> Path:
    return build(write_model(folder, tag, offset), "2x2", output=folder / "artifact",
                 progress=False).path


def model_module(predictor: Predictor) -> ModuleType:
    info = predictor.manifest.model
    artifact = read_artifact(predictor.path)
    return sys.modules[content_name({p: artifact.files[p] for p in (info.source, *info.includes)})]


def plant_decoy(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``source/model.py`` in the working directory and on ``sys.path`` whose ``shift``
    adds 1000: any source read from disk shows in the result."""
    write_model(folder / "source", "decoy", 1000.0)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))


def test_two_artifacts_with_one_source_path_never_read_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit: both artifacts' code said ``source/model.py``; the name was dropped from
    linecache as ambiguous, and TorchScript then compiled ``source/model.py`` from the
    working directory (or ``sys.path``) into the first model."""
    first = build_one(tmp_path / "a", "two artifacts", 1.0)
    second = build_one(tmp_path / "b", "two artifacts", 2.0)
    for path in (first, second):
        forget_imports(path)  # as if both were built elsewhere
    plant_decoy(tmp_path / "decoy", monkeypatch)
    with Predictor.load(first) as one, Predictor.load(second) as two:
        x = torch.ones(2, 2)
        assert torch.equal(one(x), x + 1) and torch.equal(two(x), x + 2)
        module = model_module(one)
        assert torch.equal(torch.jit.script(module.shift)(x), x + 1)
        assert "x + 1.0" in inspect.getsource(module.shift)
        assert "shift(x) * self.scale" in inspect.getsource(module.Shift)  # by module __file__
        assert "x + 2.0" in inspect.getsource(model_module(two).shift)


def test_a_load_after_a_build_in_one_process_reads_no_edited_file(tmp_path: Path) -> None:
    """Audit: a load reused the module the build had imported from the user's file, so
    TorchScript (and tracebacks) read that file as it is now, edited since the build."""
    path = build_one(tmp_path / "a", "after a build", 1.0)
    write_model(tmp_path / "a", "after a build", 1000.0)  # same lines, another body
    with Predictor.load(path) as predictor:
        module = model_module(predictor)
        assert module.shift.__code__.co_filename.startswith("<qkan-pack sha256:")
        x = torch.ones(2, 2)
        assert torch.equal(torch.jit.script(module.shift)(x), x + 1)


def test_lines_stay_while_a_predictor_lives_and_leave_with_the_last(tmp_path: Path) -> None:
    """Audit: registered lines stayed in linecache for good. Two predictors of one artifact
    share them; the last close takes them out; a traceback shows the model's lines while
    one is open; ``linecache.checkcache`` keeps them (no mtime to compare)."""
    path = build_one(tmp_path / "a", "refcount", 1.0)
    source = read_artifact(path).files["source/model.py"]
    name = f"<qkan-pack sha256:{hashlib.sha256(source).hexdigest()}/source/model.py>"
    one = Predictor.load(path)
    two = Predictor.load(path)
    module = model_module(one)
    assert module.explode.__code__.co_filename == name == module.__file__
    linecache.checkcache()
    assert linecache.cache[name][2] == source.decode().splitlines(keepends=True)
    with pytest.raises(ValueError) as caught:
        module.explode()
    shown = "".join(traceback.format_exception(caught.value))
    assert 'raise ValueError("explode was called")' in shown
    assert "source/model.py" in str(caught.traceback[-1].path)
    one.close()
    assert name in linecache.cache  # the second still serves
    two.close()
    assert name not in linecache.cache
    with pytest.raises(OSError):
        inspect.getsource(module.shift)


def test_lines_of_a_predictor_dropped_without_close_leave_with_it(tmp_path: Path) -> None:
    path = build_one(tmp_path / "a", "dropped", 1.0)
    predictor = Predictor.load(path)
    name = model_module(predictor).shift.__code__.co_filename
    assert name in linecache.cache
    del predictor
    gc.collect()
    assert name not in linecache.cache


def test_a_failed_load_leaves_no_lines(tmp_path: Path) -> None:
    """A load refused at the self-test gives its lines back with everything else."""
    path = build_one(tmp_path / "a", "failed load", 1.0)
    artifact = read_artifact(path)
    name = f"<qkan-pack sha256:{hashlib.sha256(artifact.files['source/model.py']).hexdigest()}" \
           "/source/model.py>"
    double_the_weights(path)
    with pytest.raises(SelfTestError):
        Predictor.load(path)
    gc.collect()
    assert name not in linecache.cache


def double_the_weights(path: Path) -> None:
    """Weights that differ from the references' (the scale doubled, the digest re-signed)."""
    from safetensors.torch import load_file, save_file

    weights = path / "weights.safetensors"
    tensors = load_file(weights)
    tensors["scale"] = tensors["scale"] * 2
    save_file(tensors, weights)
    raw = json.loads((path / "manifest.json").read_text())
    data = weights.read_bytes()
    raw["files"]["weights.safetensors"] = {"size": len(data),
                                           "sha256": hashlib.sha256(data).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(raw, indent=2))


def test_an_artifact_source_named_string_leaves_the_hosts_exec_code_alone(tmp_path: Path) -> None:
    """Audit: an artifact whose source path is ``<string>`` put its lines in linecache under
    that name for good: every exec()'d function of the host then showed them in tracebacks
    and ``inspect.getsource``."""
    path = build_one(tmp_path / "a", "string", 1.0)
    forget_imports(path)
    (path / "source" / "model.py").rename(path / "<string>")
    (path / "source").rmdir()
    raw = json.loads((path / "manifest.json").read_text())
    raw["model"]["source"] = "<string>"
    raw["files"]["<string>"] = raw["files"].pop("source/model.py")
    (path / "manifest.json").write_text(json.dumps(raw, indent=2))

    def host_function() -> tuple[str, str | None]:
        namespace: dict = {}
        exec(compile("def g():\n    raise KeyError('g')\n", "<string>", "exec"), namespace)
        with pytest.raises(KeyError) as caught:
            namespace["g"]()
        try:
            source = inspect.getsource(namespace["g"])
        except OSError:
            source = None
        return "".join(traceback.format_exception(caught.value)), source

    with Predictor.load(path) as predictor:
        assert torch.equal(predictor(torch.ones(2, 2)), torch.full((2, 2), 2.0))
        shown, source = host_function()
        assert "a line of the artifact" not in shown and source is None
    shown, source = host_function()
    assert "a line of the artifact" not in shown and source is None
    assert "<string>" not in linecache.cache


def test_after_linecache_clearcache_no_source_is_read_from_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``linecache.clearcache`` drops every entry, ours too: source reads then find no
    lines (never the decoy on disk), and the next load of those sources puts them back."""
    path = build_one(tmp_path / "a", "clearcache", 1.0)
    plant_decoy(tmp_path / "decoy", monkeypatch)
    with Predictor.load(path) as predictor:
        module = model_module(predictor)
        linecache.clearcache()
        with pytest.raises(OSError):
            inspect.getsource(module.shift)
        with pytest.raises(OSError):
            torch.jit.script(module.shift)
        with Predictor.load(path):
            assert torch.equal(torch.jit.script(module.shift)(torch.ones(2)), torch.full((2,), 2.0))
        assert module.shift.__code__.co_filename in linecache.cache  # the first still serves


HELPER = '''\
# {tag}
import torch


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * {factor}
'''


def test_include_modules_are_compiled_under_their_own_content_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: an include was compiled as ``source/helper.py``, a name the working directory
    could answer for once dropped; a decoy ``source/helper.py`` there is never read."""
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "helper.py").write_text(HELPER.format(tag="include", factor=2.0))
    (folder / "model.py").write_text("import torch\nfrom helper import Doubler\n\n\n"
                                     "def build_model():\n    return Doubler()\n")
    path = build(folder / "model.py", "2x2", output=folder / "artifact", includes=["helper.py"],
                 progress=False).path
    forget_imports(path)
    decoy = tmp_path / "decoy"
    (decoy / "source").mkdir(parents=True)
    (decoy / "source" / "helper.py").write_text(HELPER.format(tag="decoy", factor=1000.0))
    monkeypatch.chdir(decoy)
    monkeypatch.syspath_prepend(str(decoy))
    with Predictor.load(path) as predictor:
        helper = sys.modules[model_module(predictor).__name__ + ".helper"]
        name = helper.__file__
        assert name.startswith("<qkan-pack sha256:") and name.endswith("/source/helper.py>")
        assert "x * 2.0" in inspect.getsource(helper.Doubler.forward)
        scripted = torch.jit.script(helper.Doubler())
        assert torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))
    assert name not in linecache.cache
