"""The channel scales build's row proof and precision gate measure a batch of 1-3 against.

Why: the row proof and the precision gate hold each output channel (its last axis, and
its second at rank 3 or more) to its own scale where channels' scales differ widely: beside
a column 1e5 larger, a column that is wholly wrong is a share of the whole output's scale no
bound sees. A channel's scale is its largest magnitude, and one row shows none (a logit near
zero in a batch of one is no small channel): where a compared output has fewer than
``CHANNEL_MIN_ROWS`` values per channel, its scale is taken over more outputs of the same
declared shape: its reference, its ``--calibration`` samples (the user's data) and, while
those are too few, more draws of its inputs (within ``--input-range`` or from
``example_input``). Never over other shapes' outputs, whose scale may follow a length that
differs (``runtime.ChannelPool``). The padding proof compares calls cut to other sizes, so
it has no such pool: it measures per channel where the cut call shows the scales itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from ..runtime import CHANNEL_MIN_ROWS, ChannelPool, describe
from ._padding import Reference

#: Internal to ``qkan_pack.builder``: the package exports nothing from this module.
__all__: list[str] = []

#: One ``--calibration`` sample: the entry it fits and its inputs (declared order).
Calibration = tuple[int, list[torch.Tensor]]


def pool_channels(references: Sequence[Reference], calibration: Sequence[Calibration],
                  draw: Callable[[int, int], list[torch.Tensor]],
                  outputs: Callable[[int, list[torch.Tensor]], list[torch.Tensor]],
                  ) -> tuple[tuple[ChannelPool, ...], list[str]]:
    """Per entry, a pool of its outputs' channel scales: the reference's, the calibration
    samples' (while short of ``CHANNEL_MIN_ROWS`` values per channel), then those of
    ``draw(entry, n)`` (n = 1, 2, ...) run through ``outputs(entry, inputs)``; and notes
    for the entries the pool stays short for (the model fails on the draws)."""
    pools, notes = [], []
    for index, reference in enumerate(references):
        pool = ChannelPool()
        pool.add(reference.outputs)
        for entry, sample in calibration:
            if entry == index and pool.short():
                _add_run(pool, partial(outputs, index, sample))
        for number in range(1, CHANNEL_MIN_ROWS):
            if not pool.short():
                break
            problem = _add_run(pool, partial(_drawn, draw, outputs, index, number))
            if problem is not None:
                notes.append(_unmeasured(reference, problem))
                break
        pools.append(pool)
    return tuple(pools), notes


def _drawn(draw: Callable[[int, int], list[torch.Tensor]],
           outputs: Callable[[int, list[torch.Tensor]], list[torch.Tensor]], index: int,
           number: int) -> list[torch.Tensor]:
    return outputs(index, draw(index, number))


def _add_run(pool: ChannelPool, run: Callable[[], list[torch.Tensor]]) -> str | None:
    """Fold ``run()``'s outputs into ``pool``; why not, in words, where the model fails (a
    calibration sample's failure is the precision gate's to report, by the file's name)."""
    try:
        pool.add(run())
    except Exception as exc:  # the model's own code, on inputs it was not given
        return describe(exc)
    return None


def _unmeasured(reference: Reference, problem: str) -> str:
    return (f"shape {reference.entry.label}: its outputs' channels are measured against each "
            f"output's whole scale, not their own: {CHANNEL_MIN_ROWS} values show a channel's "
            f"scale, an output of this shape holds fewer per channel, and the model fails on "
            f"other inputs drawn for it ({problem}); set --input-range (or example_input) to "
            "inputs it takes, or with --precision give --calibration samples of this shape")
