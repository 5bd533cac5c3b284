"""The reference self-test's bound comes from the model's own float32 rounding noise.

Build measures each reference against the model run in float64; a load allows a multiple of
that noise (never more than the fixed tolerance), and beyond it runs the model in float64
on its own device, which must reproduce the recorded noise. A re-signed one-channel edit of a transformer that
the fixed tolerance let through (4.8e-6 of the outputs' scale, below its 1e-5) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from qkan_pack import Predictor, SelfTestError, build
from qkan_pack.builder import write_artifact
from qkan_pack.format import MANIFEST_NAME, WEIGHTS_NAME
from qkan_pack.runtime import read_artifact
from qkan_pack.runtime._float64 import float64_noise
from qkan_pack.runtime._selftest import (
    FLOAT64_FLOOR,
    FLOAT64_MARGIN,
    HALF_CEILING,
    NOISE_FACTOR,
    NOISE_FLOOR,
    ReferencePolicy,
    check_reference,
    noise_tolerance,
)

from ..conftest import MODELS

CEILING = (1e-4, 1e-4)
POLICY = ReferencePolicy(CEILING, print, "HINT")
DEEP = '''
import torch

def build_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)
'''
FLOAT32_STATE = '''
import torch

class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scale = torch.full((4,), 0.5)  # not a buffer: .double() leaves it float32

    def forward(self, x):
        return self.linear(x) @ torch.diag(self.scale)

def build_model():
    return Scaled()
'''


def test_build_records_each_references_rounding_noise(tmp_path: Path) -> None:
    source = tmp_path / "deep.py"
    source.write_text(DEEP)
    path = build(source, "1x64,8x64", output=tmp_path / "a", progress=False).path
    shapes = json.loads((path / MANIFEST_NAME).read_text())["shapes"]
    noises = [entry["noise"] for entry in shapes]
    assert all(0 < n < 1e-5 for n in noises), noises  # float32 rounding, nothing more
    with Predictor.load(path, progress=False) as predictor:
        for record, noise in zip(predictor.report.shapes, noises, strict=True):
            bound = max(NOISE_FLOOR, NOISE_FACTOR * noise)
            assert record.reference_tolerance == (bound, min(bound, 1e-5))
            shown = f"({bound:.2g}, {min(bound, 1e-5):.2g})"  # verify's table shows it
            assert any(line.startswith(record.label) and line.endswith(shown)
                       for line in str(predictor.report).splitlines()), shown


def test_noise_is_not_recorded_where_the_model_cannot_run_in_float64(tmp_path: Path) -> None:
    source = tmp_path / "scaled.py"
    source.write_text(FLOAT32_STATE)
    with pytest.warns(UserWarning, match=r"float32 noise not measured for shape\(s\) 2x4"):
        path = build(source, "2x4", output=tmp_path / "a", progress=False).path
    assert "noise" not in json.loads((path / MANIFEST_NAME).read_text())["shapes"][0]
    with Predictor.load(path, progress=False) as predictor:  # the fixed tolerance, as before
        assert predictor.report.shapes[0].reference_tolerance == predictor.report.reference_tolerance


def test_float64_noise_frees_nothing_of_the_model_and_measures_each_sample() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 3))
    samples = [[torch.randn(1, 32)], [torch.randn(5, 32)]]
    with torch.no_grad():
        outputs = [[model(*s)] for s in samples]
    noises = float64_noise(model, ("x",), "positional", samples, outputs)
    assert all(n is not None and 0 < n < 1e-5 for n in noises), noises
    assert next(model.parameters()).dtype == torch.float32  # the copy was widened, not it
    wrong = [[o[0] * 1.001] for o in outputs]  # outputs that are not this model's
    assert all(n is not None and n > 5e-4 for n in float64_noise(model, ("x",), "positional",
                                                                  samples, wrong))


class _Labelled(torch.nn.Module):
    """Logits with an argmax label and a float32 placeholder (a transformers-style
    ``loss=torch.zeros(())``) beside them."""

    def __init__(self, extras: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 4))
        self.extras = extras

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        import warnings

        warnings.warn("model code warns on every call", stacklevel=1)
        logits = self.body(x) * 20
        if not self.extras:
            return (logits,)
        return logits, logits.argmax(-1), torch.zeros(2)


def test_labels_and_float32_constants_beside_the_logits_do_not_change_the_noise() -> None:
    """An argmax label inflated the recorded noise (4.6x looser bound, a re-signed edit the
    label-free model refused then loaded) and a float32 placeholder output made it
    unmeasurable (found by an audit). The float64 run's warnings are not shown again."""
    x = torch.randn(8, 16)
    noises = []
    for extras in (False, True):
        model = _Labelled(extras).eval()
        with torch.no_grad(), pytest.warns(UserWarning):
            narrow = list(model(x))
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            noises.append(float64_noise(model, ("x",), "positional", [[x]], [narrow])[0])
        assert shown == []
    assert noises[0] is not None and noises[1] == noises[0]


