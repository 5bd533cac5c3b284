"""qkan's own model classes behind one factory, for round-trip tests on the CPU.

``kind`` picks QKAN (any QKAN keyword passes through, e.g. ``is_batchnorm``), KAN or
FourierKAN; every one is small and deterministically initialised.
"""

from __future__ import annotations

from typing import Any

import torch


def build_model(kind: str = "qkan", width: list[int] | None = None, **options: Any) -> torch.nn.Module:
    from qkan import KAN, QKAN, FourierKAN

    width = list(width or [2, 3, 2])
    if kind == "qkan":
        return QKAN(width=width, solver="exact", seed=0, **{"reps": 1, **options})
    if kind == "kan":
        return KAN(width, seed=0, **options)
    if kind == "fourier":
        return FourierKAN(width, seed=0, **options)
    raise ValueError(f"unknown kind {kind!r}: use qkan, kan or fourier")
