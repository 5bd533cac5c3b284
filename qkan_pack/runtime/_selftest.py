"""The one comparison of outputs, and the self-tests a load runs with it.

A load compares twice: eager outputs on this host against the build-time references (is
this the model that was built?), and replayed outputs against eager outputs on the same
device (is the captured graph right?). Tolerances say how far each may drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import SelfTestError
from ._options import Tolerance


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
    difference, or any difference in a non-float leaf, is infinitely far.
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
            same = bool(torch.equal(got, want))
            ok &= same
            worst_abs = worst_rel = max(worst_abs, 0.0 if same else float("inf"))
            continue
        got, want = got.double(), want.double()
        diff = (got - want).abs()
        scale = float(want.abs().max())
        largest = float(diff.max())  # NaN when either side has NaN: then nothing passes
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
