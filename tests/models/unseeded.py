"""A factory that is not reproducible: state drawn at random without a seed and not saved
with the weights (a non-persistent buffer, or a plain tensor attribute)."""

import torch
from torch import nn


class Offset(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        if kind == "buffer":
            self.register_buffer("offset", torch.randn(4), persistent=False)
        elif kind == "attribute":
            self.offset = torch.randn(4)
        else:
            self.register_buffer("offset", torch.zeros(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.offset


def build_model(kind: str = "buffer") -> nn.Module:
    return Offset(kind)
