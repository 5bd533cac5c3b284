"""A plain MLP whose factory leaves a weak reference to each model it builds, so a test can
tell whether a failed load let go of its model (and so of its weights and graphs).

With ``QKAN_PACK_PROBE_FAIL=1`` its forward fails the way a failed CUDA capture does: the
error that carries the model's frames is only the ``__context__`` of one raised ``from``
another (torch's ``capture_end`` failing in ``__exit__`` after the model raised).
"""

from __future__ import annotations

import os
import sys
import types
import weakref

import torch
from torch import nn

PROBE = "_qkan_pack_model_probe"


class Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.environ.get("QKAN_PACK_PROBE_FAIL") != "1":
            return self.body(x)
        try:
            self._sync(x)
        except RuntimeError:
            raise RuntimeError("capture invalidated") from OSError("the driver's own error")
        return x

    def _sync(self, x: torch.Tensor) -> None:
        model = self  # noqa: F841 - the local a kept error would pin
        raise RuntimeError("operation not permitted when stream is capturing")


def build_model() -> nn.Module:
    torch.manual_seed(0)
    model = Probe()
    probe = sys.modules.setdefault(PROBE, types.ModuleType(PROBE))
    probe.__dict__.setdefault("models", []).append(weakref.ref(model))
    return model
