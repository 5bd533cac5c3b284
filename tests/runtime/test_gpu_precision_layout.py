"""Channels-last graphs on a GPU: a residual network's bf16/fp16 (and float32) graphs
captured channels-last pass the same gate as the contiguous ones, replay what channels-last
eager computes on the same device, return contiguous float32 outputs from NCHW inputs;
``warm --precision auto`` times both layouts and the next load follows its choice
(issue 44, item 2)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.builder import warm
from qkan_pack.format import LAYOUTS, PRECISIONS
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
    to_channels_last,
)

from ..conftest import MODELS

pytestmark = pytest.mark.gpu
MAX_ERROR = 5e-2
CL = "channels_last"


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODELS / "precision_models.py", "2x3x32x32,8x3x32x32",
                     config={"kind": "resnet"}, output=tmp_path_factory.mktemp("cl") / "resnet",
                     progress=False, precision="auto", max_error=MAX_ERROR).path


def _cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_channels_last_graphs_pass_the_gate_and_replay_equals_channels_last_eager(
        resnet: Path, precision: str) -> None:
    device = _cuda()
    if precision_unavailable(precision, device) is not None:
        pytest.skip(precision_unavailable(precision, device))
    artifact = read_artifact(resnet)
    assert artifact.manifest.precision.layouts == LAYOUTS
    if precision not in artifact.manifest.precision.allowed:
        pytest.skip(f"{precision} was left out at build (beyond {MAX_ERROR} on its CPU)")
    with Predictor.load(resnet, device=device, precision=precision, layout=CL,
                        progress=False) as predictor:
        record = predictor.report.precision
        assert (record.precision, record.layout) == (precision, CL)
        assert set(record.errors) == {e.label for e in artifact.manifest.shapes}
        assert all(0 <= error <= MAX_ERROR for error in record.errors.values()), record
        assert [r.policy for r in predictor.report.shapes] == ["full", "full"]
        samples, references = reference_samples(artifact, device)
        model = rebuild_model(artifact, device, dict(artifact.manifest.model.config))
        to_channels_last(model)
        eager = served_forward(bind_forward(model, artifact.manifest.input_names,
                                            artifact.manifest.call), precision, device, CL)
        for (label, inputs), want in zip(samples, references):
            assert inputs[0].is_contiguous()  # NCHW in
            got = flatten(predictor(*inputs))
            assert all(t.dtype == torch.float32 and t.is_contiguous() for t in got)
            with torch.no_grad():
                expected = eager(*inputs)
            assert max(output_errors(got, expected)) <= PRECISIONS[precision].unit, label
            assert max(output_errors(got, want)) <= MAX_ERROR, label


def test_warm_times_both_layouts_and_the_load_follows_the_choice(resnet: Path,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "resnet"
    shutil.copytree(resnet, path)
    device = _cuda()
    key = precision_key(device)[0]
    choice = warm(path, "cuda", precision="auto").precision
    assert choice is not None and choice.key == key
    assert choice.channels_last is not None
    timed = choice.figures()
    assert ("fp32", "contiguous") in timed and any(layout == CL for _, layout in timed)
    assert all(len(times) == 2 and min(times) > 0 for times, _ in timed.values())
    labels = [entry.label for entry in read_artifact(path).manifest.shapes]
    with Predictor.load(path, device=device, progress=False) as predictor:
        record = predictor.report.precision
        assert [record.layout_of(label) for label in labels] == [
            choice.layout_for_shape(i) for i in range(len(labels))]
        assert [record.of(label) for label in labels] == [choice.for_shape(i)
                                                           for i in range(len(labels))]
    print(choice)
