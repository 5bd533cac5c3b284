"""Ragged batching for artifacts with declared padding (``build --pad``): single rows of
different lengths replay together.

A row (a request of batch one, or without its batch dimension) joins the group of rows with
the same exact dimensions; a group runs as one call: each row padded with the declared pad
values to the longest row of its chunk, the rows stacked, and the predictor pads the stack
into the smallest captured entry that holds it (``format.fit_entry``). Each reply is the
row's own share: its batch slice, cut back to its own sizes along every dimension that
follows a padded axis. Build proved that padding leaves those outputs unchanged, and rows are
grouped only when build also proved every batched entry's rows independent
(``rows_proved``), so a row's answer does not depend on the rows it was batched with; else
each request replays alone, padded by the predictor.

Artifacts without declared padding keep the fixed-shape rows of ``_rows``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..format import (
    DTYPES,
    Manifest,
    Padding,
    Shape,
    accepted_ranges,
    fit_entry,
    format_shape,
    input_batch,
    shape_fix,
)
from ._wire import map_leaves


@dataclass(frozen=True)
class RaggedRow:
    """One row: its arrays (with a batch dimension of one), the exact dims its group shares,
    and its size along each padded axis."""

    arrays: list[np.ndarray]
    key: tuple
    sizes: tuple[int, ...]


class RaggedPlan:
    """What rows and requests an artifact with declared padding takes, and how a group of
    rows becomes one call and its outputs each row's share."""

    def __init__(self, manifest: Manifest) -> None:
        assert manifest.padding is not None
        self.manifest = manifest
        self.padding: Padding = manifest.padding
        self.names = manifest.input_names
        self.entries = [[tuple(s) for _, s in e.inputs] for e in manifest.shapes]
        self.ranges = accepted_ranges(self.entries, self.names,
                                      [d.dtype for d in manifest.inputs], self.padding)
        self.batch_axis = self.padding.axis_of(self.names[0], 0)
        self.max_rows = max(e[0][0] for e in self.entries) if self.batch_axis is not None else 1
        #: Whether rows of different requests may share a call: every entry of two rows or
        #: more proved row-independent at build.
        self.rows_proved = all(e.batches_rows for e in manifest.shapes
                               if (input_batch(e) or 0) >= 2)
        self._pad = [self._pad_value(d.name, d.dtype) for d in manifest.inputs]
        self._ranks = [len(s) for s in self.entries[0]]

    def _pad_value(self, name: str, dtype: str) -> Any:
        value = self.padding.values.get(name, 0)
        if dtype == "bfloat16":  # host arrays hold bfloat16's raw bits
            return bfloat16_bits(value)
        return np.array(value, dtype=DTYPES[dtype].wire).item()

    # -- requests --------------------------------------------------------------------

    def entry(self, shapes: Sequence[Shape]) -> int | None:
        """The entry a whole request of ``shapes`` pads into, or None when it fits none."""
        found = fit_entry(list(shapes), self.entries, self.names, self.padding)
        return None if found is None else found[0]

    def row(self, arrays: Sequence[np.ndarray]) -> tuple[RaggedRow, bool] | None:
        """The request as one row (and whether it came without its batch dimension), or None
        when it is not a single row that fits a captured entry."""
        if self.batch_axis is None:
            return None
        squeezed = all(a.ndim == rank - 1 for a, rank in zip(arrays, self._ranks))
        if squeezed:
            arrays = [a[None] for a in arrays]
        elif not all(a.ndim == rank and a.shape[0] == 1 for a, rank in zip(arrays, self._ranks)):
            return None
        shapes = [tuple(a.shape) for a in arrays]
        found = fit_entry(shapes, self.entries, self.names, self.padding)
        if found is None:
            return None
        key = tuple((n, d, size) for n, shape in zip(self.names, shapes)
                    for d, size in enumerate(shape) if self.padding.axis_of(n, d) is None)
        return RaggedRow(list(arrays), key, found[1]), squeezed

    def refuse(self, shapes: Sequence[Shape]) -> InputError:
        shown = ", ".join(format_shape(s) or "scalar" for s in shapes)
        return InputError(f"input shape {shown} fits no captured shape, even padded (single "
                          "rows of any size that fits are batched together)", ranges=self.ranges,
                          **shape_fix(self.manifest, shapes))

    # -- groups ----------------------------------------------------------------------

    def chunks(self, rows: Sequence[RaggedRow]) -> list[tuple[list[int], int | None]]:
        """Row indices per call, with the entry the call pads into: rows of one key, at most
        ``max_rows`` a call, split again where a chunk fits no entry (long rows may only fit
        the smaller batches). A single row always fits (``row`` checked it)."""
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.key, []).append(i)
        calls: list[tuple[list[int], int | None]] = []
        for members in groups.values():
            members.sort(key=lambda i: rows[i].sizes)  # similar lengths pad least together
            pending = [members[s:s + self.max_rows] for s in range(0, len(members), self.max_rows)]
            while pending:
                chunk = pending.pop()
                entry = self.entry_of([rows[i] for i in chunk])
                if entry is not None or len(chunk) == 1:
                    calls.append((chunk, entry))
                else:
                    half = len(chunk) // 2
                    pending += [chunk[:half], chunk[half:]]
        return calls

    def entry_of(self, rows: Sequence[RaggedRow]) -> int | None:
        """The entry the stack of ``rows`` pads into (``format.fit_entry``), or None."""
        shapes = [self._padded_shape(rows, position) for position in range(len(self.names))]
        found = fit_entry(shapes, self.entries, self.names, self.padding)
        return None if found is None else found[0]

    def _padded_shape(self, rows: Sequence[RaggedRow], position: int) -> Shape:
        name = self.names[position]
        shape = list(rows[0].arrays[position].shape)
        shape[0] = len(rows)
        for dim in range(1, len(shape)):
            if self.padding.axis_of(name, dim) is not None:
                shape[dim] = max(row.arrays[position].shape[dim] for row in rows)
        return tuple(shape)

    def stack(self, rows: Sequence[RaggedRow]) -> list[np.ndarray]:
        """The rows as one call: each padded to the chunk's longest along every padded axis."""
        stacked = []
        for position, value in enumerate(self._pad):
            shape = self._padded_shape(rows, position)
            if all(row.arrays[position].shape[1:] == shape[1:] for row in rows):
                parts = [row.arrays[position] for row in rows]
                stacked.append(np.concatenate(parts) if len(parts) > 1 else parts[0])
                continue
            out = np.full(shape, value, dtype=rows[0].arrays[position].dtype)
            for j, row in enumerate(rows):
                part = row.arrays[position]
                region = (slice(j, j + 1), *(slice(0, n) for n in part.shape[1:]))
                out[region] = part  # (a tuple first: mypy misreads a starred subscript)
            stacked.append(out)
        return stacked

    def share(self, outputs: Any, j: int, row: RaggedRow, squeezed: bool = False) -> Any:
        """Row ``j``'s own outputs: its batch slice, cut to its own sizes. ``squeezed`` (a
        row sent without its batch dimension) drops the dimension that follows the batch,
        wherever the model puts it (a sequence-first output has it in dim 1); an output
        that does not follow the batch is the row's whole."""
        cuts: dict[int, dict[int, slice | int]] = {}
        for index, (axis, size) in enumerate(zip(self.padding.axes, row.sizes)):
            for leaf, dim in axis.outputs:
                if index == self.batch_axis:
                    cut: slice | int = j if squeezed else slice(j, j + 1)
                else:
                    cut = slice(0, size)
                cuts.setdefault(leaf, {})[dim] = cut
        counter = itertools.count()

        def one(leaf: Any) -> Any:
            index = next(counter)
            dims = cuts.get(index)
            if not dims:
                return leaf
            # the trailing Ellipsis keeps a 0-d share an array (a numpy scalar would lose
            # its array type, and the handle could not give it back as a tensor)
            region = (*(dims.get(d, slice(None)) for d in range(max(dims) + 1)), Ellipsis)
            # a row's own copy: a view would carry every other row of the batch with it
            return leaf[region].copy() if isinstance(leaf, np.ndarray) else leaf[region].clone()

        return map_leaves(one, outputs)


def bfloat16_bits(value: float) -> int:
    """``value`` as bfloat16's raw 16 bits, rounded to nearest even as torch rounds it: the
    predictor fills the rest of an entry with torch's rounding, and build proved padding
    with it (truncating the float32 bits gives another value, 0x3dcc for 0.1 where torch
    has 0x3dcd)."""
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
