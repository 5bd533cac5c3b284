"""Declared padding: which inputs a call may leave shorter than a captured entry, with which
value they are padded, and which output dimensions follow each padded axis.

An axis is a set of ``(input, dim)`` pairs, at most one per input, that take the same size
in every declared entry (a batch axis: ``input_ids`` dim 0 and ``attention_mask`` dim 0; a
length axis: both dims 1). A call fits an entry when every unpadded dimension equals the
entry's, every padded one is at most the entry's, and the members of an axis agree on their
size; the outputs are then sliced back along the dimensions that follow each axis. Build proves, on the model,
that padding leaves the sliced outputs unchanged (``builder._padding``); everything here is
the torch-free bookkeeping that build, the predictor and serve share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError
from ._constants import DTYPES
from ._grammar import Shape

PadValue = int | float | bool


@dataclass(frozen=True)
class PaddedAxis:
    """One padded axis: the ``(input, dim)`` pairs it sizes, and the ``(output leaf, dim)``
    pairs that follow it (sliced back to the call's size)."""

    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[int, int], ...] = ()

    @property
    def label(self) -> str:
        return ", ".join(f"{name} dim {dim}" for name, dim in self.inputs)


@dataclass(frozen=True)
class Padding:
    """Pad value per padded input, and the axes."""

    values: Mapping[str, PadValue]
    axes: tuple[PaddedAxis, ...]

    def axis_of(self, name: str, dim: int) -> int | None:
        for index, axis in enumerate(self.axes):
            if (name, dim) in axis.inputs:
                return index
        return None


def find_axes(per_shape: Sequence[Mapping[str, Shape]], padded: Sequence[str]
              ) -> tuple[tuple[PaddedAxis, ...], list[str]]:
    """The padded axes of declared entries (each a ``{name: shape}``): the dims of the padded
    inputs in which entries differ, grouped by their sizes across entries. Also returns the
    problems that forbid padding: an unpadded input that varies with an axis (it would have
    to be padded too), or a padded input that varies in no dimension."""
    sizes: dict[tuple[int, ...], list[tuple[str, int]]] = {}
    problems = []
    for name in padded:
        rank = len(per_shape[0][name])
        varying = [d for d in range(rank) if len({s[name][d] for s in per_shape}) > 1]
        if not varying:
            problems.append(f"{name} has one shape in every declared entry: there is nothing to "
                            "pad (declare several sizes, e.g. --batch-sizes or several lengths)")
        for dim in varying:
            sizes.setdefault(tuple(s[name][dim] for s in per_shape), []).append((name, dim))
    for name in per_shape[0]:
        if name in padded:
            continue
        for dim in range(len(per_shape[0][name])):
            vector = tuple(s[name][dim] for s in per_shape)
            if vector in sizes and len(set(vector)) > 1:
                problems.append(f"{name} dim {dim} varies with {sizes[vector][0][0]} dim "
                                f"{sizes[vector][0][1]} but has no pad value: pad it too "
                                f"(--pad {name}=VALUE)")
    axes = tuple(PaddedAxis(tuple(members)) for group in sizes.values()
                 for members in _split_by_input(group))
    return axes, problems


