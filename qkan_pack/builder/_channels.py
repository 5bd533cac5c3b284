"""The channel scales build's proofs and precision gate measure against.

Why: the padding proof, the row proof and the precision gate hold each output channel (its
last axis, and its second at rank 3 or more) to its own scale where channels' scales differ
widely: beside a column 1e5 larger, a column that is wholly wrong is a share of the whole
output's scale no bound sees. A channel's scale is its largest magnitude, and one row shows
none (a logit near zero in a batch of one is no small channel): so the scales are pooled
over every declared shape's reference (``runtime.ChannelPool``), and where an entry's
outputs hold fewer than ``CHANNEL_MIN_ROWS`` values per channel, over more draws of its
inputs, which the gate measures too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..runtime import CHANNEL_MIN_ROWS, ChannelPool
from ._padding import Reference
from ._precision import GateSample

#: Internal to ``qkan_pack.builder``: the package exports nothing from this module.
__all__: list[str] = []


def pool_channels(references: Sequence[Reference],
                  draw: Callable[[int, int], list[torch.Tensor]],
                  outputs: Callable[[int, list[torch.Tensor]], list[torch.Tensor]],
                  ) -> tuple[ChannelPool, tuple[GateSample, ...]]:
    """Each output's channel scales over ``references`` and, while some channel has fewer
    than ``CHANNEL_MIN_ROWS`` values, over ``draw(entry, n)`` (n = 1, 2, ...) of the
    entries whose own outputs are that short, run through ``outputs(entry, inputs)``; with
    those draws as gate samples."""
    pool, draws = ChannelPool(), []
    for reference in references:
        pool.add(reference.outputs)
    short = [index for index, reference in enumerate(references)
             if _rows_short(reference.outputs)]
    for number in range(1, CHANNEL_MIN_ROWS):
        if not pool.short():
            break
        for index in short:
            drawn = draw(index, number)
            flat = outputs(index, drawn)
            pool.add(flat)
            draws.append(GateSample(index, drawn, flat))
    return pool, tuple(draws)


def _rows_short(outputs: Sequence[torch.Tensor]) -> bool:
    alone = ChannelPool()
    alone.add(outputs)
    return alone.short()
