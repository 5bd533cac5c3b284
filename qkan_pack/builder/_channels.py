"""The channel scales build's proofs and precision gate measure against.

Why: the padding proof, the row proof and the precision gate hold each output channel (its
last axis, and its second at rank 3 or more) to its own scale where channels' scales differ
widely: beside a column 1e5 larger, a column that is wholly wrong is a share of the whole
output's scale no bound sees. A channel's scale is its largest magnitude, and one row shows
none (a logit near zero in a batch of one is no small channel): so each declared entry's
scales are taken over its reference and, where that holds fewer than ``CHANNEL_MIN_ROWS``
values per channel, over more draws of the same entry's inputs, which the gate measures
too. Never over other entries: an output's scale may follow a dimension that differs
between them (a sum over a longer sequence), and another entry's larger scale would hide
this one's channel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..runtime import CHANNEL_MIN_ROWS, ChannelPool, describe
from ._padding import Reference
from ._precision import GateSample

#: Internal to ``qkan_pack.builder``: the package exports nothing from this module.
__all__: list[str] = []


def pool_channels(references: Sequence[Reference],
                  draw: Callable[[int, int], list[torch.Tensor]],
                  outputs: Callable[[int, list[torch.Tensor]], list[torch.Tensor]],
                  ) -> tuple[tuple[ChannelPool, ...], tuple[GateSample, ...], list[str]]:
    """Per entry, its outputs' channel scales over its reference and, while some channel
    has fewer than ``CHANNEL_MIN_ROWS`` values, over ``draw(entry, n)`` (n = 1, 2, ...) run
    through ``outputs(entry, inputs)``; those draws as gate samples; and notes for the
    entries whose draws the model cannot run (their channels are then measured against
    each output's whole scale, as a reference alone allows)."""
    pools, draws, notes = [], [], []
    for index, reference in enumerate(references):
        pool = ChannelPool()
        pool.add(reference.outputs)
        for number in range(1, CHANNEL_MIN_ROWS):
            if not pool.short():
                break
            try:
                drawn = draw(index, number)
                flat = outputs(index, drawn)
            except Exception as exc:  # the model's own code, on inputs it was not given
                notes.append(_unmeasured(reference, exc))
                break
            pool.add(flat)
            draws.append(GateSample(index, drawn, flat))
        pools.append(pool)
    return tuple(pools), tuple(draws), notes


def _unmeasured(reference: Reference, exc: BaseException) -> str:
    return (f"shape {reference.entry.label}: its outputs' channels are measured against each "
            f"output's whole scale, not their own: {CHANNEL_MIN_ROWS} rows show a channel's "
            f"scale, the shape has fewer, and the model fails on other inputs drawn for it "
            f"({describe(exc)}); declare a batch of {CHANNEL_MIN_ROWS} or more to measure "
            "them")
