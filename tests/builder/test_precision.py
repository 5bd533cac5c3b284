"""Reduced precision at build: declared, gated on the reference and calibration inputs,
recorded per shape, shown by ``inspect``; and ``warm --precision auto``'s choice per device,
which survives ``warm``, ``sign`` and ``verify``.

The gate runs on the build host (a CPU: autocast emulates float16 and bfloat16 there), so a
model whose activations overflow float16 is refused at fp16 and accepted at bf16 here.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from qkan_pack import OptionError, PrecisionError, Predictor, build, read_artifact
from qkan_pack.builder import warm
from qkan_pack.builder._precision import (
    SPEED_MARGIN,
    TimedCall,
    pick_per_shape,
    pick_precision,
    record_precision_choice,
)
from qkan_pack.builder._warm import _store
from qkan_pack.cli import cli
from qkan_pack.errors import InputFileError
from qkan_pack.format import DEFAULT_MAX_ERROR, MANIFEST_NAME, PrecisionChoice
from qkan_pack.runtime import precision_key

from ..conftest import MODELS

MODEL = MODELS / "precision_models.py"
HALF = MODELS / "half_models.py"


def _build(tmp_path: Path, name: str, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build(MODEL, kwargs.pop("shapes", "4x8"), output=tmp_path / name,
                     progress=False, **kwargs)


def test_the_gate_refuses_float16_overflow_with_the_figures_and_writes_nothing(
        tmp_path: Path) -> None:
    with pytest.raises(PrecisionError) as info:
        _build(tmp_path, "fp16", precision="fp16")
    error = info.value
    assert (error.precision, error.output, error.shape) == ("fp16", "output", "4x8")
    assert error.measured == float("inf") and error.max_error == DEFAULT_MAX_ERROR
    assert error.device.startswith("cpu") and error.figures == (("4x8", "output", float("inf")),)
    assert "float16 overflows beyond 65504: try bf16" in str(error)
    assert "nothing was written" in str(error)
    assert not (tmp_path / "fp16").exists()


def test_a_forward_that_fails_in_a_precision_is_left_out_by_auto_and_refused_by_name(
        tmp_path: Path) -> None:
    """Fifth pass M2: the HQKAN GPT's float16 forward raised on the CPU (no ComplexHalf
    exp) and the whole build failed with "unexpected NotImplementedError"."""
    config = {"kind": "no_float16_kernel"}
    result = _build(tmp_path, "auto", precision="auto", config=config)
    assert result.manifest.precision.allowed == ("fp32", "tf32", "bf16")
    (note,) = [n for n in result.notes if "fp16 left out" in n]
    assert "the forward fails under fp16 on the build host (NotImplementedError" in note
    assert "nothing was written" not in note  # it was (sixth pass L2)
    with pytest.raises(PrecisionError) as info:
        _build(tmp_path, "fp16", precision="fp16", config=config)
    assert info.value.precision == "fp16" and info.value.problem is not None
    assert "ComplexHalf" in str(info.value) and "nothing was written" in str(info.value)
    assert not (tmp_path / "fp16").exists()


def test_the_gate_accepts_the_same_model_in_bfloat16_and_records_its_error(
        tmp_path: Path) -> None:
    result = _build(tmp_path, "bf16", shapes="1x8,4x8", precision="bf16")
    policy = result.manifest.precision
    assert (policy.default, policy.allowed, policy.max_error) == ("bf16", ("fp32", "bf16"),
                                                                 DEFAULT_MAX_ERROR)
    errors = [entry.precision_error["bf16"] for entry in result.manifest.shapes]
    assert all(0 < error <= DEFAULT_MAX_ERROR for error in errors), errors
    weights = read_artifact(result.path).files["weights.safetensors"]
    assert b'"F32"' in weights and b'"BF16"' not in weights  # weights stay float32


def test_auto_allows_what_passes_and_says_why_the_rest_is_left_out(tmp_path: Path) -> None:
    result = _build(tmp_path, "auto", precision="auto", max_error=2e-2)
    policy = result.manifest.precision
    assert policy.default == "fp32" and policy.allowed == ("fp32", "tf32", "bf16")
    assert policy.max_error == 2e-2
    assert result.manifest.shapes[0].precision_error.keys() == {"tf32", "bf16"}
    assert result.manifest.shapes[0].precision_error["tf32"] is None  # no TF32 on a CPU
    assert any("fp16 left out" in note and "output differs beyond any bound" in note
               for note in result.notes)
    assert any("tf32 cannot be measured on the build host" in note for note in result.notes)


def test_calibration_inputs_are_gated_beside_the_references(tmp_path: Path) -> None:
    """Activations 1e2 times a plain layer's stay within float16 on N(0, 1) references;
    calibration inputs a thousand times larger overflow, and the gate sees them."""
    _build(tmp_path, "plain", config={"scale": 1e2}, precision="fp16")  # references pass
    calibration = tmp_path / "calibration.npz"
    rng = np.random.default_rng(0)
    np.savez(calibration, **{"x.big": rng.normal(size=(4, 8)).astype(np.float32) * 1e3,
                             "x.small": rng.normal(size=(4, 8)).astype(np.float32)})
    with pytest.raises(PrecisionError, match="shape 4x8") as info:
        _build(tmp_path, "calibrated", config={"scale": 1e2}, precision="fp16",
               calibration=calibration)
    assert info.value.measured == float("inf")
    result = _build(tmp_path, "calibrated_bf16", config={"scale": 1e2}, precision="bf16",
                    calibration=calibration)
    assert result.manifest.shapes[0].precision_error["bf16"] <= DEFAULT_MAX_ERROR


@pytest.mark.parametrize(("arrays", "says"), [
    ({"y": np.zeros((4, 8), np.float32)}, "names no input"),
    ({"x": np.zeros((3, 8), np.float32)}, "fits no declared shape"),
    ({"x": np.array(["a"] * 4)}, "no tensor dtype"),
])
def test_unusable_calibration_files_are_refused_naming_the_array(
        tmp_path: Path, arrays: dict[str, Any], says: str) -> None:
    path = tmp_path / "calibration.npz"
    np.savez(path, **arrays)
    with pytest.raises(InputFileError, match=says) as info:
        _build(tmp_path, "bad", precision="bf16", calibration=path)
    assert info.value.path == f"--calibration {path}"


def test_a_calibration_sample_the_model_cannot_run_is_named_as_the_files(
        tmp_path: Path) -> None:
    """A NaN in a calibration sample was reported as the model's fault (its weights or
    --input-range); it is the file's, and the message names the file and the sample."""
    path = tmp_path / "calibration.npz"
    bad = np.ones((4, 8), np.float32)
    bad[0, 0] = np.nan
    np.savez(path, **{"x.good": np.ones((4, 8), np.float32), "x.bad": bad})
    with pytest.raises(InputFileError) as info:
        _build(tmp_path, "nan", precision="bf16", calibration=path)
    assert info.value.path == f"--calibration {path}, sample 'bad'"
    assert "the model cannot run on this sample" in info.value.problem
    assert "NaN/inf" in info.value.problem
    assert not (tmp_path / "nan").exists()


