"""A model whose forward takes another path while a CUDA graph captures it: eager outputs
match the build references, replayed ones do not, so the replay self-test must refuse it
(and the failed load must free every graph and its pool)."""

from __future__ import annotations

import torch
from torch import nn


class CaptureDiffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return y * 2.0  # what the graph records
        return y


def build_model() -> nn.Module:
    return CaptureDiffers()
