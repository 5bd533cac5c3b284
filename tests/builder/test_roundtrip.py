"""Build -> Predictor.load(device="cpu") output parity with eager PyTorch, on fresh inputs.

Every comparison builds the eager model independently (importing the model file itself),
feeds inputs the build never saw, and requires the same numbers the artifact returns.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import pickle
import shutil
import struct
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import qkan_pack
from qkan_pack import (
    ModelSourceError,
    Predictor,
    ShapeSpecError,
    WeightsMismatchError,
    build,
    read_artifact,
)

from ..conftest import EXAMPLES, MODELS, ROOT, forget_imports

TIGHT = {"rtol": 1e-5, "atol": 1e-6}
_loaded: dict[Path, ModuleType] = {}


def model_module(path: Path) -> ModuleType:
    """Import a model file directly (not through qkan-pack) for an independent eager model."""
    if path not in _loaded:
        spec = importlib.util.spec_from_file_location(f"eager_{path.stem}_{len(_loaded)}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import does (dataclasses look it up)
        spec.loader.exec_module(module)
        _loaded[path] = module
    return _loaded[path]


def eager(path: Path, state: dict[str, torch.Tensor] | None = None, **config: Any) -> torch.nn.Module:
    model = model_module(path).build_model(**config)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def fresh(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 + seed))


def header_keys(data: bytes) -> list[str]:
    (length,) = struct.unpack("<Q", data[:8])
    return sorted(k for k in json.loads(data[8:8 + length]) if k != "__metadata__")


# ---------------------------------------------------------------------------
# The two examples
# ---------------------------------------------------------------------------


def test_qkan_mlp_parity_on_fresh_inputs(mlp_artifact: Path) -> None:
    reference = eager(EXAMPLES / "qkan_mlp.py")
    with Predictor.load(mlp_artifact, device="cpu") as predictor:
        assert predictor.report.device == "cpu"
        for seed, shape in enumerate([(1, 2), (64, 2), (1, 2)]):
            x = fresh(shape, seed)
            got = predictor(x)
            with torch.no_grad():
                want = reference(x)
            assert got.shape == want.shape == (shape[0], 2)
            torch.testing.assert_close(got, want, **TIGHT)
        assert predictor.report.shapes[0].reference_max_abs <= 1e-5


def test_hqkan_gpt_parity_and_tied_head(gpt_artifact: Path) -> None:
    config = {"block_size": 16, "n_embd": 32, "hidden": 16}
    reference = eager(EXAMPLES / "hqkan_gpt.py", **config)
    artifact = read_artifact(gpt_artifact)
    assert artifact.manifest.model.tied == (("lm_head.weight", "tok_emb.weight"),)
    assert dict(artifact.manifest.model.config) == config
    stored = header_keys(artifact.files["weights.safetensors"])
    assert len([k for k in stored if k in ("lm_head.weight", "tok_emb.weight")]) == 1
    assert len(stored) == len(reference.state_dict()) - 1  # the tied tensor is stored once
    with Predictor.load(gpt_artifact) as predictor:
        model = predictor._model
        assert model.lm_head.weight is model.tok_emb.weight  # re-tied, not two copies
        for seed, batch in enumerate([1, 4]):
            idx = torch.randint(0, 256, (batch, 16), generator=torch.Generator().manual_seed(seed))
            got = predictor(idx)
            with torch.no_grad():
                want = reference(idx)
            assert got.shape == (batch, 16, 256) and got.dtype == torch.float32
            torch.testing.assert_close(got, want, **TIGHT)
        with pytest.raises(qkan_pack.InputError, match="int64"):
            predictor(torch.zeros(1, 16))


# ---------------------------------------------------------------------------
# qkan's own classes, with trained-looking state from --weights
# ---------------------------------------------------------------------------

QKAN_CONFIG = {"kind": "qkan", "is_batchnorm": True, "postact_bias_trainable": True}


def trained_qkan_state() -> dict[str, torch.Tensor]:
    """Pruned mask, nonzero postact bias, non-default batch-norm statistics and weights."""
    g = torch.Generator().manual_seed(7)
    state = {k: v.clone() for k, v in eager(MODELS / "qkan_classes.py", **QKAN_CONFIG).state_dict().items()}
    for name, tensor in state.items():
        if name.endswith(".mask"):
            tensor.view(-1)[::2] = 0.0  # prune every other edge
        elif name.endswith("postact_bias"):
            tensor.copy_(torch.randn(tensor.shape, generator=g) * 0.5)
        elif name.endswith("running_mean"):
            tensor.copy_(torch.randn(tensor.shape, generator=g))
        elif name.endswith("running_var"):
            tensor.copy_(torch.rand(tensor.shape, generator=g) * 2 + 0.25)
        elif name.endswith("num_batches_tracked"):
            tensor.fill_(123)
        elif tensor.is_floating_point():
            tensor.add_(torch.randn(tensor.shape, generator=g) * 0.2)
    return state


@pytest.fixture(scope="module")
def qkan_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    state = trained_qkan_state()
    root = tmp_path_factory.mktemp("weights")
    paths = {"safetensors": root / "trained.safetensors", "pt": root / "trained.pt",
             "pt-wrapped": root / "wrapped.pt"}
    save_file(state, paths["safetensors"])
    torch.save(state, paths["pt"])
    torch.save({"state_dict": state, "epoch": 3}, paths["pt-wrapped"])
    return paths


def test_trained_state_matters() -> None:
    """Guard for the parity test below: each piece of the trained state changes the output."""
    x = fresh((16, 2), 3)
    state = trained_qkan_state()
    with torch.no_grad():
        full = eager(MODELS / "qkan_classes.py", state, **QKAN_CONFIG)(x)
        for piece in ("mask", "postact_bias", "running_mean", "running_var"):
            undone = dict(state)
            default = eager(MODELS / "qkan_classes.py", **QKAN_CONFIG).state_dict()
            for name in state:
                if name.endswith(piece):
                    undone[name] = default[name]
            other = eager(MODELS / "qkan_classes.py", undone, **QKAN_CONFIG)(x)
            assert (other - full).abs().max() > 1e-3, piece


@pytest.mark.parametrize("kind", ["safetensors", "pt", "pt-wrapped"])
def test_qkan_trained_state_round_trip(tmp_path: Path, qkan_weights: dict[str, Path],
                                       kind: str) -> None:
    result = build(MODELS / "qkan_classes.py", "1x2,16x2", output=tmp_path / "qkan",
                   config=QKAN_CONFIG, weights=qkan_weights[kind])
    reference = eager(MODELS / "qkan_classes.py", trained_qkan_state(), **QKAN_CONFIG)
    with Predictor.load(result.path) as predictor:
        state = predictor._model.state_dict()
        for name, tensor in trained_qkan_state().items():
            assert torch.equal(state[name], tensor), name
        for seed, batch in enumerate([1, 16, 16]):
            x = fresh((batch, 2), seed)
            with torch.no_grad():
                torch.testing.assert_close(predictor(x), reference(x), **TIGHT)


@pytest.mark.parametrize("kind", ["kan", "fourier"])
def test_kan_classes_round_trip(tmp_path: Path, kind: str) -> None:
    base = eager(MODELS / "qkan_classes.py", kind=kind)
    g = torch.Generator().manual_seed(11)
    state = {k: v + 0.1 * torch.randn(v.shape, generator=g) if v.requires_grad else v.clone()
             for k, v in base.state_dict(keep_vars=True).items()}
    state = {k: v.detach() for k, v in state.items()}
    weights = tmp_path / "w.safetensors"
    save_file(state, weights)
    result = build(MODELS / "qkan_classes.py", "1x2,8x2", output=tmp_path / kind,
                   config={"kind": kind}, weights=weights)
    reference = eager(MODELS / "qkan_classes.py", state, kind=kind)
    with Predictor.load(result.path) as predictor:
        for seed, batch in enumerate([1, 8]):
            x = fresh((batch, 2), seed).clamp(-0.99, 0.99)
            with torch.no_grad():
                want = reference(x)
                assert (want - base(x)).abs().max() > 1e-4  # the weights really changed it
            torch.testing.assert_close(predictor(x), want, **TIGHT)


# ---------------------------------------------------------------------------
# Several inputs, structured outputs, includes (Python API)
# ---------------------------------------------------------------------------


def test_multi_input_structured_outputs(tmp_path: Path) -> None:
    shapes = [{"a": (2, 3), "b": (2, 4)}, {"a": (5, 3), "b": (5, 4)}]
    result = build(MODELS / "multi_io.py", shapes, output=tmp_path / "multi", dtype={"b": "int64"})
    manifest = result.manifest
    assert [(d.name, d.dtype) for d in manifest.inputs] == [("a", "float32"), ("b", "int64")]
    assert manifest.shapes[1].inputs == (("a", (5, 3)), ("b", (5, 4)))
    assert manifest.shapes[0].outputs.label == (
        "{y: 2x3 float32, parts: (2 float32, [2x3 float32, 2x4 int64])}")
    reference = eager(MODELS / "multi_io.py")
    with Predictor.load(result.path) as predictor:
        for seed, batch in enumerate([2, 5]):
            g = torch.Generator().manual_seed(seed)
            a, b = torch.randn(batch, 3, generator=g), torch.randint(0, 8, (batch, 4), generator=g)
            with torch.no_grad():
                want = reference(a, b)
            for got in (predictor(a, b), predictor(b=b, a=a), predictor(a, b=b)):
                assert isinstance(got, dict) and list(got) == ["y", "parts"]
                assert isinstance(got["parts"], tuple) and isinstance(got["parts"][1], list)
                torch.testing.assert_close(got, want, **TIGHT)
            assert got["parts"][1][1].dtype == torch.int64
        with pytest.raises(qkan_pack.InputError, match="a: 2x3 float32, b: 2x4 int64"):
            predictor(torch.randn(2, 3), torch.randn(2, 4))


def test_single_input_shapes_as_python_lists(tmp_path: Path) -> None:
    result = build(EXAMPLES / "qkan_mlp.py", [(1, 2), [3, 2]], output=tmp_path / "m")
    assert [e.inputs for e in result.manifest.shapes] == [(("x", (1, 2)),), (("x", (3, 2)),)]


@pytest.mark.parametrize(("shapes", "dtype", "says"), [
    ([{"a": (2, 3), "b": (2, 4)}, {"b": (5, 4), "a": (5, 3)}], "float32", "same order"),
    ([{"a": (2, 3), "b": (2, 4)}], {"c": "int64"}, "unknown inputs"),
    ([{"a": (2, 0), "b": (2, 4)}], "float32", "positive"),
    ([{"a": (2, 3), "b": (2, 4)}, {"a": (2, 3), "b": (2, 4)}], "float32", "twice"),
    ([], "float32", "at least one"),
    ([{"a": (2, 3), "b": (2, 4)}], {"b": "int65"}, "unknown dtype"),
])
def test_python_api_shape_errors(tmp_path: Path, shapes: Any, dtype: Any, says: str) -> None:
    with pytest.raises(ShapeSpecError, match=says):
        build(MODELS / "multi_io.py", shapes, output=tmp_path / "x", dtype=dtype)
    assert not (tmp_path / "x").exists()


def test_include_helper_is_served_from_the_artifact(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("with_include.py", "tiny_helper.py"):
        shutil.copy(MODELS / name, src / name)
    with pytest.raises(ModelSourceError, match=r"with_include\.py.*tiny_helper"):
        build(src / "with_include.py", "1x2,3x2", output=tmp_path / "no_include")
    result = build(src / "with_include.py", "1x2,3x2", output=tmp_path / "art",
                   includes=["tiny_helper.py"])
    assert result.manifest.model.includes == ("source/tiny_helper.py",)
    shutil.rmtree(src)  # the artifact alone must be enough
    forget_imports(result.path)
    with Predictor.load(result.path) as predictor:
        x = fresh((3, 2), 0)
        torch.manual_seed(0)
        linear = torch.nn.Linear(2, 2)
        with torch.no_grad():
            torch.testing.assert_close(predictor(x), torch.tanh(linear(x)) * 3.0, **TIGHT)
    assert "tiny_helper" not in sys.modules  # re-homed under the model's own name


@pytest.mark.parametrize("how", ["imported", "on sys.path", "__main__"])
def test_an_include_may_not_stand_in_for_another_module_of_the_host(tmp_path: Path,
                                                                    how: str) -> None:
    """Round 2, finding 9 (audit): the host's own ``tiny_helper`` (a different module, imported
    or importable from sys.path) was set aside while the model imported, so that any other
    thread importing it in that window got the artifact's include instead; ``__main__.py``
    as an include replaced the running program's module. Both are refused before any code
    runs; a module holding the include's very bytes is no conflict."""
    result = build(MODELS / "with_include.py", "1x2", output=tmp_path / "art",
                   includes=[MODELS / "tiny_helper.py"])
    forget_imports(result.path)
    host = tmp_path / "host"
    host.mkdir()
    (host / "tiny_helper.py").write_text("HOST = True\n")
    if how == "__main__":
        rename_include(result.path, "tiny_helper.py", "__main__.py")
        with pytest.raises(ModelSourceError, match=r"imported as '__main__'.*running program"):
            Predictor.load(result.path)
        return
    sys.path.insert(0, str(host))
    try:
        if how == "imported":
            importlib.import_module("tiny_helper")
        with pytest.raises(ModelSourceError, match=r"imported as 'tiny_helper'.*another module "
                                                   r"of this process \(.*host/tiny_helper\.py\)"):
            Predictor.load(result.path)
        (host / "tiny_helper.py").write_bytes((MODELS / "tiny_helper.py").read_bytes())
        sys.modules.pop("tiny_helper", None)
        with Predictor.load(result.path) as predictor:  # the same bytes: no conflict
            predictor(torch.zeros(1, 2))
    finally:
        sys.path.remove(str(host))
        sys.modules.pop("tiny_helper", None)


