"""A small convolutional classifier in plain PyTorch, the kind of model channels-last graphs
are for (docs/precision.md):

    qkan-pack build examples/small_cnn.py --shapes 1x3x32x32,8x3x32x32 --precision auto

The factory seeds its initialisation: a build checks that a second call rebuilds the same
model, as every load will. Trained weights come from ``--weights FILE``.
"""

from __future__ import annotations

import torch
from torch import nn


def _stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(), nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    def __init__(self, classes: int, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(_stage(3, width), _stage(width, 2 * width),
                                      _stage(2 * width, 4 * width))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.head(torch.flatten(pooled, 1))


def build_model(classes: int = 10, width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN(classes, width)
