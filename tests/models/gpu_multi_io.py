"""Two inputs, a dict output holding a tuple: the manifest's structured I/O on the GPU."""

from __future__ import annotations

import torch
from qkan import QKAN
from torch import nn


class TwoInputs(nn.Module):
    def __init__(self, solver: str, device: str) -> None:
        super().__init__()
        self.qkan = QKAN([3, 4, 3], reps=2, solver=solver, device=device, seed=0)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict:
        y = self.qkan(a) * b
        return {"y": y, "parts": (y.sum(dim=1), a + b)}


def build_model(device: str = "cpu") -> nn.Module:
    return TwoInputs("flash" if torch.device(device).type == "cuda" else "exact", device)