def test_include_outside_the_model_directory_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "helper.py").write_text("X = 1\n")
    with pytest.raises(ModelSourceError, match="outside"):
        build(MODELS / "with_include.py", "1x2", output=tmp_path / "a",
              includes=[tmp_path / "elsewhere" / "helper.py"])
    with pytest.raises(ModelSourceError, match=r"not a \.py file"):
        build(MODELS / "with_include.py", "1x2", output=tmp_path / "a", includes=["absent.py"])


# ---------------------------------------------------------------------------
# Strict weights
# ---------------------------------------------------------------------------

STRICT_MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 3)
            self.register_buffer("scale", torch.ones(3))

        def forward(self, x):
            return self.linear(x) * self.scale

    def build_model():
        torch.manual_seed(0)
        return Net()
''')


@pytest.fixture
def strict_model(tmp_path: Path) -> Path:
    path = tmp_path / "strict_model.py"
    path.write_text(STRICT_MODEL)
    return path


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_every_weight_mismatch_is_listed(tmp_path: Path, strict_model: Path, fmt: str) -> None:
    state = {
        "linear.weight": torch.zeros(3, 3),           # mis-shaped
        "scale": torch.ones(3, dtype=torch.float64),  # mis-typed (never silently cast)
        "extra.weight": torch.zeros(1),               # unexpected
    }                                                 # linear.bias missing
    weights = tmp_path / f"w.{fmt}"
    save_file(state, weights) if fmt == "safetensors" else torch.save(state, weights)
    with pytest.raises(WeightsMismatchError) as info:
        build(strict_model, "1x2", output=tmp_path / "a", weights=weights)
    message = str(info.value)
    assert str(weights) in message
    assert "missing: linear.bias" in message
    assert "unexpected: extra.weight" in message
    assert "shape of linear.weight: model has (3, 2), weights have (3, 3)" in message
    assert "dtype of scale: model has torch.float32, weights have torch.float64" in message
    assert not (tmp_path / "a").exists()


def test_fitting_weights_are_used(tmp_path: Path, strict_model: Path) -> None:
    state = {"linear.weight": torch.full((3, 2), 0.5), "linear.bias": torch.tensor([1., 2., 3.]),
             "scale": torch.tensor([1., -1., 2.])}
    weights = tmp_path / "w.safetensors"
    save_file(state, weights)
    result = build(strict_model, "1x2", output=tmp_path / "a", weights=weights)
    with Predictor.load(result.path) as predictor:
        x = torch.tensor([[1.0, 3.0]])
        torch.testing.assert_close(predictor(x), torch.tensor([[3.0, -4.0, 10.0]]))


class _Boom:
    def __reduce__(self) -> tuple:
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['BOOM']).touch()",))


def test_pickle_payload_in_weights_is_never_run(tmp_path: Path, strict_model: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    boom = tmp_path / "boom"
    monkeypatch.setenv("BOOM", str(boom))
    weights = tmp_path / "evil.pt"
    weights.write_bytes(pickle.dumps({"linear.weight": _Boom()}, protocol=2))
    with pytest.raises(WeightsMismatchError, match=r"pickled Python objects.*never unpickles"):
        build(strict_model, "1x2", output=tmp_path / "a", weights=weights)
    assert not boom.exists()


@pytest.mark.parametrize("payload", [[torch.zeros(1)], {"a": 1}, {1: torch.zeros(1)}, "text"])
def test_non_state_dict_checkpoints_refused(tmp_path: Path, strict_model: Path, payload: Any) -> None:
    weights = tmp_path / "odd.pt"
    torch.save(payload, weights)
    with pytest.raises(WeightsMismatchError, match="not a state dict"):
        build(strict_model, "1x2", output=tmp_path / "a", weights=weights)


def test_corrupt_weights_files_refused(tmp_path: Path, strict_model: Path) -> None:
    for name, data in {"bad.safetensors": b"\x00" * 4, "bad.pt": b"not a zip"}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(qkan_pack.QkanPackError):
            build(strict_model, "1x2", output=tmp_path / "a", weights=tmp_path / name)


def test_tied_weights_that_disagree_refused(tmp_path: Path, gpt_artifact: Path) -> None:
    config = {"block_size": 16, "n_embd": 32, "hidden": 16}
    state = {k: v.clone() for k, v in eager(EXAMPLES / "hqkan_gpt.py", **config).state_dict().items()}
    state["lm_head.weight"] += 1.0
    weights = tmp_path / "untied.safetensors"
    save_file(state, weights)
    with pytest.raises(WeightsMismatchError, match="tied"):
        build(EXAMPLES / "hqkan_gpt.py", "1x16", dtype="int64", config=config,
              output=tmp_path / "a", weights=weights)


WITHOUT_QKAN = """
import sys
sys.modules["qkan"] = None  # `import qkan` now fails: as on a host without the [qkan] extra
import torch
from qkan_pack import Predictor, build
path = build(sys.argv[1], "1x2,4x2", output=sys.argv[2]).path
with Predictor.load(path) as predictor:
    x = torch.randn(4, 2)
    print(float((predictor(x) - predictor._model(x)).abs().max()))
"""


def test_plain_torch_models_need_no_qkan(tmp_path: Path) -> None:
    """qkan is an optional extra: a plain torch model builds and loads without it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WITHOUT_QKAN, str(MODELS / "plain_mlp.py"),
                           str(tmp_path / "plain")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) == 0.0


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("config", "says"), [
    ({"width": _deep(100_000)}, "JSON values"),  # was a RecursionError out of json.dumps
    ({"width": _deep(70)}, "deeper than 64"),  # the manifest could never be read back
    ({"scale": float("nan")}, "JSON values"),  # the manifest would hold NaN: unreadable
    ({"fn": print}, "JSON values"),
    ({"not valid": 1}, "identifier"),
])
def test_build_refuses_a_config_the_manifest_cannot_hold(tmp_path: Path, config: dict,
                                                         says: str) -> None:
    """Round 2, finding 9: every config is checked before the model file is imported."""
    with pytest.raises(ShapeSpecError, match=says):
        build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "x", config=config)
    assert not (tmp_path / "x").exists()


def test_build_refuses_an_input_range_without_integers(tmp_path: Path) -> None:
    with pytest.raises(ShapeSpecError, match="holds no integer"):
        build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "x", dtype="int64",
              input_range=(0.2, 0.8))


SHADOWING_MODEL = textwrap.dedent("""
    import json
    import torch

    def build_model():
        assert getattr(json, "FAKE", False) is False, "the include replaced the stdlib json"
        return torch.nn.Linear(2, 2)
""")


@pytest.mark.parametrize(("include", "owner"), [
    ("json.py", "standard-library module"),
    ("os.py", "standard-library module"),
    ("numpy.py", "installed package"),
    ("safetensors/__init__.py", "installed package"),
    ("qkan_pack.py", "qkan-pack's own package"),
])
def test_includes_may_not_shadow_host_modules(tmp_path: Path, include: str, owner: str) -> None:
    """Round 2, finding 9: `--include json.py` answered `import json` for the whole process
    while the model imported (the model, first-time imports of libraries, other threads)."""
    src = tmp_path / "src"
    (src / include).parent.mkdir(parents=True, exist_ok=True)
    (src / "model.py").write_text(SHADOWING_MODEL)
    (src / include).write_text("FAKE = True\n")
    top = include.split("/")[0] if "/" in include else include
    with pytest.raises(ModelSourceError, match=rf"would be imported as '{top.removesuffix('.py')}'"
                                               rf".*{owner}"):
        build(src / "model.py", "1x2", output=tmp_path / "art", includes=[src / top])
    assert sys.modules["json"].__name__ == "json" and not hasattr(sys.modules["json"], "FAKE")


def rename_include(artifact: Path, old: str, new: str) -> None:
    """Rename an include inside an artifact and re-sign its manifest entry (an edited
    artifact, or one from an older qkan-pack), as a hostile or careless packager could."""
    import hashlib

    raw = json.loads((artifact / "manifest.json").read_text())
    (artifact / "source" / old).rename(artifact / "source" / new)
    data = (artifact / "source" / new).read_bytes()
    raw["files"].pop(f"source/{old}")
    raw["files"][f"source/{new}"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    raw["model"]["includes"] = [f"source/{new}"]
    (artifact / "manifest.json").write_text(json.dumps(raw))


def test_a_shadowing_include_in_an_artifact_is_refused_before_it_runs(tmp_path: Path) -> None:
    """The same check at load (an artifact edited, or built by an older qkan-pack)."""
    art = build(MODELS / "with_include.py", "1x2", output=tmp_path / "art",
                includes=[MODELS / "tiny_helper.py"]).path
    rename_include(art, "tiny_helper.py", "json.py")
    for name in [n for n in sys.modules if n.startswith("qkan_pack_model_")]:
        del sys.modules[name]
    with pytest.raises(ModelSourceError, match="would be imported as 'json'"):
        Predictor.load(art)


DATACLASS_MODEL = '''{future}
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch
from torch import Tensor


