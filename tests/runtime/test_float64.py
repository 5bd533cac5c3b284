"""The model in float64 (``runtime._float64``): a run counts as float64 throughout only where
no op computes below its inputs' precision."""

from __future__ import annotations

import torch
from torch import nn

from qkan_pack.runtime._float64 import float64_forward, float64_throughout


class _Cast(nn.Module):
    """A linear layer whose product runs in ``dtype`` whatever the parameters' dtype."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.linear, self.dtype = nn.Linear(4, 3), dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype is None:
            return self.linear(x) * torch.tensor(0.5)  # a float32 constant narrows nothing
        narrow = nn.functional.linear(x.to(self.dtype), self.linear.weight.to(self.dtype))
        return narrow.real.double() if narrow.is_complex() else narrow.double()


def _throughout(dtype: torch.dtype | None) -> list[torch.Tensor] | None:
    forward = float64_forward(_Cast(dtype), ["x"], "positional")
    assert forward is not None
    return float64_throughout(forward, [torch.randn(2, 4)])


def test_a_float64_run_is_kept() -> None:
    outputs = _throughout(None)
    assert outputs is not None and outputs[0].dtype == torch.float64


def test_a_run_that_narrows_to_float32_or_complex64_is_not() -> None:
    assert _throughout(torch.float32) is None
    assert _throughout(torch.complex64) is None
