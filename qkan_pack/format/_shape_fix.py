"""How to run a call whose shapes no entry of an artifact takes: the fix a shape refusal
ends with (``InputError``'s ``given``, ``largest_batch``, ``pad_inputs``, ``by_name``).

Three fixes, from the manifest alone: a batch with more rows than the largest declared one
that otherwise fits is split; a call no larger than a declared entry, smaller only along
dimensions in which the declared shapes differ, can be padded into it once the artifact is
built with ``--pad`` (which proves the model ignores padded positions, or refuses); anything
else is declared at build. The predictor and serve refuse with the same fields.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._constants import MAX_DIM, MAX_RANK
from ._grammar import Shape
from ._manifest import Manifest
from ._padding import Padding

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

Entry = Sequence[Shape]


def shape_fix(manifest: Manifest, call: Sequence[Shape]) -> dict[str, Any]:
    """``InputError`` keyword arguments for a call of input shapes ``call`` (declared input
    order) that fits no entry; none for a call no build could declare (a 0-d input, a
    zero-size or oversized dimension), nor for one whose inputs have the declared rank but
    for some (a batch dimension left off one input: a mistake in the call, not a shape to
    declare)."""
    names = manifest.input_names
    entries = [[tuple(shape) for _, shape in entry.inputs] for entry in manifest.shapes]
    call = [tuple(shape) for shape in call]
    if len(call) != len(names) or not all(
            shape and len(shape) <= MAX_RANK and all(0 < d <= MAX_DIM for d in shape)
            for shape in call) or _mixed_ranks(call, entries):
        return {}
    largest = _largest_batch(call, entries, names, manifest.padding)
    paddable = (manifest.padding is None and largest is None
                and _paddable(call, entries, _varying(entries)))
    return {"given": dict(zip(names, call)), "largest_batch": largest,
            "pad_inputs": _padded_inputs(entries, names) if paddable else (),
            "by_name": manifest.call == "keyword"}


def _mixed_ranks(call: Sequence[Shape], entries: Sequence[Entry]) -> bool:
    """Whether some inputs of the call have a rank that a declared entry gives them and
    others one that none does."""
    declared = [any(len(shape) == len(entry[i]) for entry in entries)
                for i, shape in enumerate(call)]
    return any(declared) and not all(declared)


def _largest_batch(call: Sequence[Shape], entries: Sequence[Entry], names: Sequence[str],
                   padding: Padding | None) -> int | None:
    """The largest batch (first dimension of every input) among the entries the call fits
    but for its batch, when the call has more rows than it; else None."""
    rows = {shape[0] for shape in call if shape}
    if len(rows) != 1 or any(not shape for shape in call):
        return None
    batches = [entry[0][0] for entry in entries if _fits_but_batch(call, entry, names, padding)]
    return max(batches) if batches and rows.pop() > max(batches) else None


def _fits_but_batch(call: Sequence[Shape], entry: Entry, names: Sequence[str],
                    padding: Padding | None) -> bool:
    for name, got, have in zip(names, call, entry):
        if len(got) != len(have) or have[0] != entry[0][0]:
            return False
        for dim in range(1, len(got)):
            padded = padding is not None and padding.axis_of(name, dim) is not None
            if got[dim] > have[dim] if padded else got[dim] != have[dim]:
                return False
    return True


def _varying(entries: Sequence[Entry]) -> set[tuple[int, int]]:
    """(input index, dim) pairs whose size differs between declared entries: the dims
    ``--pad`` would make paddable (``find_axes``)."""
    return {(i, d) for i, shape in enumerate(entries[0]) for d in range(len(shape))
            if len({len(e[i]) for e in entries}) > 1 or len({e[i][d] for e in entries}) > 1}


def _paddable(call: Sequence[Shape], entries: Sequence[Entry],
              varying: set[tuple[int, int]]) -> bool:
    """Whether some entry holds the call, larger only along dims that vary between entries."""
    def holds(entry: Entry) -> bool:
        return all(len(got) == len(have) and all(
            g == h or ((i, d) in varying and 0 < g < h) for d, (g, h) in enumerate(zip(got, have)))
            for i, (got, have) in enumerate(zip(call, entry)))

    return any(holds(entry) for entry in entries)


def _padded_inputs(entries: Sequence[Entry], names: Sequence[str]) -> tuple[str, ...]:
    """The inputs ``--pad`` must name: every input whose shape varies between entries."""
    varying = {i for i, _ in _varying(entries)}
    return tuple(name for i, name in enumerate(names) if i in varying)
