"""Models whose weights are half precision, as users ship them: a small CNN and an MLP
cast to bfloat16 or float16 in the factory (their own rounding is ~1e-3 of their scale)."""

import torch
from torch import nn


def build_model(dtype: str = "bfloat16", kind: str = "mlp") -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                              nn.Linear(256, 10))
    elif kind == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return model.to(getattr(torch, dtype))
