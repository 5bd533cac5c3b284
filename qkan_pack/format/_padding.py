"""Declared padding: which inputs a call may leave shorter than a captured entry, with which
value they are padded, and which output dimensions follow each padded axis.

An axis is a set of ``(input, dim)`` pairs, at most one per input, that take the same size
in every declared entry (a batch axis: ``input_ids`` dim 0 and ``attention_mask`` dim 0; a
length axis: both dims 1). A call fits an entry when every unpadded dimension equals the
entry's, every padded one is at most the entry's, and the members of an axis agree on their
size; the outputs are then sliced back along the dimensions that follow each axis. Build proves, on the model,
that padding leaves the sliced outputs unchanged (``builder._padding``); everything here is
the torch-free bookkeeping that build, the predictor and serve share, and the checks a read
manifest's padding passes against its entries (``check_padding``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._constants import DTYPES
from ._grammar import Shape
from ._schema import (
    Codec,
    Integer,
    ListOf,
    MapOf,
    Nested,
    Pair,
    Text,
    finite,
    json_field,
    key_path,
    refuse,
    show,
)

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (docs/ARCHITECTURE.md, "Imports").
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PadValue = int | float | bool


class _PadValue(Codec):
    """A pad value as JSON holds it; whether it fits its input's dtype is checked with the
    inputs (``pad_value_problem``)."""

    what = "a number, true or false"

    def accepts(self, value: Any) -> bool:
        return type(value) in (int, float, bool)


@dataclass(frozen=True)
class PaddedAxis:
    """One padded axis: the ``(input, dim)`` pairs it sizes, and the ``(output leaf, dim)``
    pairs that follow it (sliced back to the call's size). A read manifest's axes are checked
    against its inputs and entries by ``check_padding``."""

    inputs: tuple[tuple[str, int], ...] = json_field(
        ListOf(Pair(Text(), Integer(0)), min_len=1))
    outputs: tuple[tuple[int, int], ...] = json_field(
        ListOf(Pair(Integer(0), Integer(0))), default=(), required=True)

    @property
    def label(self) -> str:
        return ", ".join(f"{name} dim {dim}" for name, dim in self.inputs)


@dataclass(frozen=True)
class Padding:
    """Pad value per padded input, and the axes."""

    values: Mapping[str, PadValue] = json_field(MapOf(_PadValue(), min_len=1))
    axes: tuple[PaddedAxis, ...] = json_field(ListOf(Nested(PaddedAxis), min_len=1))

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


def check_padding(padding: Padding, dtypes: Mapping[str, str],
                  entries: Sequence[tuple[Mapping[str, Shape], Sequence[Shape], str]],
                  where: str) -> None:
    """Refuse (``ManifestError`` at its path) read ``padding`` that does not fit the declared
    inputs (name -> dtype) and entries (each: its input shapes by name, its output leaves'
    shapes, its label): values for inputs, within their dtypes; axes of padded inputs'
    dimensions, each once, whose members share their size in each entry; and every output
    dimension said to follow an axis that axis's size in each entry (else a padded call's
    outputs would be cut along a dimension that does not follow it)."""
    for name, value in padding.values.items():
        problem = "is not an input" if name not in dtypes else pad_value_problem(value, dtypes[name])
        if problem:
            refuse(key_path(f"{where}.values", name), problem)
    seen: set[tuple[str, int]] = set()
    for index, axis in enumerate(padding.axes):
        for member, pair in enumerate(axis.inputs):
            if pair[0] not in padding.values or pair in seen:
                refuse(f"{where}.axes[{index}].inputs[{member}]", f"must be a padded input's "
                       f"dimension, each listed once, got {show(list(pair))}")
            seen.add(pair)
        for sizes, leaves, label in entries:
            _check_axis(axis, sizes, leaves, label, f"{where}.axes[{index}]")


def _check_axis(axis: PaddedAxis, sizes: Mapping[str, Shape], leaves: Sequence[Shape], label: str,
                where: str) -> None:
    for member, (name, dim) in enumerate(axis.inputs):
        if dim >= len(sizes[name]):
            refuse(f"{where}.inputs[{member}]", f"names dim {dim} of {name}, which shape {label} "
                                                "does not have")
    if len({sizes[name][dim] for name, dim in axis.inputs}) != 1:
        refuse(f"{where}.inputs", f"has members of different sizes in shape {label}")
    name, dim = axis.inputs[0]
    for follower, (leaf, out_dim) in enumerate(axis.outputs):
        here = f"{where}.outputs[{follower}]"
        if leaf >= len(leaves) or out_dim >= len(leaves[leaf]):
            refuse(here, f"names output {leaf} dim {out_dim}, which shape {label} does not have")
        if leaves[leaf][out_dim] != sizes[name][dim]:
            refuse(here, f"says output {leaf} dim {out_dim} follows axis {axis.label}, but it is "
                         f"not the axis's size in shape {label}")


#: The integers a float input's pad value may be written as: torch fills a buffer from a
#: Python int through a 64-bit integer, and refuses (OverflowError) one beyond it.
_FLOAT_PAD_INTS = (-(2**63), 2**63 - 1)


def check_pad_value(value: Any, dtype: str, where: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``where`` unless ``value`` fits its input's dtype
    (``pad_value_problem``)."""
    problem = pad_value_problem(value, dtype)
    if problem:
        raise error(f"{where}: pad value {show(value)} {problem}")


def pad_value_problem(value: Any, dtype: str) -> str | None:
    """What is wrong with ``value`` as the pad value of an input of ``dtype`` (a manifest
    dtype name), or None: a bool for bool inputs, an integer within the dtype's range for
    integer ones, a finite number within the dtype's largest for floats (an integer one
    within 64 bits, which torch fills a float buffer from). torch would refuse any other
    value only when the first padded call fills a buffer with it (or round it to
    infinity)."""
    spec = DTYPES[dtype]
    limits = spec.int_limits
    if spec.kind == "bool":
        ok = isinstance(value, bool)
    elif limits is not None:
        ok = type(value) is int and limits[0] <= value <= limits[1]
    else:
        ok = type(value) in (int, float) and finite(value) \
            and abs(value) <= (spec.largest or math.inf)
        if ok and type(value) is int and not _FLOAT_PAD_INTS[0] <= value <= _FLOAT_PAD_INTS[1]:
            return (f"is an integer beyond 64 bits, which torch cannot fill a {dtype} input "
                    f"with: write it as a float ({float(value):g})")
    if ok:
        return None
    expected = ("true or false" if spec.kind == "bool"
                else f"an integer from {limits[0]} to {limits[1]}" if limits is not None
                else f"a finite number within ±{spec.largest:g}")
    return f"must be {expected} ({dtype})"


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