def _near(want: torch.Tensor, share: float) -> torch.Tensor:
    """``want`` moved by ``share`` of its scale at its largest element."""
    got = want.clone()
    got.view(-1)[want.abs().argmax()] += share * want.abs().max()
    return got


def _check(got: torch.Tensor, want: torch.Tensor, noise: float | None,
           wide: torch.Tensor | None, warnings: list[str], measured: list[bool]) -> tuple:
    """``check_reference`` with ``wide`` as the model's float64 outputs on this device."""
    def device_float64() -> list[torch.Tensor] | None:
        measured.append(True)
        return None if wide is None else [wide]
    check = check_reference("2x8", [got], [want], noise=noise,
                            policy=ReferencePolicy(CEILING, warnings.append, "HINT"),
                            device_float64=device_float64)
    return check.tolerance


def test_within_the_noise_bound_accepts_without_running_float64() -> None:
    want = torch.randn(2, 8, dtype=torch.float64)
    measured: list[bool] = []
    tolerance = _check(_near(want, 1e-6), want, 1e-7, want, [], measured)
    assert tolerance == noise_tolerance(1e-7, CEILING) == (1.6e-6, 1.6e-6) and not measured


def test_beyond_the_noise_bound_the_model_in_float64_here_decides() -> None:
    truth = torch.randn(2, 8, dtype=torch.float64)
    want = _near(truth, 1e-7)  # the build's float32 outputs: 1e-7 of scale from float64
    got = _near(want, 4e-6)  # this device rounds differently: beyond 16 x 1e-7, within 1e-4
    measured: list[bool] = []
    bound = FLOAT64_MARGIN * 1e-7 + FLOAT64_FLOOR
    assert _check(got, want, 1e-7, truth, [], measured) == (0.0, bound)  # the same model
    assert measured
    edited = _near(truth, 4e-6)  # another model: its float64 outputs moved too
    with pytest.raises(SelfTestError, match=r"float64 here is 3.9e-06 .* build measured 1e-07"):
        _check(got, want, 1e-7, edited, [], [])
    warnings: list[str] = []  # no float64 copy runs here: the fixed bound, with a warning
    assert _check(got, want, 1e-7, None, warnings, []) == CEILING
    assert "no float64 copy" in warnings[0]


def test_beyond_the_fixed_tolerance_is_refused_without_running_float64() -> None:
    want = torch.randn(2, 8, dtype=torch.float64)
    measured: list[bool] = []
    with pytest.raises(SelfTestError, match="HINT"):
        _check(_near(want, 1e-2), want, 1e-7, want, [], measured)
    assert not measured


def test_unmeasured_noise_keeps_the_fixed_tolerance() -> None:
    want = torch.randn(2, 8, dtype=torch.float64)
    assert _check(_near(want, 5e-5), want, None, None, [], []) == CEILING
    assert noise_tolerance(0.5, CEILING) == CEILING  # never looser than the fixed bound
    assert noise_tolerance(0.0, CEILING) == (NOISE_FLOOR, NOISE_FLOOR)


def test_an_inflated_noise_figure_cannot_loosen_a_float32_model() -> None:
    """A re-hashed manifest claiming noise 0.5: a 1e-3 edit stays outside the fixed bound."""
    truth = torch.randn(2, 8, dtype=torch.float64)
    edited = _near(truth, 1e-3)
    with pytest.raises(SelfTestError):
        _check(edited.float().double(), truth, 0.5, edited, [], [])


