"""A plain PyTorch model, no qkan: all qkan-pack needs is a file with a factory.

    qkan-pack build examples/plain_mlp.py --shapes 1x4,32x4

The factory seeds its initialisation: a build checks that a second call rebuilds the
same model, as every load will. Trained weights come from ``--weights FILE``.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(features, hidden), nn.GELU(),
                                    nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_model(features: int = 4, hidden: int = 32, classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return MLP(features, hidden, classes)
