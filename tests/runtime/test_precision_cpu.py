"""Reduced precision at load, on the CPU: which precision runs and why, the gate on this
device against the artifact's ``max_error``, precisions a CPU cannot run said clearly, and
manifest fields that cannot loosen a load (the float32 reference self-test is untouched by
them, and the gate measures here whatever build or a choice recorded)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from qkan_pack import LoadOptionError, PrecisionError, Predictor, SelfTestError, build
from qkan_pack.builder import write_artifact
from qkan_pack.format import WEIGHTS_NAME, PrecisionChoice
from qkan_pack.runtime import (
    bind_forward,
    output_errors,
    precision_key,
    read_artifact,
    rebuild_model,
    reference_samples,
    served_forward,
)

from ..conftest import MODELS

CPU = torch.device("cpu")


def _build(tmp_path: Path, name: str, model: str = "plain_mlp.py", shapes: str = "1x2,4x2",
           **kwargs: object) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODELS / model, shapes, output=tmp_path / name, progress=False,
                     **kwargs).path


@pytest.fixture(scope="module")
def bf16_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("bf16"), "mlp", precision="bf16", max_error=2e-2)


def test_a_cpu_load_runs_bfloat16_within_its_gate_and_says_so(bf16_artifact: Path) -> None:
    artifact = read_artifact(bf16_artifact)
    samples, references = reference_samples(artifact, CPU)
    model = rebuild_model(artifact, CPU, {})
    forward = bind_forward(model, artifact.manifest.input_names, artifact.manifest.call)
    reduced = served_forward(forward, "bf16", CPU)
    with Predictor.load(bf16_artifact, device="cpu", progress=False) as predictor:
        record = predictor.report.precision
        assert (record.precision, record.source, record.max_error) == ("bf16",
                                                                       "recorded at build", 2e-2)
        assert record.build_errors == {e.label: e.precision_error["bf16"]
                                       for e in artifact.manifest.shapes}
        for (label, (x,)), want in zip(samples, references):
            got = predictor(x)
            assert got.dtype == torch.float32  # outputs as the manifest describes them
            with torch.no_grad():
                assert torch.equal(got, reduced(x)[0])  # every call computes in bf16
            error = output_errors([got], want)[0]
            assert 0 < error <= 2e-2 and record.errors[label] == pytest.approx(error)
        assert "precision bf16 (recorded at build); max error 0.02; measured here 1x2" \
            in str(predictor.report)
        assert predictor.report.as_dict()["precision"]["precision"] == "bf16"
    with Predictor.load(bf16_artifact, device="cpu", precision="fp32",
                        progress=False) as predictor:
        assert predictor.report.precision.precision == "fp32"
        for (_, (x,)), want in zip(samples, references):
            assert torch.equal(predictor(x), want[0])  # float32, the build host's own math


@pytest.fixture(scope="module")
def auto_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("auto"), "overflow", model="precision_models.py",
                  shapes="4x8", precision="auto", max_error=2e-2)


@pytest.mark.parametrize(("asked", "says"), [
    ("tf32", "TF32 is a tensor-core format of NVIDIA GPUs"),
    ("fp16", "the artifact's build gated only fp32, tf32, bf16"),
])
def test_a_precision_asked_for_that_cannot_run_here_is_refused_saying_why(
        auto_artifact: Path, asked: str, says: str) -> None:
    with pytest.raises(PrecisionError, match=says) as info:
        Predictor.load(auto_artifact, device="cpu", precision=asked, progress=False)
    assert info.value.precision == asked and info.value.device == "cpu"
    assert info.value.measured is None and info.value.problem is not None


def test_a_float32_artifact_runs_no_reduced_precision(tmp_path: Path) -> None:
    path = _build(tmp_path, "fp32")
    with pytest.raises(PrecisionError, match="built in float32 only"):
        Predictor.load(path, device="cpu", precision="bf16", progress=False)
    with Predictor.load(path, device="cpu", progress=False) as predictor:
        assert predictor.report.precision.precision == "fp32"
        assert "precision" not in str(predictor.report).split("kernel cache")[1]
    with pytest.raises(LoadOptionError, match="precision"):
        Predictor.load(path, device="cpu", precision="fp8")


def test_a_recorded_choice_this_cpu_cannot_run_falls_back_to_float32_with_a_warning(
        auto_artifact: Path, tmp_path: Path) -> None:
    artifact = read_artifact(auto_artifact)
    choice = PrecisionChoice(key=precision_key(CPU)[0], precision="tf32")
    policy = dataclasses.replace(artifact.manifest.precision, choices=(choice,))
    path = tmp_path / "chosen"
    write_artifact(path, dataclasses.replace(artifact.manifest, precision=policy),
                   dict(artifact.files))
    with pytest.warns(UserWarning, match="precision tf32 .* is not available on cpu"):
        predictor = Predictor.load(path, device="cpu", progress=False)
    with predictor:
        assert predictor.report.precision.precision == "fp32"
        assert predictor.report.precision.source == "tf32 unavailable here"


def _rewritten(source: Path, target: Path, **changes: object) -> Path:
    """The artifact at ``source`` with its manifest's precision fields changed and the
    manifest re-hashed (what a re-signer can do)."""
    artifact = read_artifact(source)
    manifest = artifact.manifest
    policy = dataclasses.replace(manifest.precision, **changes)
    claimed = tuple(dataclasses.replace(entry, precision_error={"bf16": 1e-4})
                    for entry in manifest.shapes)
    write_artifact(target, dataclasses.replace(manifest, precision=policy, shapes=claimed),
                   dict(artifact.files))
    return target


def test_re_hashed_precision_figures_cannot_loosen_the_gate(bf16_artifact: Path,
                                                            tmp_path: Path) -> None:
    """The gate measures on this device against ``max_error``: build's recorded figures and a
    choice's recorded error are shown beside it, never used as a bound."""
    key = precision_key(CPU)[0]
    choice = PrecisionChoice(key=key, precision="bf16", latency_us={"bf16": (1.0, 1.0)},
                             error={"bf16": (1e-4, 1e-4)})
    path = _rewritten(bf16_artifact, tmp_path / "claimed", max_error=5e-3, choices=(choice,))
    with pytest.raises(PrecisionError) as info:
        Predictor.load(path, device="cpu", progress=False)
    error = info.value
    assert isinstance(error, SelfTestError)
    assert error.precision == "bf16" and error.device == "cpu" and error.max_error == 5e-3
    assert error.measured > 5e-3 and error.build_measured == 1e-4
    assert "build measured 0.0001" in str(error) and "precision='fp32'" in str(error)


def test_loosened_precision_fields_do_not_loosen_the_float32_reference_self_test(
        bf16_artifact: Path, tmp_path: Path) -> None:
    """A weight edit that bfloat16's own rounding would hide (5e-5 of the outputs' scale,
    far below max_error 0.1) is refused: the reference self-test runs in float32, whatever
    precision the manifest asks for."""
    artifact = read_artifact(bf16_artifact)
    references = load_safetensors(artifact.files[artifact.manifest.shapes[1].reference])
    scale = float(references["output.0"].abs().max())
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    weights = save_safetensors({**tensors, "2.bias": tensors["2.bias"] + 5e-5 * scale},
                               metadata={"format": "pt"})
    edited = tmp_path / "edited"
    write_artifact(edited, artifact.manifest, {**artifact.files, WEIGHTS_NAME: weights})
    loosest = _rewritten(edited, tmp_path / "loosest", max_error=0.1)
    for path in (edited, loosest):
        with pytest.raises(SelfTestError, match="build-time references") as info:
            Predictor.load(path, device="cpu", progress=False)
        assert not isinstance(info.value, PrecisionError)
