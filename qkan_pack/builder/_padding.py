"""``build --pad``: declare which inputs may be padded, find which outputs follow each padded
axis, and prove on the model that padding leaves the sliced-back outputs unchanged.

Padding is only safe when the model ignores padded positions: an attention mask that masks
them, rows that do not see each other. A global pool, a mean over the sequence without the
mask, or batch statistics break it, and nothing at serve time could see that. So build runs
the model both ways, on its own reference inputs cut to smaller sizes, for every entry and
several sizes that fit in it (one below the entry, the next smaller entry plus one, one),
and refuses a declaration whose padded outputs differ beyond the model's noise bound. The
comparison itself is ``runtime.padded_agreement``: each load runs it again, once per entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import PaddingError, ShapeSpecError
from ..format import (
    InputDecl,
    PaddedAxis,
    Padding,
    PadValue,
    ShapeEntry,
    check_pad_value,
    find_axes,
    format_shape,
)
from ..runtime import (
    cut_inputs,
    flatten,
    padded_agreement,
    proof_bound,
    sizes_text,
    values_text,
)


@dataclass(frozen=True)
class Reference:
    """One declared entry's reference run: its inputs (declared order) and flat outputs."""

    entry: ShapeEntry
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


def pad_names(pad: Mapping[str, PadValue], names: Sequence[str], call: str) -> dict[str, PadValue]:
    """``pad`` keyed by input name; the single positional input may be called ``x``."""
    resolved = {}
    for name, value in pad.items():
        if name == "x" and call == "positional" and len(names) == 1:
            name = names[0]
        if name not in names:
            raise ShapeSpecError(f"--pad {name}: not an input of the model (inputs: "
                                 f"{', '.join(names)}; a single positional input is x)")
        resolved[name] = value
    return resolved


def declare_padding(pad: Mapping[str, PadValue], decls: Sequence[InputDecl],
                    references: Sequence[Reference], forward: Callable[..., Any],
                    progress: Callable[[Any], Any] = lambda items: items) -> Padding:
    """The proven ``Padding`` of a build, or ``PaddingError`` saying what padding changes."""
    by_name = {d.name: d for d in decls}
    for name, value in pad.items():
        _check_value(by_name[name], value)
    names = [d.name for d in decls]
    per_shape = [dict(r.entry.inputs) for r in references]
    axes, problems = find_axes(per_shape, list(pad))
    if problems:
        raise PaddingError(problem="; ".join(problems))
    axes = tuple(_with_followers(axis, references, names, forward) for axis in axes)
    padding = Padding(values=dict(pad), axes=axes)
    for reference in progress(references):
        for sizes in _trial_sizes(reference, references, padding, names):
            _prove(reference, sizes, padding, names, forward)
    return padding


def _check_value(decl: InputDecl, value: PadValue) -> None:
    check_pad_value(value, decl.dtype, f"--pad {decl.name}", ShapeSpecError)
    bounds = decl.index_bounds
    if bounds is not None and not bounds[0] <= value < bounds[1]:
        raise PaddingError(
            problem=f"pad value {value} of {decl.name} is outside [{bounds[0]}, {bounds[1]}), "
                    f"the rows of the embedding it indexes ({decl.range_source})",
            input=decl.name, cause="use the model's pad token id (often 0)")


def _with_followers(axis: PaddedAxis, references: Sequence[Reference], names: Sequence[str],
                    forward: Callable[..., Any]) -> PaddedAxis:
    """Which output dims follow ``axis``: run its largest entry one size smaller, unpadded,
    and see which output dims shrink with it. A dim that changes without being the axis's
    size cannot be sliced back: refused."""
    name, dim = axis.inputs[0]
    position = names.index(name)
    largest = max(references, key=lambda r: r.inputs[position].shape[dim])
    size = largest.inputs[position].shape[dim]
    leaf_names = list(largest.entry.outputs.leaf_names())
    smaller = cut_inputs(largest.inputs, names, {axis: size - 1})
    shrunk = _run(forward, smaller, largest.entry.label, f"with {axis.label} cut to {size - 1}")
    if len(shrunk) != len(largest.outputs):
        raise PaddingError(problem=f"the number of outputs changes with {axis.label} "
                                   f"({len(largest.outputs)} tensors at size {size}, "
                                   f"{len(shrunk)} at {size - 1}): outputs whose number follows "
                                   "a padded axis cannot be sliced back", input=name, dim=dim)
    followers = []
    for leaf, (before, after) in enumerate(zip(largest.outputs, shrunk)):
        if before.dim() != after.dim():
            raise PaddingError(problem=f"output {leaf_names[leaf]} changes rank with {axis.label}",
                               input=name, dim=dim, output=leaf_names[leaf])
        for d, (b, a) in enumerate(zip(before.shape, after.shape)):
            if b == a:
                continue
            if (b, a) != (size, size - 1):
                raise PaddingError(
                    problem=f"output {leaf_names[leaf]} dim {d} changes with {axis.label} "
                            f"({size} -> {b}, {size - 1} -> {a}) but is not its size: it "
                            "cannot be sliced back", input=name, dim=dim,
                    output=leaf_names[leaf])
            followers.append((leaf, d))
    return PaddedAxis(axis.inputs, tuple(followers))


