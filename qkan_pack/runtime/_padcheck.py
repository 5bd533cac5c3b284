"""A padded call against the same call unpadded: the one check that build's padding proof
(``builder._padding``) and the load's padding self-test share.

A call smaller than a declared entry along padded axes is served by padding it up to the
entry with the declared pad values, running the entry and slicing the outputs that follow
each axis back to the call's size. That is only right if the sliced outputs equal those of
the unpadded call. Both sides run the model eagerly: the reference inputs cut along the
axes, once as they are and once padded back to the entry, and every output leaf must agree
within a bound set by the entry's rounding noise (``proof_bound``, per output channel at
build: ``proof_agreement``).

Build runs it at several sizes per entry and refuses a declaration that fails
(``PaddingError``); a load runs it once per entry a call can pad into, one smaller along
every padded axis (``check_padded_calls``), so that a manifest re-hashed with another pad
value, or other output dims said to follow an axis, is refused (``SelfTestError``) instead
of answering padded calls wrongly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from ..errors import SelfTestError
from ..format import Manifest, PaddedAxis, Padding
from ._selftest import (
    HALF_CEILING,
    Agreement,
    compare,
    proof_bound,
    spread_for,
    structure_difference,
)
from ._tree import torch_dtype

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["PaddedAgreement", "cut_inputs", "pad_inputs", "padded_agreement", "sizes_text",
           "values_text"]

#: Said by a model run that fails on padded inputs.
PAD_VALUE_HINT = "Is each pad value valid for the model (a token id below its vocabulary size)?"
_LOAD_HINT = ("The manifest's padding (its pad values, or the output dims said to follow a "
              "padded axis) does not hold for this model here, though build proved it: was "
              "the manifest edited after build? Rebuild the artifact, and pin its digest or "
              "sign it")

#: Runs the model on inputs (declared order) and returns its flat outputs; ``what`` says
#: which run it is and ``hint`` what may be wrong, for the caller's error if it fails.
Run = Callable[[list[torch.Tensor], str, str], list[torch.Tensor]]


@dataclass(frozen=True)
class PaddedAgreement:
    """How a padded call's sliced outputs compare with the unpadded call's: a difference in
    structure (no tolerance applies), else each leaf's ``Agreement`` within ``bound``."""

    structure: str | None
    leaves: tuple[Agreement, ...]
    bound: float

    @property
    def first_outside(self) -> int | None:
        """The first leaf outside the bound (None: every one is within it)."""
        return next((leaf for leaf, found in enumerate(self.leaves) if not found.ok), None)

    @property
    def ok(self) -> bool:
        return self.structure is None and self.first_outside is None


def padded_agreement(run: Run, inputs: Sequence[torch.Tensor], names: Sequence[str],
                     padding: Padding, sizes: Mapping[PaddedAxis, int], bound: float,
                     leaf_names: Sequence[str], *, per_channel: bool = True) -> PaddedAgreement:
    """Run ``inputs`` (an entry's, declared order) cut to ``sizes`` along their axes, and cut
    then padded back to the entry with ``padding``'s values; compare the second's outputs,
    sliced back along the dims that follow each axis, with the first's: per output channel
    where channels' scales differ widely (build's proof, on the build host's arithmetic), or
    relative to each output (``per_channel=False``: a load on another device, whose
    rounding follows the large channels' scale)."""
    cut = cut_inputs(inputs, names, sizes)
    shown = sizes_text(sizes)
    want = run(cut, f"with {shown}", "")
    padded = run(pad_inputs(cut, inputs, names, padding),
                 f"with {shown} and padded back with {values_text(padding, sizes)}",
                 PAD_VALUE_HINT)
    got = slice_outputs(padded, sizes)
    structure = structure_difference(got, want, leaf_names,
                                     sides=("padded and sliced back", "unpadded"))
    if structure is not None:
        return PaddedAgreement(structure, (), bound)
    spread = spread_for(bound) if per_channel else None
    leaves = tuple(compare([g], [w], (0.0, bound), channel_spread=spread)
                   for g, w in zip(got, want))
    return PaddedAgreement(None, leaves, bound)


