"""Channels-last graphs on the CPU stand-in path: which builds list the layout, what a
channels-last load computes (inputs converted inside the call, outputs contiguous, weights
converted when every shape runs channels-last), the gate over its outputs, a choice per
shape, and the refusals (issue 44, item 2)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from qkan_pack import LoadOptionError, ModelSourceError, PrecisionError, Predictor, build
from qkan_pack.builder import write_artifact
from qkan_pack.cli import cli
from qkan_pack.format import LAYOUTS, MANIFEST_NAME, PrecisionChoice
from qkan_pack.runtime import (
    bind_forward,
    flatten,
    output_errors,
    precision_key,
    read_artifact,
    rebuild_model,
    reference_samples,
    served_forward,
    to_channels_last,
)

from ..conftest import MODELS

CPU = torch.device("cpu")
MODEL = MODELS / "precision_models.py"
CL = "channels_last"


def _build(root: Path, kind: str, shapes: str = "2x3x16x16,4x3x16x16", **kwargs: Any) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODEL, shapes, config={"kind": kind}, output=root / kind, progress=False,
                     **kwargs).path


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny residual network with its feature map among the outputs (bfloat16 moves
    that small-valued 4-D output by some 5e-2 of its scale on a CPU: bound 1e-1)."""
    return _build(tmp_path_factory.mktemp("layout"), "resnet_features", precision="auto",
                  max_error=1e-1)


def _eager(artifact: Path, precision: str, layout: str) -> Any:
    """The model rebuilt here and run as ``precision``'s graphs in ``layout`` compute (its
    weights converted as a channels-last load converts them)."""
    verified = read_artifact(artifact)
    model = rebuild_model(verified, CPU, verified.manifest.model.config)
    if layout == CL:
        to_channels_last(model)
    forward = bind_forward(model, verified.manifest.input_names, verified.manifest.call)
    return served_forward(forward, precision, CPU, layout)


def test_build_lists_channels_last_for_a_model_with_a_2d_convolution_only(
        resnet: Path, tmp_path: Path) -> None:
    assert read_artifact(resnet).manifest.precision.layouts == LAYOUTS
    mlp = _build(tmp_path, "mlp", shapes="2x16", precision="auto", max_error=2e-2)
    policy = read_artifact(mlp).manifest.precision
    assert policy.layouts == ("contiguous",)
    raw = json.loads((mlp / MANIFEST_NAME).read_text())
    assert "layouts" not in raw["precision"]  # nothing recorded: the manifest as before
    # a float32 build of the CNN records no precision, hence no layout, at all
    plain = _build(tmp_path, "resnet")
    assert read_artifact(plain).manifest.precision is None


def test_a_channels_last_load_converts_inside_the_call_and_returns_contiguous_outputs(
        resnet: Path) -> None:
    verified = read_artifact(resnet)
    samples, references = reference_samples(verified, CPU)
    for precision in ("bf16", "fp32"):
        with Predictor.load(resnet, device="cpu", precision=precision, layout=CL,
                            progress=False) as predictor:
            record = predictor.report.precision
            assert (record.precision, record.layout, record.gated) == (precision, CL, True)
            assert f"precision {precision} channels-last" in str(predictor.report)
            assert set(record.errors) == {label for label, _ in samples}  # the gate ran
            conv = predictor._model.stem[0].weight
            assert conv.is_contiguous(memory_format=torch.channels_last)
            eager = _eager(resnet, precision, CL)
            for (label, (x,)), want in zip(samples, references):
                given = x.clone()
                got = predictor(x)
                assert torch.equal(x, given) and x.is_contiguous()  # the caller's tensor
                for leaf in got.values():
                    assert leaf.dtype == torch.float32 and leaf.is_contiguous()
                assert got["features"].shape == (x.shape[0], 32, 8, 8)
                with torch.no_grad():
                    expected = eager(x)
                assert all(torch.equal(a, b) for a, b in zip(flatten(got), expected))
                errors = output_errors(flatten(got), want, 1e-1)  # as the gate, its bound
                assert max(errors) == pytest.approx(record.errors[label])
                assert max(errors) <= (1e-5 if precision == "fp32" else 1e-1)


def test_a_layout_is_refused_where_the_build_does_not_list_it(resnet: Path,
                                                               tmp_path: Path) -> None:
    mlp = _build(tmp_path, "mlp", shapes="2x16", precision="auto", max_error=2e-2)
    with pytest.raises(PrecisionError, match="layout channels_last: the artifact's build "
                                             "lists only contiguous") as info:
        Predictor.load(mlp, device="cpu", layout=CL, progress=False)
    assert info.value.problem is not None and info.value.measured is None
    plain = _build(tmp_path, "resnet")
    with pytest.raises(PrecisionError, match="built in float32 only"):
        Predictor.load(plain, device="cpu", layout=CL, progress=False)
    with Predictor.load(plain, device="cpu", layout="contiguous", progress=False) as predictor:
        assert predictor.report.precision.layout == "contiguous"
    with pytest.raises(LoadOptionError, match="layout"):
        Predictor.load(resnet, device="cpu", layout="nhwc")


