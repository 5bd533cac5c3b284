"""A model whose forward syncs with the host (``.item()``): whole-model capture must fail,
so ``--capture auto`` falls back to graphing only its QKAN block."""

from __future__ import annotations

import torch
from qkan import QKAN
from torch import nn


class ItemModel(nn.Module):
    def __init__(self, solver: str, device: str) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4, device=device)
        self.qkan = QKAN([4, 4], reps=2, solver=solver, device=device, seed=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        peak = x.abs().max().item()  # host sync: not capturable
        return self.qkan(self.proj(x) / (1.0 + peak))


def build_model(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    return ItemModel("flash" if torch.device(device).type == "cuda" else "exact", device)