def check_padded_calls(run: Callable[[list[torch.Tensor], str], list[torch.Tensor]],
                       samples: Sequence[tuple[str, list[torch.Tensor]]], manifest: Manifest,
                       noises: Sequence[float | None], ceiling: float) -> None:
    """The load's padding self-test: for each entry a smaller call pads into, one call one
    smaller along every padded axis (``one_smaller``: a size build's proof ran), padded
    with the manifest's values, against the same call unpadded.

    Held to the bound build proved (``proof_bound`` of the entry's noise), or ``ceiling``
    (this load's reference tolerance) where that is looser: another device or solver
    reorders the arithmetic. Half-precision outputs may differ by their own rounding
    (``HALF_CEILING``): on another host, kernels chosen by size may round the two calls
    differently. A difference is a ``SelfTestError`` naming the call and the output.
    """
    padding = manifest.padding
    if padding is None:
        return
    names = manifest.input_names
    for (label, inputs), entry, noise in zip(samples, manifest.shapes, noises, strict=True):
        sizes = one_smaller(inputs, names, padding)
        if not sizes:
            continue
        bound = max([proof_bound(noise), ceiling,
                     *(HALF_CEILING.get(torch_dtype(leaf.dtype), 0.0)
                       for leaf in entry.outputs.leaves())])
        leaf_names = list(entry.outputs.leaf_names())
        found = padded_agreement(partial(_labelled, run, label), inputs, names, padding,
                                 sizes, bound, leaf_names, per_channel=False)
        if not found.ok:
            raise _refusal(label, found, sizes, padding, leaf_names)


def _labelled(run: Callable[[list[torch.Tensor], str], list[torch.Tensor]], label: str,
              inputs: list[torch.Tensor], what: str, hint: str) -> list[torch.Tensor]:
    """``run`` as ``padded_agreement`` calls it: the shape's label says which run failed."""
    return run(inputs, f"{label} {what}")


def _refusal(label: str, found: PaddedAgreement, sizes: Mapping[PaddedAxis, int],
             padding: Padding, leaf_names: Sequence[str]) -> SelfTestError:
    call = (f"a call with {sizes_text(sizes)}, padded back with "
            f"{values_text(padding, sizes)} and sliced,")
    if found.structure is not None:
        return SelfTestError(shape=label, compared=f"{call} and the same call unpadded",
                             max_abs=float("inf"), tolerance=(0.0, found.bound),
                             problem=found.structure, hint=_LOAD_HINT)
    leaf = found.first_outside
    assert leaf is not None
    agreement = found.leaves[leaf]
    return SelfTestError(shape=label,
                         compared=f"{call} and the same call unpadded ({leaf_names[leaf]})",
                         max_abs=agreement.max_abs, max_rel=agreement.max_rel,
                         tolerance=(0.0, found.bound), hint=_LOAD_HINT)


def one_smaller(inputs: Sequence[torch.Tensor], names: Sequence[str],
                padding: Padding) -> dict[PaddedAxis, int]:
    """Every padded axis one below the entry's size, where it is above one (an entry
    whose axes are all one is padded into by no smaller call)."""
    sizes = {}
    for axis in padding.axes:
        name, dim = axis.inputs[0]
        size = inputs[names.index(name)].shape[dim]
        if size > 1:
            sizes[axis] = size - 1
    return sizes


def cut_inputs(inputs: Sequence[torch.Tensor], names: Sequence[str],
               sizes: Mapping[PaddedAxis, int]) -> list[torch.Tensor]:
    """``inputs`` narrowed to ``sizes`` along every member of each axis (contiguous)."""
    cut = list(inputs)
    for axis, size in sizes.items():
        for name, dim in axis.inputs:
            position = names.index(name)
            cut[position] = cut[position].narrow(dim, 0, size)
    return [t.contiguous() for t in cut]


def pad_inputs(cut: Sequence[torch.Tensor], full: Sequence[torch.Tensor], names: Sequence[str],
               padding: Padding) -> list[torch.Tensor]:
    """``cut`` inputs padded back to the shapes of ``full`` with ``padding``'s values, on
    their device: what the predictor copies into an entry's input buffers."""
    padded = []
    for name, small, big in zip(names, cut, full):
        if name not in padding.values or small.shape == big.shape:
            padded.append(small)
            continue
        tensor = torch.full(big.shape, padding.values[name], dtype=big.dtype, device=big.device)
        tensor[tuple(slice(0, n) for n in small.shape)] = small
        padded.append(tensor)
    return padded


def slice_outputs(outputs: Sequence[torch.Tensor],
                  sizes: Mapping[PaddedAxis, int]) -> list[torch.Tensor]:
    """Flat outputs sliced back to ``sizes`` along the dims that follow each axis."""
    sliced = list(outputs)
    for axis, size in sizes.items():
        for leaf, dim in axis.outputs:
            sliced[leaf] = sliced[leaf].narrow(dim, 0, size)
    return sliced


def sizes_text(sizes: Mapping[PaddedAxis, int]) -> str:
    return "; ".join(f"{axis.label} cut to {size}" for axis, size in sizes.items())


def values_text(padding: Padding, sizes: Mapping[PaddedAxis, int]) -> str:
    names = {name for axis in sizes for name, _ in axis.inputs}
    return ", ".join(f"{name}={padding.values[name]!r}" for name in sorted(names))
