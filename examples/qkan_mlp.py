"""A QKAN regressor/classifier: the smallest launch-bound model qkan-pack ships.

    qkan-pack build examples/qkan_mlp.py --shapes 1x2,64x2
    qkan-pack build examples/qkan_mlp.py --shapes 1x64,256x64 --config width=[64,64,64] --config reps=3

The factory takes ``device``: qkan-pack passes the target device at build (cpu) and at
load, so one artifact uses qkan's exact solver on a CPU host and the Triton ``flash``
solver on a GPU host. Pin a solver with ``--config solver=exact``.
"""

from __future__ import annotations

import torch
from qkan import QKAN


def build_model(width: list[int] | None = None, reps: int = 2, solver: str | None = None,
                seed: int = 0, device: str = "cpu") -> torch.nn.Module:
    """QKAN over ``width`` (default [2, 8, 2]) with a deterministic initialisation."""
    on_gpu = torch.device(device).type == "cuda"
    return QKAN(
        width=list(width or [2, 8, 2]),
        reps=reps,
        solver=solver or ("flash" if on_gpu else "exact"),
        device=device,
        seed=seed,
    )
