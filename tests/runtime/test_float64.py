"""The model in float64 (``runtime._float64``): in the row proof's float64 runs, a cast of a
float64 value to a narrower dtype stays float64, and a run that still narrows otherwise (a
copy into a float32 buffer) counts as not float64 throughout."""

from __future__ import annotations

import torch
from torch import nn

from qkan_pack.runtime._float64 import float64_forward, float64_throughout


class _Narrow(nn.Module):
    """A linear layer whose product runs narrower than its parameters: by a cast to ``how``
    (a dtype), or by a copy into a float32 buffer (``how`` None)."""

    def __init__(self, how: torch.dtype | None) -> None:
        super().__init__()
        self.linear, self.how = nn.Linear(4, 3), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how is None:
            buffer = torch.empty(x.shape, dtype=torch.float32)
            x = buffer.copy_(x)
            return nn.functional.linear(x, self.linear.weight.float()) * torch.tensor(0.5)
        narrow = nn.functional.linear(x.to(self.how), self.linear.weight.to(self.how))
        return narrow.real if narrow.is_complex() else narrow


def _throughout(how: torch.dtype | None) -> list[torch.Tensor] | None:
    forward = float64_forward(_Narrow(how), ["x"], "positional")
    assert forward is not None
    return float64_throughout(forward, [torch.randn(2, 4)])


def test_casts_of_float64_values_stay_float64() -> None:
    for how in (torch.float32, torch.bfloat16, torch.complex64):
        outputs = _throughout(how)
        assert outputs is not None and outputs[0].dtype == torch.float64, how


def test_a_copy_into_a_float32_buffer_is_not_float64_throughout() -> None:
    assert _throughout(None) is None
