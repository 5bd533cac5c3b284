"""A plain wide MLP whose largest shape needs about a hundred MiB of activations: capping GPU
memory makes capturing that shape run out of memory (the failed-load memory test)."""

from __future__ import annotations

import torch
from torch import nn


def build_model(width: int = 1024, hidden: int = 4096) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                         nn.GELU(), nn.Linear(hidden, width))
