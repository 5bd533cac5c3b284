"""A model that imports a local helper module shipped with ``--include tiny_helper.py``."""

from __future__ import annotations

import tiny_helper
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tiny_helper.squash(self.linear(x)) * tiny_helper.SCALE


def build_model() -> nn.Module:
    return Scaled()
