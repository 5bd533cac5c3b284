"""What build proves about its references: they can tell a wrong model from the built one,
the factory rebuilds the built model, inputs a user gives are used, and failures caused by
an input's dtype say how dtypes are declared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from qkan_pack import (
    FactoryNotReproducibleError,
    InputFileError,
    ModelSourceError,
    Predictor,
    SelfTestError,
    WeakReferencesError,
    build,
)
from qkan_pack.builder import write_artifact
from qkan_pack.format import WEIGHTS_NAME
from qkan_pack.runtime import read_artifact

from ..conftest import MODELS

DETECTOR = MODELS / "detector_like.py"
CANDIDATES = [(16, 4)]


def test_a_detector_that_detects_nothing_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """Its references (boxes 0x4, scores 0) let every weight pass the load self-test: an
    artifact with every weight zeroed loaded with the self-test passed."""
    with pytest.raises(WeakReferencesError, match=r"output.boxes \(empty, 0x4\)") as info:
        build(DETECTOR, CANDIDATES, output=tmp_path / "a", config={"threshold": 0.999},
              progress=False)
    assert info.value.shape == "16x4" and "--reference-inputs" in str(info.value)
    assert not (tmp_path / "a").exists()


def test_allowing_constant_references_notes_it_and_every_load_warns(tmp_path: Path) -> None:
    result = build(DETECTOR, CANDIDATES, output=tmp_path / "a", config={"threshold": 0.999},
                   allow_constant_references=True, progress=False)
    assert any("carry no information" in note for note in result.notes)
    with pytest.warns(UserWarning, match="self-test cannot tell this model from an edited one"):
        Predictor.load(result.path, progress=False).close()


def test_outputs_all_constant_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "zeros.py"
    source.write_text("import torch\n\nclass Z(torch.nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.linear = torch.nn.Linear(4, 2)\n"
                      "    def forward(self, x):\n        return self.linear(x) * 0\n\n"
                      "def build_model():\n    return Z()\n")
    with pytest.raises(WeakReferencesError, match=r"output \(every element 0\) is constant"):
        build(source, "3x4", output=tmp_path / "a", progress=False)


def test_a_constant_output_beside_an_informative_one_is_only_noted(tmp_path: Path) -> None:
    source = tmp_path / "pair.py"
    source.write_text("import torch\n\nclass P(torch.nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.linear = torch.nn.Linear(4, 2)\n"
                      "    def forward(self, x):\n        y = self.linear(x)\n"
                      "        return y, torch.ones_like(y)\n\n"
                      "def build_model():\n    return P()\n")
    result = build(source, "3x4", output=tmp_path / "a", progress=False)
    assert any("output[1] (every element 1)" in note for note in result.notes)


def test_a_detector_with_real_inputs_refuses_a_weight_edit_by_its_shape(tmp_path: Path) -> None:
    """Given inputs that it detects something on, an edit that changes what it detects is
    refused, and the error says the shape changed instead of advising a tolerance."""
    inputs = tmp_path / "candidates.npz"
    np.savez(inputs, x=np.random.default_rng(0).normal(size=(16, 4)) * 3)  # float64: cast
    result = build(DETECTOR, CANDIDATES, output=tmp_path / "a", config={"threshold": 0.5},
                   reference_inputs=inputs, progress=False)
    artifact = read_artifact(result.path)
    references = load_safetensors(artifact.files[result.manifest.shapes[0].reference])
    given = torch.from_numpy(np.load(inputs)["x"]).float()
    assert torch.equal(references["input.x"], given)
    boxes = references["output.0"]
    assert 0 < boxes.shape[0] < 16
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    files = {**artifact.files, WEIGHTS_NAME: save_safetensors(
        {**tensors, "threshold": torch.tensor(0.3)}, metadata={"format": "pt"})}
    write_artifact(tmp_path / "edited", artifact.manifest, files)  # re-hashed
    with pytest.raises(SelfTestError) as info:
        Predictor.load(tmp_path / "edited", progress=False)
    assert info.value.problem is not None
    assert info.value.problem.startswith("output.boxes is ")
    assert f"x4 here, {boxes.shape[0]}x4 at build" in info.value.problem
    assert "reference_tolerance" not in str(info.value)


def test_reference_inputs_in_safetensors_and_npy(tmp_path: Path) -> None:
    array = (np.random.default_rng(1).normal(size=(16, 4)) * 3).astype(np.float32)
    save_file({"x.first": array}, str(tmp_path / "in.safetensors"))
    np.save(tmp_path / "in.npy", array)
    for name in ("in.safetensors", "in.npy"):
        result = build(DETECTOR, CANDIDATES, output=tmp_path / f"built-{name}",
                       config={"threshold": 0.5},
                       reference_inputs=tmp_path / name, progress=False)
        references = load_safetensors(read_artifact(result.path).files[
            result.manifest.shapes[0].reference])
        assert torch.equal(references["input.x"], torch.from_numpy(array))


def test_reference_inputs_for_one_of_two_shapes_notes_the_other(tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", x=np.arange(4, dtype=np.float32).reshape(2, 2))
    result = build(MODELS / "plain_mlp.py", "2x2,8x2", output=tmp_path / "a",
                   reference_inputs=tmp_path / "in.npz", progress=False)
    assert any("no array for shape(s) 8x2" in note for note in result.notes)


@pytest.mark.parametrize(("arrays", "problem"), [
    ({"y": np.ones((16, 4), np.float32)}, "names no input of the model"),
    ({"x": np.ones((4,), np.float32)}, "x is declared as 16x4"),
    ({}, "holds no arrays"),
])
def test_unusable_reference_inputs_are_refused(tmp_path: Path, arrays: dict,
                                               problem: str) -> None:
    np.savez(tmp_path / "in.npz", **arrays)
    with pytest.raises(InputFileError, match=problem):
        build(DETECTOR, CANDIDATES, output=tmp_path / "a", reference_inputs=tmp_path / "in.npz",
              progress=False)
    assert not (tmp_path / "a").exists()


def test_integer_reference_inputs_must_survive_the_cast(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    np.savez(tmp_path / "ids.npz", input_ids=np.full((1, 16), 2**40, np.int64),
             attention_mask=np.ones((1, 16), np.int64))
    with pytest.raises(InputFileError, match="do not survive the cast"):
        build(MODELS / "hf_models.py", [{"input_ids": (1, 16), "attention_mask": (1, 16)}],
              dtype="int32", config={"arch": "bert"}, output=tmp_path / "a",
              reference_inputs=tmp_path / "ids.npz", progress=False)


@pytest.mark.parametrize(("kind", "named"), [("buffer", "buffer offset"),
                                             ("attribute", "output")])
def test_a_factory_that_is_not_reproducible_is_refused_naming_what_differs(
        tmp_path: Path, kind: str, named: str) -> None:
    """Built fine before; every load then failed with 'differ by up to 3.45 ... pass
    reference_tolerance', advice that would hide a model that really differs."""
    with pytest.raises(FactoryNotReproducibleError, match="seed your factory") as info:
        build(MODELS / "unseeded.py", "2x4", output=tmp_path / "a", config={"kind": kind},
              progress=False)
    assert info.value.differs == (named,)
    assert info.value.stage == "factory"
    assert not (tmp_path / "a").exists()
    build(MODELS / "unseeded.py", "2x4", output=tmp_path / "b", config={"kind": "zeros"},
          progress=False)  # deterministic state: builds