def _half(truth: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return truth.to(dtype)


def test_half_precision_outputs_are_held_to_their_own_rounding_not_refused_for_it() -> None:
    """bfloat16 outputs round at ~2e-3 of their scale, above the fixed (1e-4, 1e-4): a sound
    model whose rounding differs on this device is accepted; a x1.01 edit is refused."""
    torch.manual_seed(0)
    truth = torch.randn(4, 10, dtype=torch.float64)
    want = _half(truth)
    noise = float(f"{(want.double() - truth).abs().max() / truth.abs().max():.2g}")
    assert noise > CEILING[1]
    got = _half(_near(truth, 3e-3))  # this device's bf16 rounding lands elsewhere
    bound = FLOAT64_MARGIN * noise + FLOAT64_FLOOR
    assert _check(got, want, noise, truth, [], []) == (0.0, bound)
    with pytest.raises(SelfTestError, match="computed in float64 here"):
        _check(_half(truth * 1.01), want, noise, truth * 1.01, [], [])
    with pytest.raises(SelfTestError, match="no float64 copy"):
        _check(got, want, noise, None, [], [])
    # an inflated noise figure loosens no further than the dtype's own ceiling
    assert _check(got, want, 0.5, truth, [], []) == (0.0, HALF_CEILING[torch.bfloat16])
    with pytest.raises(SelfTestError, match="most this host allows for bfloat16"):
        _check(_half(truth * 1.1), want, 0.5, truth * 1.1, [], [])
    assert HALF_CEILING[torch.bfloat16] == 4 * 2.0**-7


def test_a_changed_output_shape_is_reported_as_such() -> None:
    want = [torch.randn(21, 4), torch.arange(21)]
    got = [torch.randn(17, 4), torch.arange(17)]
    with pytest.raises(SelfTestError) as info:
        check_reference("1x3x64x64", got, want, noise=1e-7, policy=POLICY,
                        device_float64=lambda: None, names=["output[0].boxes", "output[0].labels"])
    assert info.value.problem == "output[0].boxes is 17x4 here, 21x4 at build"
    assert "differ by up to" not in str(info.value) and "reference_tolerance" not in str(info.value)


def test_a_re_signed_one_channel_edit_of_bert_is_refused(tmp_path: Path) -> None:
    """The fixed same-host tolerance (1e-4, 1e-5) accepted this edit: it moves BERT's
    outputs by 4.8e-6 of their scale; the model's own float32 noise is 1e-7."""
    pytest.importorskip("transformers")
    shapes = [{"input_ids": (b, 16), "attention_mask": (b, 16)} for b in (1, 2)]
    path = build(MODELS / "hf_models.py", shapes, output=tmp_path / "bert",
                 config={"arch": "bert"}, dtype="int64", progress=False).path
    Predictor.load(path, progress=False).close()  # the sound artifact: no false refusal
    artifact = read_artifact(path)
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    name = "bert.encoder.layer.0.attention.self.query.weight"
    edited = tensors[name].clone()
    edited[0] = 0
    weights = save_safetensors({**tensors, name: edited}, metadata={"format": "pt"})
    write_artifact(tmp_path / "edited", artifact.manifest, {**artifact.files, WEIGHTS_NAME: weights})
    with pytest.raises(SelfTestError, match="computed in float64 here") as info:
        Predictor.load(tmp_path / "edited", progress=False)
    assert info.value.max_rel > 2e-6
    # an explicit tolerance is the user's call, as before
    Predictor.load(tmp_path / "edited", reference_tolerance=(1e-4, 1e-5), progress=False).close()


def test_re_hashed_solvers_cannot_switch_to_the_cross_solver_tolerance(tmp_path: Path) -> None:
    """A manifest claiming another solver than the exact one this host runs used to select
    the cross-solver tolerance (2e-3, 2e-4) without the noise bound: a weight edit refused as
    built was accepted once ``model.solvers`` was edited and the manifest re-hashed."""
    pytest.importorskip("qkan")
    path = build(Path(__file__).parents[2] / "examples" / "qkan_mlp.py", "1x2,16x2",
                 output=tmp_path / "mlp", progress=False).path
    artifact = read_artifact(path)
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    name = max((k for k, v in tensors.items() if v.is_floating_point()),
               key=lambda k: tensors[k].numel())
    weights = save_safetensors({**tensors, name: tensors[name] * 1.0005},
                               metadata={"format": "pt"})
    files = {**artifact.files, WEIGHTS_NAME: weights}
    write_artifact(tmp_path / "edited", artifact.manifest, files)
    with pytest.raises(SelfTestError):
        Predictor.load(tmp_path / "edited", progress=False)
    manifest = artifact.manifest
    claimed = dataclasses.replace(manifest, model=dataclasses.replace(manifest.model,
                                                                     solvers=("flash",)))
    write_artifact(tmp_path / "claimed", claimed, files)
    with pytest.raises(SelfTestError):
        Predictor.load(tmp_path / "claimed", progress=False)


def test_a_half_precision_output_loosens_no_float32_output_beside_it() -> None:
    """float32 logits beside a bfloat16 auxiliary output were held to the bfloat16 ceiling:
    a 1% edit of the logits passed with a re-hashed noise figure of 0.02."""
    torch.manual_seed(0)
    truth, aux = torch.randn(4, 10, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    edited = _near(truth, 1e-2)
    with pytest.raises(SelfTestError, match="loosen the bound for themselves only"):
        check_reference("4x10", [edited.float(), aux.bfloat16()], [truth.float(), aux.bfloat16()],
                        noise=0.02, policy=POLICY, device_float64=lambda: [edited, aux])
    # the bfloat16 output's own rounding still passes where the logits agree
    got = [truth.float(), _half(_near(aux, 3e-3))]
    noise = float(f"{(aux.bfloat16().double() - aux).abs().max() / aux.abs().max():.2g}")
    check_reference("4x10", got, [truth.float(), aux.bfloat16()], noise=noise, policy=POLICY,
                    device_float64=lambda: [truth, aux])
    # float32 logits cast up from bfloat16 (``logits.float()``) carry bfloat16 rounding,
    # here as at build: held as bfloat16, by their own rounding against float64 here
    upcast = [_half(_near(truth, 3e-3)).float(), _half(_near(aux, 3e-3))]
    want = [_half(truth).float(), _half(aux)]
    noise = max(noise, float(f"{(want[0].double() - truth).abs().max() / truth.abs().max():.2g}"))
    check_reference("4x10", upcast, want, noise=noise, policy=POLICY,
                    device_float64=lambda: [truth, aux])


def test_a_re_hashed_reference_device_cannot_widen_a_cpu_load(tmp_path: Path) -> None:
    """Every build computes its references on the CPU. A manifest re-hashed to say "cuda"
    (with the noise figures raised) switched a CPU load to the cross-device tolerance
    (1e-4, 1e-4), and a bias edit of 5e-5 of the outputs' scale, refused as built, loaded."""
    path = build(MODELS / "plain_mlp.py", "4x2", output=tmp_path / "mlp", progress=False).path
    artifact = read_artifact(path)
    manifest = artifact.manifest
    references = load_safetensors(artifact.files[manifest.shapes[0].reference])
    scale = max(float(v.abs().max()) for k, v in references.items() if k.startswith("output"))
    tensors = load_safetensors(artifact.files[WEIGHTS_NAME])
    weights = save_safetensors({**tensors, "2.bias": tensors["2.bias"] + 5e-5 * scale},
                               metadata={"format": "pt"})
    files = {**artifact.files, WEIGHTS_NAME: weights}
    noisy = tuple(dataclasses.replace(entry, noise=1e-5) for entry in manifest.shapes)
    for device in ("cpu", "cuda"):
        claimed = dataclasses.replace(manifest, shapes=noisy, reference_device=device)
        write_artifact(tmp_path / device, claimed, files)
        with pytest.raises(SelfTestError):
            Predictor.load(tmp_path / device, device="cpu", progress=False)


def test_half_precision_outputs_without_a_measured_noise_keep_their_own_ceiling() -> None:
    """Seventh pass M1: a float32 build whose outputs are bfloat16 records no noise (its
    float64 copy returns bfloat16 too); another device's float32 moves a logit one bfloat16
    step, far beyond the fixed ceiling, and the load refused the model it was built from."""
    torch.manual_seed(0)
    truth = torch.randn(4, 10, dtype=torch.float64)
    want, got = _half(truth), _half(_near(truth, 3e-3))
    assert not torch.equal(got, want)
    check = check_reference("4x10", [got], [want], noise=None, policy=POLICY,
                            device_float64=lambda: None)
    assert check.tolerance == (0.0, HALF_CEILING[torch.bfloat16])
    with pytest.raises(SelfTestError):  # a 10% edit is beyond four bfloat16 steps
        check_reference("4x10", [_half(truth * 1.1)], [want], noise=None, policy=POLICY,
                        device_float64=lambda: None)
    with pytest.raises(SelfTestError):  # a float32 output beside it keeps the fixed ceiling
        check_reference("4x10", [got, _near(truth, 1e-2).float()], [want, truth.float()],
                        noise=None, policy=POLICY, device_float64=lambda: None)