def _trial_sizes(reference: Reference, references: Sequence[Reference], padding: Padding,
                 names: Sequence[str]) -> list[dict[PaddedAxis, int]]:
    """Sizes smaller than ``reference``'s entry to prove padding with: per axis one below
    the entry, the next smaller entry's size plus one, and one; then all axes one below."""
    trials: list[dict[PaddedAxis, int]] = []
    below_all = {}
    for axis in padding.axes:
        name, dim = axis.inputs[0]
        position = names.index(name)
        size = reference.inputs[position].shape[dim]
        others = sorted({r.inputs[position].shape[dim] for r in references} - {size})
        next_smaller = max((s for s in others if s < size), default=None)
        candidates = {size - 1, 1} | ({next_smaller + 1} if next_smaller is not None else set())
        for candidate in sorted(c for c in candidates if 1 <= c < size):
            trials.append({axis: candidate})
        if size > 1:
            below_all[axis] = size - 1
    if len(below_all) > 1:
        trials.append(below_all)
    return trials


def _prove(reference: Reference, sizes: Mapping[PaddedAxis, int], padding: Padding,
           names: Sequence[str], forward: Callable[..., Any]) -> None:
    """Outputs of the cut inputs, and of the cut inputs padded back to the entry then sliced,
    must agree within the entry's noise bound (``runtime.padded_agreement``, which the load
    self-test runs too)."""
    label = reference.entry.label
    leaf_names = list(reference.entry.outputs.leaf_names())  # this entry's own outputs
    found = padded_agreement(
        lambda inputs, what, hint: _run(forward, inputs, label, what, hint=hint),
        reference.inputs, names, padding, sizes, proof_bound(reference.entry.noise),
        leaf_names)
    if found.ok:
        return
    axis = next(iter(sizes))
    name, dim = axis.inputs[0]
    shown = sizes_text(sizes)
    if found.structure is not None:  # no tolerance applies: no slicing gives the unpadded outputs
        raise PaddingError(
            problem=f"shape {label} with {shown}, padded back with "
                    f"{values_text(padding, sizes)}: {found.structure}; outputs whose number or "
                    "shape change with a padded axis other than by following its size cannot "
                    "be sliced back", input=name, dim=dim)
    leaf = found.first_outside
    assert leaf is not None
    agreement = found.leaves[leaf]
    follows = any(leaf == f for a in sizes for f, _ in a.outputs)
    raise PaddingError(
        problem=f"shape {label} with {shown}, padded back with "
                f"{values_text(padding, sizes)}, changes {leaf_names[leaf]} by "
                f"{agreement.max_rel:.3g} of its scale (bound {found.bound:.2g}, from the "
                "model's rounding noise)",
        input=name, dim=dim, output=leaf_names[leaf], max_rel=agreement.max_rel,
        tolerance=found.bound, cause=_likely_cause(dim, follows))


def _likely_cause(dim: int, follows: bool) -> str:
    if dim == 0:
        return ("Rows are not independent in this model: does it use batch statistics "
                "(batch norm in training mode) or attend or pool across the batch?")
    if follows:
        return ("This model's outputs at kept positions depend on padded positions: does it "
                "attend without the attention mask, or mix positions (convolutions) over them?")
    return ("This model's output depends on padded positions: does it use attention_mask in "
            "pooling (mean pooling over every position, a global pool)?")


def _run(forward: Callable[..., Any], inputs: Sequence[torch.Tensor], label: str,
         what: str, hint: str = "") -> list[torch.Tensor]:
    try:
        with torch.inference_mode():
            return flatten(forward(*inputs))
    except Exception as exc:
        shapes = ", ".join(format_shape(t.shape) for t in inputs)
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        raise PaddingError(problem=f"the model fails on shape {label} {what} ({shapes}): "
                                   f"{reason[:300]}", cause=hint) from exc
