"""A plain torch model (no qkan) whose forward reads a value back to the host: whole-model
capture must fail, and the fallback must find the graph-safe blocks by itself."""

import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(x)
        if h.mean().item() > 1e9:  # a host sync no graph can hold
            h = h * 0
        return self.head(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Gated()
