"""A tiny QKAN whose source leaves a trace whenever it runs, for the tamper tests.

When ``QKAN_PACK_SENTINEL`` names a file, importing this module, calling its factory and
running its forward each append a line there: a tampered artifact must be refused before
any of that happens.
"""

from __future__ import annotations

import os

import torch
from qkan import QKAN


def _trace(what: str) -> None:
    path = os.environ.get("QKAN_PACK_SENTINEL")
    if path:
        with open(path, "a") as handle:
            handle.write(what + "\n")


_trace("import")


class Traced(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkan = QKAN([2, 3, 2], reps=1, solver="exact", seed=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _trace("forward")
        return self.qkan(x)


def build_model() -> torch.nn.Module:
    _trace("build_model")
    return Traced()
