"""Two inputs of different dtypes and a nested dict/tuple/list output (Python API only)."""

from __future__ import annotations

import torch
from torch import nn


class MultiIO(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(3, 3)
        self.table = nn.Embedding(8, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict:
        y = self.proj(a) + self.table(b).sum(dim=1)
        return {"y": y, "parts": (y.sum(dim=1), [a * 2.0, b + 1])}


def build_model() -> nn.Module:
    return MultiIO()
