"""A forward that returns its input, a parameter, a buffer and a view of the input: the
predictor must hand out copies, never tensors it or the caller still hold."""

from __future__ import annotations

import torch
from torch import nn


class Aliasing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.register_buffer("offset", torch.tensor([0.5, -0.5]))

    def forward(self, x: torch.Tensor) -> tuple:
        return x, self.weight, self.offset, x[:, 0], x * self.weight + self.offset


def build_model() -> nn.Module:
    return Aliasing()
