"""The one comparison of outputs, and the self-tests a load runs with it.

A load compares twice: eager outputs on this host against the build-time references (is
this the model that was built?), and replayed outputs against eager outputs on the same
device (is the captured graph right?). Tolerances say how far each may drift.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import SelfTestError
from ._options import Tolerance


def compare(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
            tolerance: Tolerance) -> tuple[float, bool]:
    """Largest absolute difference over all leaves, and whether all are within tolerance.

    A shape or dtype difference, or any difference in a non-float leaf, is infinitely far.
    """
    rtol, atol = tolerance
    worst, ok = 0.0, True
    for got, want in zip(actual, expected, strict=True):
        got = got.detach().to("cpu")
        want = want.detach().to("cpu")
        if got.shape != want.shape or got.dtype != want.dtype:
            return float("inf"), False
        if not got.is_floating_point():
            same = bool(torch.equal(got, want))
            ok &= same
            worst = max(worst, 0.0 if same else float("inf"))
            continue
        diff = (got.double() - want.double()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok &= bool(torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol))
    return worst, ok


def check_outputs(label: str, compared: str, got: Sequence[torch.Tensor],
                  want: Sequence[torch.Tensor], tolerance: Tolerance, hint: str) -> float:
    """``compare``, raising ``SelfTestError`` when outside tolerance; the worst difference."""
    error, ok = compare(got, want, tolerance)
    if not ok:
        raise SelfTestError(shape=label, compared=compared, max_abs=error, tolerance=tolerance,
                            hint=hint)
    return error
