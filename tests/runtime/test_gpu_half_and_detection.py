"""Models built on the CPU that the GPU load used to refuse or fail (``pytest -m gpu``):
half-precision weights (their own rounding is above the fixed cross-device tolerance), a
torchvision detector (a submodule returning an ImageList), and an encoder whose padding
mask sends it down torch's nested-tensor fast path (a capture failure naming no op)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from qkan_pack import Predictor, SelfTestError, WeakReferencesError, build
from qkan_pack.builder import write_artifact
from qkan_pack.format import WEIGHTS_NAME
from qkan_pack.runtime import flatten, read_artifact, rebuild_model, reference_samples

from ..conftest import MODELS

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _scaled_head(path: Path, out: Path) -> Path:
    """The artifact with its last weight matrix scaled by 1.01, every digest recomputed."""
    artifact = read_artifact(path)
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    head = [name for name, t in tensors.items() if t.ndim == 2][-1]
    weights = save_safetensors({**tensors, head: tensors[head] * 1.01}, metadata={"format": "pt"})
    write_artifact(out, artifact.manifest, {**artifact.files, WEIGHTS_NAME: weights})
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("kind", "shape"), [("mlp", (8, 64)), ("cnn", (4, 3, 32, 32))])
def test_half_precision_models_load_on_the_gpu_and_a_1_percent_edit_is_refused(
        tmp_path: Path, dtype: str, kind: str, shape: tuple[int, ...]) -> None:
    path = build(MODELS / "half_models.py", [shape], dtype=dtype, output=tmp_path / "a",
                 config={"dtype": dtype, "kind": kind}, progress=False).path
    with Predictor.load(path, device="cuda", progress=False) as predictor:  # no false refusal
        print(predictor.report)
        artifact = read_artifact(path)
        eager = rebuild_model(artifact, CUDA, dict(artifact.manifest.model.config))
        x = torch.randn(shape, device="cuda").to(getattr(torch, dtype))
        with torch.no_grad():
            torch.testing.assert_close(predictor(x), eager(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(SelfTestError, match="computed in float64 here"):
        Predictor.load(_scaled_head(path, tmp_path / "edited"), device="cuda", progress=False)


DETECTOR = {"family": "detection", "name": "fasterrcnn_mobilenet_v3_large_320_fpn"}


def test_a_torchvision_detector_is_refused_at_build_then_loads_when_allowed(
        tmp_path: Path) -> None:
    """Random weights detect nothing: its references cannot tell models apart. Allowed
    anyway, the GPU load leaves the ImageList-returning transform eager instead of failing."""
    pytest.importorskip("torchvision")
    with pytest.raises(WeakReferencesError):
        build(MODELS / "zoo.py", [(1, 3, 320, 320)], config=DETECTOR, output=tmp_path / "refused",
              progress=False)
    path = build(MODELS / "zoo.py", [(1, 3, 320, 320)], config=DETECTOR, output=tmp_path / "a",
                 allow_constant_references=True, progress=False).path
    with pytest.warns(UserWarning, match="carry no information"), \
            Predictor.load(path, device="cuda", progress=False) as predictor:
        record = predictor.report.shapes[0]
        assert record.policy == "submodules" and record.graphs > 0, predictor.report
        artifact = read_artifact(path)
        eager = rebuild_model(artifact, CUDA, dict(artifact.manifest.model.config))
        (_, inputs), = reference_samples(artifact, CUDA)[0]
        with torch.no_grad():
            want = flatten(eager(*inputs))
        got = flatten(predictor(*inputs))
        assert [t.shape for t in got] == [t.shape for t in want]


def test_the_nested_tensor_fast_path_is_named_as_the_fallback_reason(tmp_path: Path) -> None:
    path = build(MODELS / "masked_encoder.py", [{"x": (2, 16, 32), "mask": (2, 16)}],
                 dtype={"x": "float32", "mask": "int64"}, output=tmp_path / "a",
                 progress=False).path
    with Predictor.load(path, device="cuda", progress=False) as predictor:
        record = predictor.report.shapes[0]
        assert record.policy == "submodules"
        assert "nested tensors" in record.fallback_reason, record.fallback_reason
        artifact = read_artifact(path)
        eager = rebuild_model(artifact, CUDA, dict(artifact.manifest.model.config))
        (_, (x, mask)), = reference_samples(artifact, CUDA)[0]
        with torch.no_grad():
            want = eager(x=x, mask=mask)
        torch.testing.assert_close(predictor(x=x, mask=mask), want, rtol=1e-4, atol=1e-5)
