"""A plain MLP whose factory leaves a weak reference to each model it builds, so a test can
tell whether a failed load let go of its model (and so of its weights and graphs)."""

from __future__ import annotations

import sys
import types
import weakref

import torch
from torch import nn

PROBE = "_qkan_pack_model_probe"


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    probe = sys.modules.setdefault(PROBE, types.ModuleType(PROBE))
    probe.__dict__.setdefault("models", []).append(weakref.ref(model))
    return model