def _split_by_input(group: Sequence[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """Dims that share their sizes across entries, as axes: one input's dims are never one
    axis (an image's height and width vary apart even when every entry is square), so the
    k-th such dim of each input goes to the k-th axis (``pixel_values`` dim 2 with
    ``pixel_mask`` dim 1, dim 3 with dim 2)."""
    axes: list[list[tuple[str, int]]] = []
    seen: dict[str, int] = {}
    for name, dim in group:
        k = seen.get(name, 0)
        seen[name] = k + 1
        if k == len(axes):
            axes.append([])
        axes[k].append((name, dim))
    return axes


def fit_entry(call: Sequence[Shape], entries: Sequence[Sequence[Shape]], names: Sequence[str],
              padding: Padding) -> tuple[int, tuple[int, ...]] | None:
    """The entry a call of input shapes ``call`` pads into, and each axis's size in the call;
    None when it fits none. The smallest fit wins: fewest padded elements, ties to the
    smaller first dimension (the batch), then manifest order."""
    best: tuple[tuple[int, int, int], int, tuple[int, ...]] | None = None
    for index, entry in enumerate(entries):
        sizes = _axis_sizes(call, entry, names, padding)
        if sizes is None:
            continue
        waste = sum(math.prod(e) - math.prod(c) for e, c in zip(entry, call))
        first = entry[0][0] if entry[0] else 0
        key = (waste, first, index)
        if best is None or key < best[0]:
            best = (key, index, sizes)
    return None if best is None else (best[1], best[2])


def _axis_sizes(call: Sequence[Shape], entry: Sequence[Shape], names: Sequence[str],
                padding: Padding) -> tuple[int, ...] | None:
    sizes: list[int | None] = [None] * len(padding.axes)
    for name, got, have in zip(names, call, entry):
        if len(got) != len(have):
            return None
        for dim, (g, h) in enumerate(zip(got, have)):
            axis = padding.axis_of(name, dim)
            if axis is None:
                if g != h:
                    return None
                continue
            if not 0 < g <= h or sizes[axis] not in (None, g):
                return None
            sizes[axis] = g
    return tuple(s if s is not None else 0 for s in sizes)


def accepted_ranges(entries: Sequence[Sequence[Shape]], names: Sequence[str],
                    dtypes: Sequence[str], padding: Padding) -> list[dict[str, Any]]:
    """Per entry, what a call may send: per input its dtype and, per dimension, the
    inclusive ``[low, high]`` range (``low == high`` where the dimension is exact)."""
    ranges = []
    for entry in entries:
        ranges.append({name: {"dtype": dtype, "dims": [
            [1 if padding.axis_of(name, d) is not None else size, size]
            for d, size in enumerate(shape)]}
            for name, shape, dtype in zip(names, entry, dtypes)})
    return ranges


def padding_to_dict(padding: Padding) -> dict[str, Any]:
    return {"values": dict(padding.values),
            "axes": [{"inputs": [[n, d] for n, d in axis.inputs],
                      "outputs": [[leaf, d] for leaf, d in axis.outputs]}
                     for axis in padding.axes]}


def padding_from(raw: Any, inputs: Mapping[str, str], ranks: Mapping[str, int],
                 leaf_ranks: Sequence[int], where: str = "manifest.padding") -> Padding | None:
    """Parse ``manifest.padding`` against the declared inputs (name -> dtype name), their
    ranks and the output leaves' ranks; absent is None (no padding declared)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"values", "axes"}:
        raise ManifestError(f"{where} must be an object with values and axes")
    values, axes = raw["values"], raw["axes"]
    if not isinstance(values, dict) or not values or not isinstance(axes, list) or not axes:
        raise ManifestError(f"{where}: values must be a non-empty object, axes a non-empty list")
    for name, value in values.items():
        if name not in inputs:
            raise ManifestError(f"{where}.values: {name!r} is not an input")
        check_pad_value(value, inputs[name], f"{where}.values.{name}", ManifestError)
    parsed, seen = [], set()
    for index, axis in enumerate(axes):
        here = f"{where}.axes[{index}]"
        if not isinstance(axis, dict) or set(axis) != {"inputs", "outputs"}:
            raise ManifestError(f"{here} must be an object with inputs and outputs")
        members = _pairs(axis["inputs"], here + ".inputs")
        followers = _pairs(axis["outputs"], here + ".outputs")
        if not members:
            raise ManifestError(f"{here}.inputs is empty")
        for name, dim in members:
            if name not in values or not 0 <= dim < ranks.get(name, 0) or (name, dim) in seen:
                raise ManifestError(f"{here}: ({name!r}, {dim}) is not a padded input's "
                                    "dimension, or is listed twice")
            seen.add((name, dim))
        for leaf, dim in followers:
            if not isinstance(leaf, int) or not 0 <= leaf < len(leaf_ranks) \
                    or not 0 <= dim < leaf_ranks[leaf]:
                raise ManifestError(f"{here}.outputs: ({leaf!r}, {dim}) is not an output "
                                    "dimension")
        parsed.append(PaddedAxis(tuple((str(n), d) for n, d in members),
                                 tuple((int(leaf), d) for leaf, d in followers)))
    return Padding(values=dict(values), axes=tuple(parsed))


def _pairs(value: Any, where: str) -> list[tuple[Any, int]]:
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and type(p[1]) is int for p in value):
        raise ManifestError(f"{where} must be a list of [name or index, dim] pairs")
    return [(p[0], p[1]) for p in value]


#: The integers a float input's pad value may be written as: torch fills a buffer from a
#: Python int through a 64-bit integer, and refuses (OverflowError) one beyond it.
_FLOAT_PAD_INTS = (-(2**63), 2**63 - 1)


def check_pad_value(value: Any, dtype: str, where: str, error: type[Exception]) -> None:
    """A pad value fits its input's dtype (a manifest dtype name): a bool for bool inputs,
    an integer within the dtype's range for integer ones, a finite number within the
    dtype's largest for floats (an integer one within 64 bits, which torch fills a float
    buffer from). torch would refuse any other value only when the first padded call fills a
    buffer with it (or round it to infinity)."""
    spec = DTYPES[dtype]
    limits = spec.int_limits
    if spec.kind == "bool":
        ok = isinstance(value, bool)
    elif limits is not None:
        ok = type(value) is int and limits[0] <= value <= limits[1]
    else:
        ok = (type(value) is int or (type(value) is float and math.isfinite(value))) \
            and abs(value) <= (spec.largest or math.inf)  # an int beyond floats is no float
        if ok and type(value) is int and not _FLOAT_PAD_INTS[0] <= value <= _FLOAT_PAD_INTS[1]:
            raise error(f"{where}: pad value {value} is an integer beyond 64 bits, which "
                        f"torch cannot fill a {dtype} input with: write it as a float "
                        f"({float(value):g})")
    if not ok:
        expected = ("true or false" if spec.kind == "bool"
                    else f"an integer from {limits[0]} to {limits[1]}" if limits is not None
                    else f"a finite number within ±{spec.largest:g}")
        raise error(f"{where}: pad value {value!r} must be {expected} ({dtype})")


def describe_axes(padding: Padding, entries: Sequence[Sequence[Shape]],
                  names: Sequence[str]) -> list[str]:
    """Each axis as a person reads it: ``input_ids dim 1, attention_mask dim 1: 32, 128``."""
    lines = []
    for axis in padding.axes:
        name, dim = axis.inputs[0]
        position = list(names).index(name)
        sizes = sorted({entry[position][dim] for entry in entries})
        lines.append(f"{axis.label}: {', '.join(map(str, sizes))}")
    return lines
