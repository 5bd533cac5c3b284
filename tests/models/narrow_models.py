"""Models whose float64 copy still computes in float32 or returns half precision: build's
float64 run measures nothing about their rounding."""

import torch
import torch.nn.functional as F
from torch import nn


class CastEverything(nn.Module):
    """A linear read-out of a long feature vector computed in float32 whatever the parameters'
    dtype (operands cast with ``.float()``, as a model storing its weights in bfloat16 does)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.linear.weight.float(), self.linear.bias.float())


class HalfLogits(nn.Module):
    """An MLP returning its logits in bfloat16 (half the bytes on the wire)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).to(torch.bfloat16)


def build_model(kind: str, features: int = 64) -> nn.Module:
    torch.manual_seed(0)
    return CastEverything(features) if kind == "cast_everything" else HalfLogits()
