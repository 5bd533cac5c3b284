"""Helper module for ``with_include.py`` (packed into the artifact with ``--include``)."""

from __future__ import annotations

import torch

SCALE = 3.0


def squash(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x)