@dataclass
class Out:
    y: Tensor
    extra: Optional[Tensor] = None
    scaled: Tensor = field(init=False)  # not a constructor argument: set below

    def __post_init__(self) -> None:
        self.scaled = self.y * 3


class Pair(NamedTuple):
    first: Tensor
    second: Tensor


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)

    def forward(self, x: Tensor) -> Out:
        y = self.lin(x)
        return Out(y=y, extra=Pair(y * 2, y + 1))


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Net()
'''


@pytest.mark.parametrize("future", ["", "from __future__ import annotations"])
def test_dataclass_and_namedtuple_outputs_defined_in_the_model_file(tmp_path: Path,
                                                                    future: str) -> None:
    """Before: the model source was compiled with qkan-pack's own ``__future__`` flags and
    outside ``sys.modules``, so ``y: Tensor`` in a dataclass failed to import ('NoneType'
    object has no attribute '__dict__'), with or without the user's own future import. And
    (audit) a field with ``init=False`` made every call fail: the class was rebuilt with it
    as a constructor argument."""
    source = tmp_path / "dc_model.py"
    source.write_text(DATACLASS_MODEL.format(future=future))
    artifact = build(source, "1x2,4x2", output=tmp_path / "a").path
    x = fresh((4, 2), 7)
    with Predictor.load(artifact, "cpu", progress=False) as predictor:
        out = predictor(x)
    assert type(out).__name__ == "Out" and type(out.extra).__name__ == "Pair"
    with torch.no_grad():
        want = eager(source)(x)
    torch.testing.assert_close(out.y, want.y, **TIGHT)
    torch.testing.assert_close(out.extra.second, want.extra.second, **TIGHT)
    torch.testing.assert_close(out.scaled, want.scaled, **TIGHT)  # an init=False field


def _point_output_class(artifact: Path, key: str, module: str, qualname: str) -> None:
    """Edit the manifest (no digest pin: it loads) so output ``key`` names another class."""
    raw = json.loads((artifact / "manifest.json").read_text())
    for shape in raw["shapes"]:
        shape["outputs"]["dict"][key]["class"].update(module=module, qualname=qualname)
    (artifact / "manifest.json").write_text(json.dumps(raw))


@pytest.mark.parametrize(("module", "qualname"), [
    ("host_app_outputs", "Pair"),  # a module of the host application
    ("torch.nn.utils.rnn", "PackedSequence"),  # torch's, but nothing of this model names it
])
def test_output_classes_come_only_from_what_the_model_source_refers_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, qualname: str) -> None:
    """Before: a recorded class was taken from any module loaded in the process, so an edited
    manifest could have the predictor instantiate a host application's class with the
    model's outputs; a first fix by top-level package still let any class of torch in (the
    audit named PackedSequence). Now a class must be defined or held by name by a module
    the verified source or its model's submodule classes refer to."""
    host = ModuleType("host_app_outputs")
    host.Pair = collections.namedtuple("Pair", ["first", "second"], module="host_app_outputs")
    monkeypatch.setitem(sys.modules, "host_app_outputs", host)
    source = tmp_path / "dc_model.py"
    source.write_text(DATACLASS_MODEL.format(future=""))
    artifact = build(source, "1x2", output=tmp_path / "a").path
    _point_output_class(artifact, "extra", module, qualname)
    with pytest.warns(UserWarning, match=rf"{module}\.{qualname} is neither defined nor imported"):
        predictor = Predictor.load(artifact, "cpu", progress=False)
    with predictor:
        out = predictor(fresh((1, 2), 3))
    assert type(out).__name__ == "Out" and type(out.extra) is tuple


def test_build_says_when_an_output_class_will_not_be_looked_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward returning a class from a package its source never refers to: the build
    says so (and the load returns a plain tuple) instead of leaving it to the load."""
    host = ModuleType("host_app_outputs")
    host.Pair = collections.namedtuple("Pair", ["first", "second"], module="host_app_outputs")
    monkeypatch.setitem(sys.modules, "host_app_outputs", host)
    source = tmp_path / "hidden.py"
    source.write_text(textwrap.dedent("""
        import sys
        import torch

        class Net(torch.nn.Module):
            def forward(self, x):
                return sys.modules["host_app_outputs"].Pair(x + 1, x * 2)

        def build_model():
            return Net()
    """))
    with pytest.warns(UserWarning, match=r"host_app_outputs\.Pair is neither defined nor imported"):
        result = build(source, "1x2", output=tmp_path / "a")
    assert any("host_app_outputs.Pair" in note for note in result.notes)
    with pytest.warns(UserWarning, match="host_app_outputs"), \
            Predictor.load(result.path, "cpu", progress=False) as predictor:
        out = predictor(fresh((1, 2), 5))
    assert type(out) is tuple
    torch.testing.assert_close(out[1], fresh((1, 2), 5) * 2, **TIGHT)


def _build_with_include(tmp_path: Path, include: str, include_source: str,
                        model_source: str) -> Path:
    """Build ``model.py`` (``model_source``) with one include file beside it."""
    (tmp_path / include).write_text(textwrap.dedent(include_source))
    (tmp_path / "model.py").write_text(textwrap.dedent(model_source))
    return build(tmp_path / "model.py", "1x2", output=tmp_path / "a",
                 includes=[tmp_path / include]).path


def test_an_output_class_from_an_include_comes_back_as_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the class was looked up under its plain module name (``out_types``), but an
    include lives under the model's own module once imported, so the output came back as a
    plain dict; a host module of that name imported after the load would have been used."""
    artifact = _build_with_include(tmp_path, "out_types.py", """
        from dataclasses import dataclass
        import torch

        @dataclass
        class Out:
            y: torch.Tensor
    """, """
        import torch
        from out_types import Out

        class Net(torch.nn.Module):
            def forward(self, x):
                return Out(y=x * 3)

        def build_model():
            return Net()
    """)
    with Predictor.load(artifact, "cpu", progress=False) as predictor:
        out = predictor(fresh((1, 2), 6))
        assert type(out).__name__ == "Out" and dataclasses.is_dataclass(out)
        torch.testing.assert_close(out.y, fresh((1, 2), 6) * 3, **TIGHT)
        host = ModuleType("out_types")  # the host imports its own out_types afterwards
        host.Out = dataclasses.make_dataclass("Out", ["y"])
        host.Out.__module__ = "out_types"
        monkeypatch.setitem(sys.modules, "out_types", host)
    with Predictor.load(artifact, "cpu", progress=False) as again:
        assert type(again(fresh((1, 2), 7))) is type(out)


def test_a_class_a_library_module_holds_comes_back_as_itself(tmp_path: Path) -> None:
    """Audit: torchvision's segmentation models return ``collections.OrderedDict`` that their
    own module imports while the model file never names ``collections``; the top-level
    package rule returned a plain dict. A class held by a module of the model's submodule
    classes counts."""
    artifact = _build_with_include(tmp_path, "seglib.py", """
        from collections import OrderedDict
        import torch

        class Seg(torch.nn.Module):
            def forward(self, x):
                return OrderedDict(out=x * 2, aux=x + 1)
    """, """
        from seglib import Seg

        def build_model():
            return Seg()
    """)
    with Predictor.load(artifact, "cpu", progress=False) as predictor:
        out = predictor(fresh((1, 2), 8))
    assert type(out) is collections.OrderedDict and list(out) == ["out", "aux"]
    torch.testing.assert_close(out["aux"], fresh((1, 2), 8) + 1, **TIGHT)


def test_build_and_load_agree_on_a_class_a_forward_reaches_through_a_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit: a forward building ``hostpkg.outs.Result`` with only ``import hostpkg`` at the
    top gave no build note but a plain dict at load (build looked classes up after its
    forwards, load before its first). Both now look after a forward and agree."""
    package = ModuleType("hostpkg")
    outs = ModuleType("hostpkg.outs")
    outs.Result = collections.namedtuple("Result", ["a", "b"], module="hostpkg.outs")
    package.outs = outs
    monkeypatch.setitem(sys.modules, "hostpkg", package)
    monkeypatch.setitem(sys.modules, "hostpkg.outs", outs)
    source = tmp_path / "reach.py"
    source.write_text(textwrap.dedent("""
        import hostpkg
        import torch

        class Net(torch.nn.Module):
            def forward(self, x):
                return hostpkg.outs.Result(x + 1, x * 2)

        def build_model():
            return Net()
    """))
    with pytest.warns(UserWarning, match=r"hostpkg\.outs\.Result is neither defined"):
        result = build(source, "1x2", output=tmp_path / "a")
    assert any("hostpkg.outs.Result" in note for note in result.notes)
    with pytest.warns(UserWarning, match=r"hostpkg\.outs\.Result"), \
            Predictor.load(result.path, "cpu", progress=False) as predictor:
        assert type(predictor(fresh((1, 2), 9))) is tuple


def test_looking_up_an_output_class_runs_no_module_getattr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the lookup used getattr, so a lazy package the model imports (transformers is
    one) imported whatever submodule the manifest's class name asked for."""
    asked: list[str] = []
    lazy = ModuleType("lazy_host_pkg")

    def module_getattr(name: str) -> Any:
        asked.append(name)
        raise AttributeError(name)

    lazy.__getattr__ = module_getattr  # type: ignore[attr-defined]  # PEP 562
    monkeypatch.setitem(sys.modules, "lazy_host_pkg", lazy)
    source = tmp_path / "lazy_model.py"
    source.write_text(DATACLASS_MODEL.format(future="") + "\nimport lazy_host_pkg  # noqa\n")
    artifact = build(source, "1x2", output=tmp_path / "a").path
    _point_output_class(artifact, "extra", "lazy_host_pkg", "Missing")
    with pytest.warns(UserWarning, match=r"lazy_host_pkg\.Missing is neither defined"):
        predictor = Predictor.load(artifact, "cpu", progress=False)
    with predictor:
        assert type(predictor(fresh((1, 2), 4)).extra) is tuple
    assert asked == []


@pytest.mark.parametrize(("where", "raises"), [
    ("import", "KeyboardInterrupt"), ("factory", "KeyboardInterrupt"),
    ("import", "SystemExit(3)"), ("factory", "SystemExit(3)"),
])
def test_ctrl_c_in_model_code_stays_ctrl_c_and_exit_is_a_model_error(tmp_path: Path, where: str,
                                                                     raises: str) -> None:
    """Round 2, finding 4 (audit): import and factory wrapped every BaseException, so Ctrl-C
    during a slow model import became 'failed (factory): KeyboardInterrupt', exit 1 instead
    of 130. A model calling sys.exit stays a model-code failure naming its stage."""
    body = f"raise {raises}\n"
    source = tmp_path / "m.py"
    source.write_text("import torch\n" + (body if where == "import" else "")
                      + "def build_model():\n" + (f"    {body}" if where == "factory" else "")
                      + "    return torch.nn.Linear(2, 2)\n")
    if raises == "KeyboardInterrupt":
        with pytest.raises(KeyboardInterrupt):
            build(source, "1x2", output=tmp_path / "a")
    else:
        with pytest.raises(ModelSourceError) as caught:
            build(source, "1x2", output=tmp_path / "a")
        assert caught.value.stage == where and isinstance(caught.value.__cause__, SystemExit)
    assert not (tmp_path / "a").exists()


WITHOUT_QKAN_METADATA = """
import sys, warnings
sys.modules["qkan"] = None
import qkan_pack.runtime._compat as compat
real = compat.installed_version
compat.installed_version = lambda name: None if name == "qkan" else real(name)
from qkan_pack import Predictor, build
digest = build(sys.argv[1], "1x2,4x2", output=sys.argv[2]).digest
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    Predictor.load(sys.argv[3]).close()
print(digest)
print([str(w.message) for w in seen if "qkan" in str(w.message)])
"""


def test_a_plain_model_records_no_qkan_and_its_digest_does_not_depend_on_it(tmp_path: Path) -> None:
    """Audit of issue 15: every build recorded the host's qkan version, so the same plain
    torch model got another digest on a host without qkan, whose load then warned 'artifact
    built with qkan 0.2.3, which is not installed here'. A QKAN model still records it."""
    import subprocess

    here = build(MODELS / "plain_mlp.py", "1x2,4x2", output=tmp_path / "here")
    assert "qkan" not in here.manifest.producer
    assert "qkan" in build(EXAMPLES / "qkan_mlp.py", "1x2", output=tmp_path / "q").manifest.producer
    done = subprocess.run([sys.executable, "-c", WITHOUT_QKAN_METADATA, str(MODELS / "plain_mlp.py"),
                           str(tmp_path / "there"), str(here.path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    digest, warned = done.stdout.strip().splitlines()[-2:]
    assert digest == here.digest and warned == "[]"


def test_an_artifact_built_into_an_included_package_is_not_packed_as_its_source(tmp_path: Path
                                                                              ) -> None:
    """Audit of issue 16: `-o mypkg/art` with `--include mypkg/`, then the same build again,
    packed the first artifact's files as the model's sources (source/mypkg/art/source/...)."""
    src = tmp_path / "src"
    (src / "mypkg").mkdir(parents=True)
    (src / "mypkg" / "__init__.py").write_text("SCALE = 2.0\n")
    (src / "model.py").write_text("import torch\nimport mypkg\n\n"
                                  "def build_model():\n    torch.manual_seed(0)\n"
                                  "    return torch.nn.Linear(2, 2)\n")
    first = build(src / "model.py", "1x2", output=src / "mypkg" / "art", includes=[src / "mypkg"])
    again = build(src / "model.py", "1x2", output=tmp_path / "again", includes=[src / "mypkg"])
    assert first.manifest.model.includes == again.manifest.model.includes == (
        "source/mypkg/__init__.py",)
    assert first.digest == again.digest