def test_a_dtype_failure_says_how_input_dtypes_are_declared(tmp_path: Path) -> None:
    """Whisper/BERT built with the default float32 failed inside F.embedding with no word
    about per-input dtypes."""
    pytest.importorskip("transformers")
    with pytest.raises(ModelSourceError, match=r"An embedding was given floats.*--dtype int64"):
        build(MODELS / "hf_models.py", [{"input_ids": (1, 16), "attention_mask": (1, 16)}],
              config={"arch": "bert"}, output=tmp_path / "a", progress=False)


def test_an_npz_is_held_to_the_size_it_unpacks_to(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An .npz is a zip: 3 MB of compressed zeros unpacked to a 3 GiB array (18 s, 3.3 GB
    of memory) before the 2 GiB limit, which only looked at the file, could say a word."""
    from qkan_pack.builder import _given

    monkeypatch.setattr(_given, "MAX_REFERENCE_INPUTS_BYTES", 1 << 20)
    np.savez_compressed(tmp_path / "in.npz", x=np.zeros((512, 1024), np.float32))  # 2 MiB
    assert (tmp_path / "in.npz").stat().st_size < 1 << 16
    with pytest.raises(InputFileError, match=r"unpack to 2097\d+ bytes, more than the 1048576"):
        _given.read_reference_inputs(tmp_path / "in.npz", {"x": "float32"}, [{"x": (16, 4)}])


@pytest.mark.parametrize(("array", "problem"), [
    (np.array([["a"] * 4] * 16), "numpy dtype <U1, which is no tensor dtype"),
    (np.zeros((16, 4), dtype=[("a", "<i4")]), "which is no tensor dtype"),
    (np.zeros((16, 4), dtype="datetime64[s]"), "numpy dtype datetime64"),
    (np.array(1.0, np.float32), "'x' is a 0-d array, but x is declared as 16x4"),
])
def test_arrays_torch_cannot_take_are_refused_by_name(tmp_path: Path, array: np.ndarray,
                                                      problem: str) -> None:
    """Text, records and dates were a bare TypeError from torch.from_numpy; a 0-d array was
    widened to shape 1 (and taken for a declared 1-element input)."""
    from qkan_pack.builder._given import read_reference_inputs

    np.save(tmp_path / "in.npy", array)
    with pytest.raises(InputFileError, match=problem):
        read_reference_inputs(tmp_path / "in.npy", {"x": "float32"}, [{"x": (16, 4)}])


def test_big_endian_and_bfloat16_reference_inputs_are_read(tmp_path: Path) -> None:
    """A big-endian array was a bare ValueError from torch; bfloat16 safetensors "cannot be
    read" (numpy has no bfloat16), so a bfloat16 model could not be given real inputs."""
    from safetensors.torch import save_file as save_torch_file

    from qkan_pack.builder._given import read_reference_inputs

    values = np.arange(64, dtype=np.float32).reshape(16, 4)
    np.save(tmp_path / "in.npy", values.astype(">f4"))
    read = read_reference_inputs(tmp_path / "in.npy", {"x": "float32"}, [{"x": (16, 4)}])
    assert torch.equal(read["x"][0], torch.from_numpy(values))
    save_torch_file({"x": torch.from_numpy(values).bfloat16()}, str(tmp_path / "in.safetensors"))
    read = read_reference_inputs(tmp_path / "in.safetensors", {"x": "bfloat16"}, [{"x": (16, 4)}])
    assert torch.equal(read["x"][0], torch.from_numpy(values).bfloat16())


def test_a_model_with_tensors_on_the_meta_device_is_refused_at_build(tmp_path: Path) -> None:
    """A non-persistent buffer left on the meta device built fine; every load then failed
    with "unexpected NotImplementedError: Cannot copy out of meta tensor"."""
    source = tmp_path / "meta_buffer.py"
    source.write_text(
        "import torch\n\n\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(4, 4)\n"
        "        self.register_buffer('table', torch.empty(4, device='meta'), persistent=False)\n\n"
        "    def forward(self, x):\n"
        "        return self.linear(x)\n\n\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    return Net()\n")
    with pytest.raises(ModelSourceError, match=r"tensors on the meta device.*: table;") as info:
        build(source, "2x4", output=tmp_path / "a", progress=False)
    assert info.value.stage == "factory" and not (tmp_path / "a").exists()


def test_a_cache_buffer_a_forward_fills_is_no_unreproducible_factory(tmp_path: Path) -> None:
    """A non-persistent cache grown in forward to the longest sequence seen (older
    transformers rotary embeddings) was compared after the reference runs with a fresh
    model's empty one, and a seeded, deterministic model was refused as "not reproducible:
    seed your factory"."""
    source = tmp_path / "rotary_cache.py"
    source.write_text(
        "import torch\n\n\n"
        "class Rotary(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(4, 4)\n"
        "        self.register_buffer('cos_cached', torch.zeros(0, 4), persistent=False)\n\n"
        "    def forward(self, x):\n"
        "        if self.cos_cached.shape[0] < x.shape[1]:\n"
        "            steps = torch.arange(x.shape[1], dtype=torch.float32)[:, None]\n"
        "            self.cos_cached = torch.cos(steps * torch.ones(4))\n"
        "        return self.linear(x) * self.cos_cached[:x.shape[1]]\n\n\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    return Rotary()\n")
    path = build(source, "2x8x4,2x16x4", output=tmp_path / "a", progress=False).path
    with Predictor.load(path, progress=False) as predictor:
        assert predictor(torch.ones(2, 8, 4)).shape == (2, 8, 4)


SPARSE = """
import torch


class Sparse(torch.nn.Module):
    def __init__(self, layout):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)
        self.layout = layout

    def forward(self, x):
        y = self.linear(x)
        return {"y": y, "z": y.to_sparse() if self.layout == "coo" else y.to_sparse_csr()}


def build_model(layout="coo"):
    return Sparse(layout)
"""


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize(("layout", "says"), [("coo", "sparse_coo"), ("csr", "sparse_csr")])
def test_a_sparse_output_is_refused_naming_it_and_its_layout(tmp_path: Path, layout: str,
                                                             says: str) -> None:
    """A sparse output was "unexpected NotImplementedError" with torch's 3 KB list of
    backends (the first op on it, the finiteness check)."""
    model = tmp_path / "sparse.py"
    model.write_text(SPARSE)
    with pytest.raises(ModelSourceError) as info:
        build(model, "1x4,8x4", config={"layout": layout}, output=tmp_path / "a",
              progress=False)
    assert str(info.value) == (f"{model}: forward on shape 1x4 returns output.z as a {says} "
                               "tensor; qkan-pack serves dense tensors only: return it dense "
                               "(.to_dense())")
    assert info.value.stage == "build forward" and not (tmp_path / "a").exists()