def test_tf32_with_calibration_is_refused_as_unmeasurable(tmp_path: Path) -> None:
    path = tmp_path / "calibration.npz"
    np.savez(path, x=np.ones((4, 8), np.float32))
    with pytest.raises(OptionError, match="no --calibration with --precision tf32"):
        _build(tmp_path, "tf32", precision="tf32", calibration=path)
    result = _build(tmp_path, "auto", precision="auto", calibration=path)
    assert any("the --calibration inputs are not measured for it" in note
               for note in result.notes)


@pytest.mark.parametrize(("kwargs", "option"), [
    ({"precision": "fp8"}, "precision"),
    ({"precision": "bf16", "max_error": 0.0}, "max_error"),
    ({"precision": "bf16", "max_error": 0.5}, "max_error"),
    ({"precision": "bf16", "max_error": float("nan")}, "max_error"),
    ({"precision": "bf16", "max_error": True}, "max_error"),
    ({"max_error": 1e-2}, "max_error"),  # float32 has no bound to set
    ({"calibration": "x.npz"}, "calibration"),  # nor anything to calibrate
])
def test_precision_options_outside_their_domain_are_refused_before_the_model_runs(
        tmp_path: Path, kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(OptionError) as info:
        build(tmp_path / "missing.py", "4x8", output=tmp_path / "x", **kwargs)
    assert info.value.option == option


def test_a_model_that_computes_in_half_precision_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="bfloat16 already"):
        build(HALF, "2x64", output=tmp_path / "half", dtype="bfloat16", precision="bf16",
              progress=False)


