"""Reduced precision on a GPU: bf16/fp16/TF32 graphs of a small transformer and a CNN within
their gates, replay equal to reduced-precision eager on the device, TF32's process-wide
switches restored, float16 overflow refused on the device, and ``warm --precision auto``
recording a choice for this GPU that the next load follows."""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from qkan_pack import PrecisionError, Predictor, build
from qkan_pack.builder import warm, write_artifact
from qkan_pack.format import PRECISIONS
from qkan_pack.runtime import (
    bind_forward,
    flatten,
    output_errors,
    precision_key,
    precision_unavailable,
    read_artifact,
    rebuild_model,
    reference_samples,
    served_forward,
)

from ..conftest import EXAMPLES, MODELS

pytestmark = pytest.mark.gpu
MAX_ERROR = 3e-2


def _build(source: Path, shapes: object, out: Path, **kwargs: object) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(source, shapes, output=out, progress=False, precision="auto",
                     max_error=MAX_ERROR, **kwargs).path


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("precision")
    shapes = [{"input_ids": (b, 32), "attention_mask": (b, 32)} for b in (1, 8)]
    return {
        "bert": _build(EXAMPLES / "tiny_bert.py", shapes, root / "bert", dtype="int64"),
        "cnn": _build(MODELS / "precision_models.py", "2x3x16x16,8x3x16x16", root / "cnn",
                      config={"kind": "cnn"}),
    }


def _cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _switches() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("precision", ["bf16", "fp16", "tf32"])
@pytest.mark.parametrize("name", ["bert", "cnn"])
def test_reduced_precision_graphs_pass_their_gate_and_replay_equals_reduced_eager(
        artifacts: dict[str, Path], name: str, precision: str) -> None:
    device = _cuda()
    if precision_unavailable(precision, device) is not None:
        pytest.skip(precision_unavailable(precision, device))
    path = artifacts[name]
    before = _switches()
    with Predictor.load(path, device=device, precision=precision, progress=False) as predictor:
        assert _switches() == before  # TF32's switches are process-wide: restored
        record = predictor.report.precision
        assert (record.precision, record.source) == (precision, "asked at load")
        assert set(record.errors) == {e.label for e in predictor.manifest.shapes}
        assert all(0 <= error <= MAX_ERROR for error in record.errors.values()), record
        assert [r.policy for r in predictor.report.shapes] == ["full"] * len(record.errors)
        artifact = read_artifact(path)
        samples, references = reference_samples(artifact, device)
        model = rebuild_model(artifact, device, dict(artifact.manifest.model.config))
        reduced = served_forward(bind_forward(model, artifact.manifest.input_names,
                                              artifact.manifest.call), precision, device)
        for (label, inputs), want in zip(samples, references):
            got = flatten(predictor(*inputs))
            assert all(t.dtype == torch.float32 for t in got if t.is_floating_point())
            if precision != "tf32":  # TF32 eager would need the switches: the load's gate ran it
                with torch.no_grad():
                    eager = reduced(*inputs)
                assert max(output_errors(got, eager)) <= PRECISIONS[precision].unit, label
            assert max(output_errors(got, want)) <= MAX_ERROR, label
    assert _switches() == before


def test_float16_overflow_is_refused_on_the_gpu_with_both_figures(tmp_path: Path) -> None:
    path = _build(MODELS / "precision_models.py", "4x8", tmp_path / "overflow")
    artifact = read_artifact(path)
    manifest = artifact.manifest
    assert "fp16" not in manifest.precision.allowed  # build refused it on the CPU
    claimed = dataclasses.replace(manifest, precision=dataclasses.replace(
        manifest.precision, allowed=(*manifest.precision.allowed, "fp16"), default="fp16"))
    write_artifact(tmp_path / "claimed", claimed, dict(artifact.files))
    with pytest.raises(PrecisionError) as info:
        Predictor.load(tmp_path / "claimed", device="cuda", progress=False)
    assert info.value.device.startswith("cuda") and info.value.measured == float("inf")
    assert "float16 overflows beyond 65504" in str(info.value)
    with Predictor.load(path, device="cuda", precision="bf16", progress=False) as predictor:
        assert predictor.report.precision.errors["4x8"] <= MAX_ERROR


def test_warm_auto_records_a_choice_for_this_gpu_and_the_load_follows_it(
        artifacts: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "bert"
    shutil.copytree(artifacts["bert"], path)
    device = _cuda()
    key = precision_key(device)[0]
    result = warm(path, "cuda", precision="auto")
    choice = result.precision
    assert choice is not None and choice.key == key
    assert choice.precision in read_artifact(path).manifest.precision.allowed
    assert "fp32" in choice.latency_us and len(choice.latency_us) >= 2
    assert all(len(times) == 2 and min(times) > 0 for times in choice.latency_us.values())
    assert all(max(errors) <= MAX_ERROR for errors in choice.error.values())
    assert read_artifact(path).manifest.precision.choice(key) == choice
    labels = [entry.label for entry in read_artifact(path).manifest.shapes]
    with Predictor.load(path, device=device, progress=False) as predictor:
        record = predictor.report.precision
        assert record.precision == choice.precision
        assert [record.of(label) for label in labels] == [choice.for_shape(i)
                                                           for i in range(len(labels))]
        assert record.source == (f"chosen per shape by warm for {key}" if choice.shapes
                                 else f"chosen by warm for {key}")
    print(choice)