def test_a_model_whose_forward_cannot_run_channels_last_is_not_listed(tmp_path: Path) -> None:
    """``view`` on a convolution's output fails on a channels-last tensor: build says so and
    lists the contiguous layout only, so warm never times a layout the model cannot run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = build(MODEL, "2x3x8x8", config={"kind": "view_after_conv"},
                       output=tmp_path / "view", progress=False, precision="auto",
                       max_error=5e-2)
    assert result.manifest.precision.layouts == ("contiguous",)
    assert any(note.startswith("channels-last graphs are not listed: the forward fails on "
                               "channels-last inputs") and "view" in note
               for note in result.notes), result.notes
    # forced into the manifest anyway (a hand-edited, re-written artifact): the load fails
    # naming the model's line, as any model-code failure does
    verified = read_artifact(result.path)
    policy = dataclasses.replace(verified.manifest.precision, layouts=LAYOUTS)
    write_artifact(result.path, dataclasses.replace(verified.manifest, precision=policy),
                   dict(verified.files), force=True)
    with pytest.raises(ModelSourceError, match="view size is not compatible"):
        Predictor.load(result.path, device="cpu", precision="fp32", layout=CL, progress=False)


def _with_choice(artifact: Path, choice: PrecisionChoice) -> None:
    verified = read_artifact(artifact)
    policy = dataclasses.replace(verified.manifest.precision, choices=(choice,))
    write_artifact(artifact, dataclasses.replace(verified.manifest, precision=policy),
                   dict(verified.files), force=True)


def test_a_recorded_layout_per_shape_loads_each_shape_in_its_own(resnet: Path,
                                                                  tmp_path: Path) -> None:
    """A choice that mixes layouts keeps the weights contiguous (a channels-last weight would
    turn the contiguous shape's convolutions channels-last too); each shape computes what
    its own layout computes."""
    copy = tmp_path / "mixed"
    copy.mkdir()
    verified = read_artifact(resnet)
    write_artifact(copy, verified.manifest, dict(verified.files), force=True)
    key = precision_key(CPU)[0]
    _with_choice(copy, PrecisionChoice(key=key, precision="bf16",
                                       shape_layouts=("contiguous", CL)))
    samples, _ = reference_samples(read_artifact(copy), CPU)
    with Predictor.load(copy, device="cpu", progress=False) as predictor:
        record = predictor.report.precision
        assert record.layouts == {"2x3x16x16": "contiguous", "4x3x16x16": CL}
        assert record.shapes == {"2x3x16x16": "bf16", "4x3x16x16": "bf16"}
        assert "precision per shape 2x3x16x16 bf16, 4x3x16x16 bf16 channels-last" in str(record)
        assert predictor._model.stem[0].weight.is_contiguous()  # not converted
        for (label, (x,)), layout in zip(samples, ("contiguous", CL)):
            with torch.no_grad():
                want = _eager(copy, "bf16", layout)(x)
            got = flatten(predictor(x))
            assert all(leaf.is_contiguous() for leaf in got)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), label
    # the whole choice channels-last converts the weights, as a load asked for it does
    _with_choice(copy, PrecisionChoice(key=key, precision="bf16", layout=CL))
    with Predictor.load(copy, device="cpu", progress=False) as predictor:
        assert predictor.report.precision.layout == CL and not predictor.report.precision.layouts
        assert predictor._model.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert predictor.report.precision.source == f"chosen by warm for {key}"
    # asked by name, a precision runs contiguous unless a layout is asked too
    with Predictor.load(copy, device="cpu", precision="bf16", progress=False) as predictor:
        assert predictor.report.precision.layout == "contiguous"


def test_inspect_and_verify_show_the_layouts(resnet: Path) -> None:
    shown = CliRunner().invoke(cli, ["inspect", str(resnet)])
    assert shown.exit_code == 0, shown.output
    assert "layouts contiguous, channels_last" in shown.output
    done = CliRunner().invoke(cli, ["verify", str(resnet), "--device", "cpu", "--precision",
                                    "bf16", "--layout", "channels_last", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)["report"]["precision"]
    assert (report["precision"], report["layout"]) == ("bf16", "channels_last")
    bad = CliRunner().invoke(cli, ["verify", str(resnet), "--layout", "nhwc"])
    assert bad.exit_code == 2 and "nhwc" in bad.output