def test_cli_build_refuses_with_the_figures_and_inspect_shows_the_precision(
        tmp_path: Path) -> None:
    runner = CliRunner()
    refused = runner.invoke(cli, ["build", str(MODEL), "--shapes", "4x8", "--precision", "fp16",
                                  "-o", str(tmp_path / "fp16")])
    assert refused.exit_code == 1
    assert "fp16 on cpu (build host): output differs beyond any bound" in refused.output
    usage = runner.invoke(cli, ["build", str(MODEL), "--shapes", "4x8", "--precision", "bf16",
                                "--max-error", "0.5", "-o", str(tmp_path / "x")])
    assert usage.exit_code == 2 and "--max-error" in usage.output
    built = runner.invoke(cli, ["build", str(MODEL), "--shapes", "4x8", "--precision", "bf16",
                                "--max-error", "0.02", "-o", str(tmp_path / "bf16")])
    assert built.exit_code == 0, built.output
    shown = runner.invoke(cli, ["inspect", str(tmp_path / "bf16")])
    assert "precision  bf16; max error 0.02 of each output's scale; allowed fp32, bf16" \
        in shown.output
    assert "precision err" in shown.output and "bf16 0.0" in shown.output
    verified = runner.invoke(cli, ["verify", str(tmp_path / "bf16"), "--device", "cpu"])
    assert verified.exit_code == 0 and "precision bf16 (recorded at build)" in verified.output
    forced = runner.invoke(cli, ["verify", str(tmp_path / "bf16"), "--device", "cpu",
                                 "--precision", "fp16"])
    assert forced.exit_code == 1 and "the artifact's build gated only fp32, bf16" in forced.output
    as_json = json.loads(runner.invoke(cli, ["inspect", str(tmp_path / "bf16"),
                                             "--json"]).output)
    assert as_json["manifest"]["precision"] == {"default": "bf16", "max_error": 0.02,
                                                "allowed": ["fp32", "bf16"], "choices": []}
    assert "bf16" in as_json["manifest"]["shapes"][0]["precision_error"]


# ---------------------------------------------------------------------------
# warm --precision auto
# ---------------------------------------------------------------------------


def test_the_fastest_precision_is_chosen_and_near_ties_go_to_the_more_precise() -> None:
    latency = {"fp32": [100.0, 400.0], "bf16": [50.0, 200.0], "fp16": [52.0, 200.0]}
    error = {"bf16": [0.004, 0.005], "fp16": [0.0006, 0.0007]}
    assert pick_precision(latency, error) == "fp16"  # within the margin of bf16, more precise
    assert pick_precision({**latency, "fp16": [60.0, 240.0]}, error) == "bf16"
    near = 1 + SPEED_MARGIN / 2
    assert pick_precision({"fp32": [100.0 * near], "bf16": [100.0]}, {"bf16": [0.004]}) == "fp32"
    # one shape much larger cannot decide alone: every shape weighs alike
    assert pick_precision({"fp32": [10.0, 1000.0], "bf16": [20.0, 900.0]}, {}) == "fp32"
    with pytest.raises(PrecisionError, match="no precision could be loaded"):
        pick_precision({}, {})


def _timer_preferring(fast: str) -> Any:
    """A timer that reports ``fast`` as twice as fast as anything else (the call names the
    precision it runs; it is called once, so that the timed predictor really runs)."""
    def timer(call: TimedCall, sync: Any) -> float:
        assert call.label in ("1x8", "4x8")
        call()
        sync()
        return 1e-4 if call.precision == fast else 2e-4
    return timer


