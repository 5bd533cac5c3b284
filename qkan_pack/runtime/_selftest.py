"""The one comparison of outputs, and the self-tests a load runs with it.

A load compares twice: eager outputs on this host against the build-time references (is
this the model that was built?), and replayed outputs against eager outputs on the same
device (is the captured graph right?). Tolerances say how far each may drift.

How far a sound model may drift from its references depends on the model: a deep network
accumulates more float32 rounding than a shallow one. Build measures each reference's own
rounding noise (its float32 outputs against the same model run in float64) and a load
allows a multiple of it, within the fixed tolerance: tight enough to refuse a one-channel
edit of a transformer, loose enough for another device's summation order. Measured on an
H200 for 7 torchvision/timm/transformers models built on a CPU: cross-device differences
were at most 4.5x the build's noise (``benchmarks/results/*noise*``).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import SelfTestError
from ._calling import bind_forward
from ._options import Tolerance
from ._progress import progress_bar
from ._tree import flatten

#: A sound model's outputs stay within this many times the build's float32 rounding noise
#: (cross-device at most 4.5x on the H200 zoo) ...
NOISE_FACTOR = 16.0
#: ... and the bound is never below this share of the output's scale (float32 outputs
#: that happen to be exact still reassociate on another host).
NOISE_FLOOR = 1e-6
#: A refusal under the noise bound that the fixed tolerance would accept is looked at again
#: with this device's own noise: a sound model is within the sum of both noises (triangle
#: inequality through the two float64 results), this factor is the margin.
LOAD_NOISE_FACTOR = 4.0


@dataclass(frozen=True)
class Agreement:
    """How far outputs are from the expected ones: the largest absolute difference, the same
    relative to the largest expected magnitude of its output, and whether all are within
    tolerance."""

    max_abs: float
    max_rel: float
    ok: bool


def compare(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
            tolerance: Tolerance) -> Agreement:
    """Every element within ``rtol * |expected| + atol * scale``, ``scale`` being the largest
    magnitude of that output: the check means the same for logits of 1e2 and for an
    untrained network's outputs of 1e-12 (an absolute atol would be blind to the latter).

    A different number of outputs (a config override can change it), a shape or dtype
    difference, any difference in a non-float leaf, or a NaN on either side, is infinitely
    far (in both figures: a non-float leaf never mixes an absolute figure into ``max_rel``).
    """
    rtol, atol = tolerance
    inf = float("inf")
    if len(actual) != len(expected):
        return Agreement(inf, inf, False)
    worst_abs, worst_rel, ok = 0.0, 0.0, True
    for got, want in zip(actual, expected, strict=True):
        got, want = got.detach().to("cpu"), want.detach().to("cpu")
        if got.shape != want.shape or got.dtype != want.dtype:
            return Agreement(float("inf"), float("inf"), False)
        if not got.is_floating_point() or not got.numel():
            if not torch.equal(got, want):
                worst_abs, worst_rel, ok = inf, inf, False
            continue
        got, want = got.double(), want.double()
        diff = (got - want).abs()
        scale = float(want.abs().max())
        largest = float(diff.max())
        if math.isnan(largest) or math.isnan(scale):  # max() would drop a NaN figure
            worst_abs, worst_rel, ok = inf, inf, False
            continue
        worst_abs = max(worst_abs, largest)
        worst_rel = max(worst_rel, largest / scale if scale else (0.0 if largest == 0 else inf))
        ok &= bool((diff <= rtol * want.abs() + atol * scale).all())
    return Agreement(worst_abs, worst_rel, ok)


def check_outputs(label: str, compared: str, got: Sequence[torch.Tensor],
                  want: Sequence[torch.Tensor], tolerance: Tolerance, hint: str) -> float:
    """``compare``, raising ``SelfTestError`` when outside tolerance; the worst difference."""
    agreement = compare(got, want, tolerance)
    if not agreement.ok:
        raise SelfTestError(shape=label, compared=compared, max_abs=agreement.max_abs,
                            max_rel=agreement.max_rel, tolerance=tolerance, hint=hint)
    return agreement.max_abs


def noise_tolerance(noise: float | None, ceiling: Tolerance) -> Tolerance:
    """The reference tolerance for outputs with float32 rounding ``noise`` (a share of their
    scale; None: not measured), never looser than the fixed ``ceiling``."""
    if noise is None:
        return ceiling
    bound = max(NOISE_FLOOR, NOISE_FACTOR * noise)
    return min(ceiling[0], bound), min(ceiling[1], bound)


def float64_noise(model: torch.nn.Module, names: Sequence[str], call: str,
                  samples: Sequence[Sequence[torch.Tensor]],
                  outputs: Sequence[Sequence[torch.Tensor]], *,
                  progress: bool | None = False) -> list[float | None]:
    """Per sample: how far ``outputs`` (the model's float32 outputs on it, flat) are from a
    float64 copy of the model on the same inputs, as a share of each output's scale
    (``compare``'s ``max_rel``), rounded to two digits. None where that cannot be measured:
    the copy or its forward fails (an op without float64, float32 state outside parameters
    and buffers), a floating output is computed in float32 even there (a constant float32
    output, the same in both runs, is skipped), or a non-float output differs. The copy is
    freed before returning; ``progress`` as ``progress_bar``'s."""
    try:
        # eval() again after the cast: modules that fold weights into eval-time caches
        # (QKAN) rebuild them from the float64 parameters
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wide = copy.deepcopy(model).double().train(model.training)
    except Exception:
        return [None] * len(samples)
    forward = bind_forward(wide, names, call)
    noises: list[float | None] = []
    try:
        for inputs, narrow in progress_bar(zip(samples, outputs, strict=True),
                                           desc="reference noise (float64)",
                                           total=len(samples), enabled=progress):
            noises.append(_noise(forward, inputs, narrow))
    finally:
        del forward, wide
    return noises


def _noise(forward: object, inputs: Sequence[torch.Tensor],
           narrow: Sequence[torch.Tensor]) -> float | None:
    widened = [t.double() if t.is_floating_point() else t for t in inputs]
    try:
        # the float32 run already showed the model code's warnings; this is a measurement
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wide = flatten(forward(*widened))  # type: ignore[operator]
    except Exception:
        return None
    if len(wide) != len(narrow):
        return None
    pairs = []
    for a, b in zip(narrow, wide):
        if b.is_floating_point() and b.dtype != torch.float64:
            if not torch.equal(a.detach().cpu(), b.detach().cpu()):
                return None  # computed in float32 even here: no float64 to measure against
            continue  # a constant (``torch.zeros(2)``, a placeholder loss): nothing to measure
        pairs.append((a.double() if a.is_floating_point() else a, b))
    noise = compare([a for a, _ in pairs], [b for _, b in pairs], (0.0, 0.0)).max_rel
    return float(f"{noise:.2g}") if noise < float("inf") else None


@dataclass(frozen=True)
class ReferenceCheck:
    """A shape's outputs against its build references: the largest difference and the
    ``(rtol, atol)`` it was held to."""

    max_abs: float
    tolerance: Tolerance


def check_reference(label: str, got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], *,
                    noise: float | None, ceiling: Tolerance,
                    device_noise: Callable[[], float | None], warn: Callable[[str], None],
                    hint: str) -> ReferenceCheck:
    """Outputs on this host against the build references, held to the model's own rounding
    noise (``noise_tolerance``; ``noise`` None: to ``ceiling``).

    Outside the noise bound but within ``ceiling``, the difference is weighed against this
    device's own noise too (``device_noise``, measured only then): a sound model is within
    the sum of the two noises, whatever this device's summation order; a changed model is
    not. Where this device's noise cannot be measured, ``ceiling`` decides, with a warning.
    """
    compared = "outputs on this host and the build-time references"
    tight = noise_tolerance(noise, ceiling)
    agreement = compare(got, want, tight)
    if agreement.ok:
        return ReferenceCheck(agreement.max_abs, tight)
    if noise is None or tight == ceiling or not compare(got, want, ceiling).ok:
        raise SelfTestError(shape=label, compared=compared, max_abs=agreement.max_abs,
                            max_rel=agreement.max_rel, tolerance=ceiling, hint=hint)
    here = device_noise()
    if here is None:
        warn(f"shape {label}: outputs differ from the build references by "
             f"{agreement.max_rel:.2g} of their scale, more than {NOISE_FACTOR:g}x the "
             f"model's float32 noise ({noise:.2g}), and this device's noise could not be "
             "measured (no float64 copy of the model here): accepted under the fixed tolerance "
             f"{ceiling}; pin the digest or sign the artifact to rule out an edit")
        return ReferenceCheck(agreement.max_abs, ceiling)
    bound = LOAD_NOISE_FACTOR * (noise + here)
    if agreement.max_rel <= bound:
        return ReferenceCheck(agreement.max_abs, (0.0, bound))
    raise SelfTestError(
        shape=label, compared=compared, max_abs=agreement.max_abs, max_rel=agreement.max_rel,
        tolerance=(0.0, bound),
        hint=(f"The model's float32 rounding noise is {noise:.2g} of the outputs' scale on "
              f"the build host and {here:.2g} here (each against float64), so the same model "
              f"stays within {bound:.2g}: the weights, model source or runtime differ from "
              "what was built. If that is expected, pass reference_tolerance=(rtol, atol)"))
