"""``warm --precision auto`` among precision x layout: the one pick rule over (precision,
layout) candidates (channels-last kept only where it beats its precision's contiguous
graphs by more than the margin), the choice recorded for the artifact and per shape with
the channels-last figures, and what ``warm`` says; timings injected (issue 44, item 2)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from qkan_pack import Predictor, build, read_artifact
from qkan_pack.builder import warm, write_artifact
from qkan_pack.builder._precision import (
    SPEED_MARGIN,
    TimedCall,
    pick_per_shape,
    pick_precision,
)
from qkan_pack.cli import cli
from qkan_pack.format import LAYOUTS, MANIFEST_NAME
from qkan_pack.runtime import precision_key

from ..conftest import MODELS

MODEL = MODELS / "precision_models.py"
C, CL = "contiguous", "channels_last"


def test_channels_last_is_picked_only_where_it_beats_its_contiguous_graphs() -> None:
    """The resnet50 batch-32 case: bf16 NCHW 4143 us against fp32's 5728, channels-last
    bf16 faster still (a figure of the kind the device script measures)."""
    latency = {("fp32", C): [5728.0], ("bf16", C): [4143.0], ("bf16", CL): [2900.0],
               ("fp32", CL): [5600.0]}
    error = {("bf16", C): [0.005], ("bf16", CL): [0.005], ("fp32", CL): [0.0]}
    assert pick_precision(latency, error) == ("bf16", CL)
    # within the margin of its contiguous graphs, channels-last is not kept, even where its
    # measured error happens to be smaller: a layout changes kernels, not the arithmetic
    near = 1 - SPEED_MARGIN / 2
    close = {**latency, ("bf16", CL): [4143.0 * near]}
    assert pick_precision(close, {**error, ("bf16", CL): [0.004]}) == ("bf16", C)
    # a more precise precision near the fastest still wins, in its own fastest layout
    fp16 = {**latency, ("fp16", C): [3800.0], ("fp16", CL): [2950.0]}
    assert pick_precision(fp16, {**error, ("fp16", C): [0.0007], ("fp16", CL): [0.0008]}) \
        == ("fp16", CL)
    # bare precisions (an artifact without channels-last) rank exactly as before
    assert pick_precision({"fp32": [100.0], "bf16": [50.0]}, {"bf16": [0.004]}) == "bf16"


def test_each_shape_gets_the_layout_fastest_for_it() -> None:
    latency = {("fp32", C): [928.0, 5728.0], ("bf16", C): [1124.0, 4143.0],
               ("bf16", CL): [1100.0, 2900.0]}
    error = {("bf16", C): [0.004, 0.005], ("bf16", CL): [0.004, 0.005]}
    assert pick_per_shape(latency, error) == (("fp32", C), ("bf16", CL))


@pytest.fixture
def resnet(tmp_path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODEL, "2x3x16x16,4x3x16x16", config={"kind": "resnet"},
                     output=tmp_path / "resnet", progress=False, precision="auto",
                     max_error=5e-2).path


def _timer(fast: dict[str, tuple[str, str]]) -> Any:
    """At each shape label, ``fast[label]`` (a precision and layout) is twice as fast as
    anything else. The call runs once, so that the timed predictor really runs."""
    def timer(call: TimedCall, sync: Any) -> float:
        call()
        sync()
        return 1e-4 if (call.precision, call.layout) == fast[call.label] else 2e-4
    return timer


def test_warm_records_channels_last_where_it_is_timed_faster(resnet: Path) -> None:
    key = precision_key(torch.device("cpu"))[0]
    result = warm(resnet, "cpu", precision="auto",
                  timer=_timer({"2x3x16x16": ("bf16", CL), "4x3x16x16": ("bf16", CL)}))
    choice = result.precision
    assert (choice.key, choice.precision, choice.layout) == (key, "bf16", CL)
    assert not choice.per_shape
    assert set(choice.latency_us) == {"fp32", "bf16"}  # contiguous: tf32, fp16 refused
    assert set(choice.channels_last.latency_us) == {"fp32", "bf16"}
    assert choice.channels_last.latency_us["bf16"] == (100.0, 100.0)
    assert all(0 <= e <= 5e-2 for e in choice.channels_last.error["bf16"])
    assert choice.channels_last.error["fp32"] == pytest.approx((0.0, 0.0), abs=1e-5)
    assert set(choice.refused) == {"tf32", "fp16"} and not choice.channels_last.refused
    assert read_artifact(resnet).manifest.precision.choices == (choice,)
    with Predictor.load(resnet, device="cpu", progress=False) as predictor:
        record = predictor.report.precision
        assert (record.precision, record.layout) == ("bf16", CL)
        assert predictor._model.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    shown = CliRunner().invoke(cli, ["inspect", str(resnet)])
    assert f"{key}: bf16 channels-last (fp32 200.0 us, bf16 200.0 us err" in shown.output


def test_warm_keeps_contiguous_where_channels_last_is_no_faster(resnet: Path) -> None:
    """Channels-last 2% faster than bf16's contiguous graphs is within the timing noise:
    contiguous kept; nothing of the layout but its figures recorded."""
    table = {("fp32", C): 2e-4, ("fp32", CL): 2e-4, ("bf16", C): 1e-4, ("bf16", CL): 0.98e-4}

    def timer(call: TimedCall, sync: Any) -> float:
        return table[call.precision, call.layout]
    choice = warm(resnet, "cpu", precision="auto", timer=timer).precision
    assert choice.channels_last.latency_us["bf16"] == (98.0, 98.0)
    assert (choice.precision, choice.layout, choice.shape_layouts) == ("bf16", C, ())
    assert choice.channels_last is not None  # timed, and shown
    raw = (resnet / "manifest.json").read_text()
    assert '"layout"' not in raw and '"shape_layouts"' not in raw


def test_warm_chooses_a_layout_per_shape(resnet: Path) -> None:
    result = warm(resnet, "cpu", precision="auto",
                  timer=_timer({"2x3x16x16": ("fp32", C), "4x3x16x16": ("bf16", CL)}))
    choice = result.precision
    assert choice.shapes == ("fp32", "bf16") and choice.shape_layouts == (C, CL)
    assert choice.named_shapes() == ["fp32", "bf16 channels-last"]
    shown = CliRunner().invoke(cli, ["inspect", str(resnet)])
    assert f"{choice.key}: fp32; per shape fp32, bf16 channels-last (" in shown.output
    with Predictor.load(resnet, device="cpu", progress=False) as predictor:
        record = predictor.report.precision
        assert record.layouts == {"2x3x16x16": C, "4x3x16x16": CL}
        assert record.shapes == {"2x3x16x16": "fp32", "4x3x16x16": "bf16"}


def test_a_model_without_a_convolution_is_timed_in_one_layout(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = build(MODEL, "2x16", config={"kind": "mlp"}, output=tmp_path / "mlp",
                     progress=False, precision="auto", max_error=2e-2).path
    layouts: set[str] = set()

    def timer(call: TimedCall, sync: Any) -> float:
        layouts.add(call.layout)
        return 1e-4
    choice = warm(path, "cpu", precision="auto", timer=timer).precision
    assert layouts == {C} and choice.channels_last is None and choice.layout == C


def test_warm_says_what_it_timed_in_each_layout(resnet: Path) -> None:
    """``qkan-pack warm --precision auto`` on this CPU (its own timer): a line per precision
    and layout timed, one per refusal, in one column."""
    done = CliRunner().invoke(cli, ["warm", str(resnet), "--device", "cpu", "--precision",
                                    "auto"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[1].startswith("precision ") and " chosen for cpu-" in lines[1]
    width = len("bf16 channels-last")
    for name in ("fp32", "bf16", "fp32 channels-last", "bf16 channels-last"):
        assert any(line.startswith(f"  {name:<{width}} ") and " us, " in line
                   for line in lines), (name, lines)
    assert any(line.startswith(f"  {'tf32':<{width}} refused: TF32") for line in lines), lines


def _version(artifact: Path) -> int:
    return json.loads((artifact / MANIFEST_NAME).read_bytes())["format_version"]


def test_warm_writes_the_format_version_its_keys_need(resnet: Path, tmp_path: Path) -> None:
    """Every rewrite of a manifest (warm's choice, a re-writer) goes through the one writer,
    which writes the lowest format version holding its keys; the digest warm returns is the
    written manifest's, which loads pinned to it."""
    assert _version(resnet) == 3  # build listed channels-last: precision.layouts
    # the same model as a release before layouts built it: format 2, contiguous only
    old = tmp_path / "old"
    verified = read_artifact(resnet)
    policy = dataclasses.replace(verified.manifest.precision, layouts=(C,))
    written, _ = write_artifact(old, dataclasses.replace(verified.manifest, precision=policy),
                                dict(verified.files))
    assert _version(old) == 2 == written.format_version
    fast_cl = _timer({"2x3x16x16": ("bf16", CL), "4x3x16x16": ("bf16", CL)})
    result = warm(old, "cpu", precision="auto", timer=fast_cl)
    assert result.precision.layout == C and result.precision.channels_last is None
    assert _version(old) == 2  # warm kept it loadable by the readers of format 2
    assert read_artifact(old, expected_digest=result.digest).manifest.format_version == 2
    # listing channels-last (a key of format 3) raises it, and warm's choice keeps it there
    listed = dataclasses.replace(read_artifact(old).manifest.precision, layouts=LAYOUTS)
    written, _ = write_artifact(old, dataclasses.replace(read_artifact(old).manifest,
                                                         precision=listed),
                                dict(read_artifact(old).files), force=True)
    assert _version(old) == 3 == written.format_version
    result = warm(old, "cpu", precision="auto", timer=fast_cl)
    assert result.precision.layout == CL and _version(old) == 3
    assert read_artifact(old, expected_digest=result.digest).manifest.precision.choices == (
        result.precision,)