@pytest.fixture
def auto_artifact(tmp_path: Path) -> Path:
    return _build(tmp_path, "auto", shapes="1x8,4x8", precision="auto", max_error=2e-2).path


def test_warm_auto_records_the_fastest_passing_precision_for_this_kind_of_device(
        auto_artifact: Path) -> None:
    key = precision_key(torch.device("cpu"))[0]
    result = warm(auto_artifact, "cpu", precision="auto", timer=_timer_preferring("bf16"))
    choice = result.precision
    assert (result.files, choice.key, choice.precision) == (0, key, "bf16")
    assert set(choice.latency_us) == {"fp32", "bf16"} and choice.latency_us["bf16"] == (100.0,
                                                                                       100.0)
    assert set(choice.error) == {"bf16"} and all(0 < e <= 2e-2 for e in choice.error["bf16"])
    assert set(choice.refused) == {"tf32"} and "CPUs compute float32 in full" in \
        choice.refused["tf32"]
    manifest = read_artifact(auto_artifact).manifest
    assert manifest.precision.choices == (choice,) and result.digest == read_artifact(
        auto_artifact).digest
    with Predictor.load(auto_artifact, device="cpu", progress=False) as predictor:
        record = predictor.report.precision
        assert (record.precision, record.source) == ("bf16", f"chosen by warm for {key}")
        assert set(record.errors) == {"1x8", "4x8"}
    # warming again replaces this device's choice, and keeps other devices' choices
    other = PrecisionChoice(key="sm90-NVIDIA_H100", precision="fp32",
                            latency_us={"fp32": (1.0, 2.0)})
    record_precision_choice(auto_artifact, other)
    again = warm(auto_artifact, "cpu", precision="auto", timer=_timer_preferring("fp32"))
    choices = read_artifact(auto_artifact).manifest.precision.choices
    assert [c.key for c in choices] == ["sm90-NVIDIA_H100", key]
    assert again.precision.precision == "fp32" and choices[1] == again.precision


def test_each_shape_gets_the_precision_fastest_for_it() -> None:
    """The resnet50 case on an H100: fp16 won at batch 32 (3.8 ms against fp32's 5.7) and
    lost at batch 1 (942 us against 928): batch 1 keeps fp32."""
    latency = {"fp32": [928.0, 5728.0], "bf16": [1124.0, 4143.0], "fp16": [942.0, 3793.0]}
    error = {"bf16": [0.0047, 0.0051], "fp16": [0.0006, 0.0008]}
    assert pick_precision(latency, error) == "fp16"
    assert pick_per_shape(latency, error) == ("fp32", "fp16")
    assert pick_per_shape({"fp32": [10.0]}, {}) == ("fp32",)


def _timer_by_shape(fast: dict[str, str]) -> Any:
    """``fast[label]`` is twice as fast as anything else at that shape."""
    def timer(call: TimedCall, sync: Any) -> float:
        call()
        sync()
        return 1e-4 if call.precision == fast[call.label] else 2e-4
    return timer


def test_a_choice_per_shape_is_recorded_and_each_shape_loads_in_its_own(
        auto_artifact: Path) -> None:
    result = warm(auto_artifact, "cpu", precision="auto",
                  timer=_timer_by_shape({"1x8": "fp32", "4x8": "bf16"}))
    choice = result.precision
    assert choice.shapes == ("fp32", "bf16")
    assert read_artifact(auto_artifact).manifest.precision.choices == (choice,)
    shown = CliRunner().invoke(cli, ["inspect", str(auto_artifact)])
    assert "fp32 where no choice below names the device" in shown.output
    assert f"{choice.key}: {choice.precision}; per shape fp32, bf16" in shown.output
    x1, x4 = torch.randn(1, 8), torch.randn(4, 8)
    with Predictor.load(auto_artifact, device="cpu", progress=False) as mixed, \
            Predictor.load(auto_artifact, device="cpu", precision="fp32", progress=False) as fp32, \
            Predictor.load(auto_artifact, device="cpu", precision="bf16", progress=False) as bf16:
        record = mixed.report.precision
        assert record.shapes == {"1x8": "fp32", "4x8": "bf16"} and record.reduced
        assert "precision per shape 1x8 fp32, 4x8 bf16" in str(record)
        assert set(record.errors) == {"1x8", "4x8"} and record.errors["1x8"] < 1e-6
        assert torch.equal(mixed(x1), fp32(x1)) and torch.equal(mixed(x4), bf16(x4))
        assert not torch.equal(mixed(x4), fp32(x4))


def test_a_choice_per_shape_outside_the_allowed_is_refused(auto_artifact: Path) -> None:
    from qkan_pack.errors import ManifestError
    from qkan_pack.format import dumps_manifest, parse_manifest

    manifest = read_artifact(auto_artifact).manifest
    key = precision_key(torch.device("cpu"))[0]
    for shapes in (("fp32",), ("fp32", "fp16")):
        bad = PrecisionChoice(key=key, precision="fp32", shapes=shapes)
        text = dumps_manifest(manifest.__class__(**{**manifest.__dict__, "precision":
                                                    manifest.precision.__class__(**{
                                                        **manifest.precision.__dict__,
                                                        "choices": (bad,)})}))
        with pytest.raises(ManifestError, match="one allowed precision per shape"):
            parse_manifest(text)


def test_a_precision_choice_survives_warm_sign_and_verify(auto_artifact: Path,
                                                           tmp_path: Path) -> None:
    from qkan_pack.builder import sign

    from ..runtime.test_signing import write_key  # skips without the [sign] extra

    warm(auto_artifact, "cpu", precision="auto", timer=_timer_preferring("bf16"))
    choices = read_artifact(auto_artifact).manifest.precision.choices
    # shipping a kernel set (what `warm` on a GPU stores) keeps the choices
    _store(auto_artifact, read_artifact(auto_artifact), "sm90-fake", {"gpu": "fake"},
           {"kernels/sm90-fake/a.bin": b"kernel"})
    warmed = read_artifact(auto_artifact).manifest
    assert warmed.precision.choices == choices and warmed.kernels[0].key == "sm90-fake"
    write_key(tmp_path, "a")
    sign(auto_artifact, tmp_path / "a.key")
    done = CliRunner().invoke(cli, ["verify", str(auto_artifact), "--device", "cpu", "--key",
                                    str(tmp_path / "a.pub"), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)["report"]
    assert report["precision"]["precision"] == "bf16"
    assert report["precision"]["source"].startswith("chosen by warm for cpu-")
    with Predictor.load(auto_artifact, device="cpu", trusted_keys=[tmp_path / "a.pub"],
                        progress=False) as predictor:
        assert predictor.report.precision.precision == "bf16"


def test_warm_auto_on_a_float32_artifact_says_to_rebuild(tmp_path: Path) -> None:
    path = _build(tmp_path, "fp32").path
    with pytest.raises(OptionError, match="rebuild it with --precision auto"):
        warm(path, "cpu", precision="auto", timer=_timer_preferring("fp32"))


def test_cli_warm_auto_on_the_cpu_prints_and_records_the_choice(auto_artifact: Path) -> None:
    done = CliRunner().invoke(cli, ["warm", str(auto_artifact), "--device", "cpu",
                                    "--precision", "auto", "--json"])
    assert done.exit_code == 0, done.output
    payload = json.loads(done.stdout)
    assert payload["files"] == 0 and payload["precision"]["precision"] in ("fp32", "bf16")
    assert payload["precision"]["key"] == precision_key(torch.device("cpu"))[0]
    assert set(payload["precision"]["latency_us"]) == {"fp32", "bf16"}
    recorded = json.loads((auto_artifact / MANIFEST_NAME).read_text())["precision"]["choices"]
    assert recorded == [payload["precision"]]
    without = CliRunner().invoke(cli, ["warm", str(auto_artifact), "--device", "cpu"])
    assert without.exit_code == 1 and "needs a CUDA GPU" in without.output


def test_cli_predict_loads_at_the_precision_asked(auto_artifact: Path, tmp_path: Path) -> None:
    """A load whose recorded precision fails its gate on a device needs a way back to
    float32 from every command that loads: predict (and serve) take --precision too."""
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outputs = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.npy"
        result = CliRunner().invoke(cli, ["predict", str(auto_artifact), "--input",
                                          f"x={tmp_path / 'x.npy'}", "--device", "cpu",
                                          "--precision", precision, "-o", str(out)])
        assert result.exit_code == 0, result.output
        outputs[precision] = np.load(out)
        with Predictor.load(auto_artifact, device="cpu", precision=precision,
                            progress=False) as predictor:
            np.testing.assert_array_equal(outputs[precision], predictor(x))
    assert not np.array_equal(outputs["fp32"], outputs["bf16"])


def test_the_gate_sees_small_columns_zeroed_beside_a_large_one(tmp_path: Path) -> None:
    """bfloat16 zeroes four columns a million times smaller than the fifth: a bound relative
    to the whole output's scale saw an error of 1e-7; per channel it is the whole column."""
    with pytest.raises(PrecisionError) as info:
        _build(tmp_path, "columns", shapes="16x8", config={"kind": "small_columns"},
               precision="bf16")
    assert info.value.measured >= 0.5
    assert not (tmp_path / "columns").exists()


@pytest.mark.parametrize(("kind", "shapes"), [
    ("small_columns", "1x8"), ("cancelled_column", "1x2"), ("cancelled_column", "3x2"),
])
def test_the_gate_sees_a_wrong_channel_at_a_batch_of_one(tmp_path: Path, kind: str,
                                                         shapes: str) -> None:
    """Adversarial pass F2: one row (up to three) shows no channel's scale, so a build
    declared at batch 1 only measured against the whole output's and passed a column
    bfloat16 zeroes. More draws of the entry give the channels their scales."""
    with pytest.raises(PrecisionError):
        _build(tmp_path, kind, shapes=shapes, config={"kind": kind}, precision="bf16")
    assert not (tmp_path / kind).exists()


@pytest.mark.parametrize("shapes", ["4x4,4x4096", "1x4,1x4096"])
def test_a_longer_shape_does_not_loosen_a_shorter_ones_gate(tmp_path: Path, shapes: str) -> None:
    """Re-audit N3: channel scales pooled over every shape held 4x4 to 4x4096's (1e6 times
    larger) and passed a column bfloat16 gets half wrong; each shape's scales are its own."""
    with pytest.raises(PrecisionError) as info:
        _build(tmp_path, "length", shapes=shapes, config={"kind": "length_cancel"},
               precision="bf16")
    assert {figure[0] for figure in info.value.figures} >= {shapes.split(",")[0]}


def test_a_batch_of_one_the_model_runs_only_on_given_inputs_builds_and_says_so(
        tmp_path: Path) -> None:
    """Re-audit N1: the extra draws that show a batch of one's channel scales went through
    the reference checks, so a model that takes the log of its (positive) inputs failed to
    build at float32 with the user's own valid reference; the build now says the channels
    are measured against the whole output instead."""
    np.save(tmp_path / "in.npy", np.full((1, 4), 2.0, np.float32))
    result = build(MODEL, "1x4", output=tmp_path / "logs", config={"kind": "log_features"},
                   reference_inputs=tmp_path / "in.npy", progress=False)
    assert any("measured against each output's whole scale" in note and "1x4" in note
               for note in result.notes), result.notes


@pytest.mark.parametrize(("kind", "shapes"), [
    ("small_channel_nchw", "1x3x8x8,4x3x8x8"),  # channels on dim 1
    ("cancelled_column", "1x2,8x2"),  # a column 150x smaller, within 1/max_error
])
def test_the_gate_sees_a_wrong_channel_wherever_it_hides(tmp_path: Path, kind: str,
                                                          shapes: str) -> None:
    """A channel is measured on its own scale wherever it could be wholly wrong within the
    bound on the whole output: NCHW's second axis as well as the last, and channels as close
    as 1/max_error (100x for the default 1e-2), not only 1e3 apart."""
    with pytest.raises(PrecisionError):
        _build(tmp_path, kind, shapes=shapes, config={"kind": kind}, precision="bf16")
    assert not (tmp_path / kind).exists()
