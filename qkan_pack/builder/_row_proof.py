"""Row independence, proved at build: whether each row of a batch gets the answer it would get
with any other rows beside it.

``qkan-pack serve`` packs single rows of different requests into one captured batch. That is
safe only when a row's outputs depend on that row alone. Batch-wide statistics break it (a
dynamic quantisation scale taken from the batch's largest value, batch norm in training mode,
a mixture of experts whose per-batch capacity drops rows): one client's answer then depends
on, and can reveal, another client's input. Padding with zeros does not show it (a zero row
leaves a batch maximum unchanged), so the padding proof cannot stand in for this one.

For every declared entry with rows serve could batch (two or more; ``batch_dims``: every
input and output leading with the batch size, or a padded batch axis) build runs the model
three more ways and compares the rows it kept with the reference run, along the dimension of
each output that follows the batch. An output that does not follow a padded batch axis (a
per-batch statistic) is no row's own: such an entry is not row-independent.

- **neighbours replaced**: every odd row replaced by a fresh draw of inputs (what other
  clients send), the even rows kept;
- **filled**: the first half of the rows, the rest copies of the first row (how serve fills a
  captured batch that requests do not fill);
- **alone**: a sample of rows, each run as a batch of one (skipped, with a note, where the
  model cannot run a batch of one).

Each kept row must agree with its reference row within the entry's noise bound, the
comparison the padding proof uses (``runtime.proof_agreement``: per channel where channels'
scales differ widely). The verdict, with what showed a dependence, is recorded per entry
(``format.RowProof``); serve batches requests only into entries proved independent.

What it cannot do: see a dependence the model shows only on inputs unlike the fresh draws
(the reference inputs' own distribution: ``--input-range``, ``example_input``), or one
smaller than the model's rounding noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..format import MAX_ROW_DETAIL, Padding, RowProof, ShapeEntry, entry_batch, input_batch
from ..runtime import flatten, proof_agreement, proof_bound, structure_difference
from ._padding import Reference

#: The most rows run alone per entry (evenly spaced, the first and last among them): each is
#: one more forward, and a dependence on the batch shows in every row it touches.
ALONE_ROWS = 8


@dataclass(frozen=True)
class _Trial:
    """One way of running an entry's batch: its inputs, which of its rows are compared
    (``kept``) with which reference rows (``reference_rows``), and what was done, in words."""

    inputs: list[torch.Tensor]
    kept: list[int]
    reference_rows: list[int]
    what: str
    optional: bool = False  # the model failing to run it proves nothing either way


def prove_rows(references: Sequence[Reference],
               fresh_inputs: Callable[[int], Sequence[torch.Tensor]],
               forward: Callable[..., Any], padding: Padding | None = None,
               progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda items: items,
               ) -> list[RowProof | None]:
    """Per reference (declared order), its ``RowProof``; None for an entry that has no rows
    to batch (``batch_dims``). ``fresh_inputs(index)`` draws another set of inputs of entry
    ``index`` (declared input order), whose rows replace the neighbours; ``padding``
    (declared) says which output dims follow a padded batch axis."""
    proofs: list[RowProof | None] = [None] * len(references)
    candidates = [i for i, r in enumerate(references)
                  if (input_batch(r.entry) or 0) >= 2 and batch_dims(r.entry, padding)]
    for index in progress(candidates):
        reference = references[index]
        dims = batch_dims(reference.entry, padding)
        if isinstance(dims, str):
            proofs[index] = _verdict(False, dims)
            continue
        proofs[index] = _prove_entry(reference, dims, list(fresh_inputs(index)), forward)
    return proofs


def batch_dims(entry: ShapeEntry, padding: Padding | None) -> list[int] | str | None:
    """Per output leaf, the dimension that follows the batch: every output's first where
    they all lead with the batch size (``format.entry_batch``: how serve slices rows),
    else the followers of a declared batch axis (``--pad`` on dim 0: how ragged serving
    slices them). In words, why not, when a padded batch axis has outputs that do not follow
    it (they are no row's own); None when the entry has no rows serve could batch."""
    names = list(entry.outputs.leaf_names())
    if entry_batch(entry) is not None:
        return [0] * len(names)
    axis = padding.axis_of(entry.inputs[0][0], 0) if padding is not None else None
    if padding is None or axis is None:
        return None
    follows = dict(padding.axes[axis].outputs)
    missing = [name for leaf, name in enumerate(names) if leaf not in follows]
    if missing:
        what = (f"output {missing[0]} does" if len(missing) == 1
                else f"outputs {', '.join(missing)} do")
        return f"{what} not follow the batch: no row has it to itself"
    return [follows[leaf] for leaf in range(len(names))]


def _prove_entry(reference: Reference, dims: Sequence[int], fresh: list[torch.Tensor],
                 forward: Callable[..., Any]) -> RowProof:
    """Run every trial; the first kept row that moves beyond the bound decides. Where the
    model cannot run a row alone (a batch of one), the other rows-alone trials are skipped
    and the verdict says so."""
    skipped = ""
    for trial in _trials(reference.inputs, fresh):
        if trial.optional and skipped:
            continue
        try:
            outputs = _run(forward, trial.inputs)
        except Exception as exc:
            reason = f"the model fails when {trial.what}: {_describe(exc)}"
            if not trial.optional:
                return _verdict(False, reason)
            skipped = f"rows alone not compared ({reason})"
            continue
        problem = _row_difference(reference, dims, trial, outputs)
        if problem is None:
            continue
        structural = problem.startswith(_STRUCTURE)
        problem = problem.removeprefix(_STRUCTURE)
        if trial.optional and structural:
            skipped = f"rows alone not compared ({problem})"
            continue
        return _verdict(False, problem)
    return _verdict(True, skipped)


_STRUCTURE = "structure: "


def _trials(inputs: Sequence[torch.Tensor], fresh: Sequence[torch.Tensor]) -> list[_Trial]:
    batch = inputs[0].shape[0]
    rows = list(range(batch))
    odd = torch.arange(1, batch, 2)
    mixed = []
    for mine, other in zip(inputs, fresh):
        tensor = mine.clone()
        tensor[odd] = other[odd]
        mixed.append(tensor)
    even = rows[::2]
    kept = max(1, batch // 2)
    filled = [torch.cat([t[:kept], t[:1].expand(batch - kept, *t.shape[1:])]) for t in inputs]
    trials = [
        _Trial(mixed, even, even, "every odd row is replaced by other inputs"),
        _Trial(filled, rows[:kept], rows[:kept],
               f"rows {kept}.. are filled with copies of row 0"),
    ]
    for row in _alone_rows(batch):
        trials.append(_Trial([t[row:row + 1] for t in inputs], [0], [row],
                             f"row {row} runs alone (a batch of one)", optional=True))
    return trials


def _alone_rows(batch: int) -> list[int]:
    """Up to ``ALONE_ROWS`` rows, evenly spaced from the first to the last."""
    if batch <= ALONE_ROWS:
        return list(range(batch))
    step = (batch - 1) / (ALONE_ROWS - 1)
    return sorted({round(i * step) for i in range(ALONE_ROWS)})


def _row_difference(reference: Reference, dims: Sequence[int], trial: _Trial,
                    outputs: list[torch.Tensor]) -> str | None:
    """What differs between the trial's kept rows and their reference rows (each output
    along its batch dim, ``dims``), in words (a structural difference prefixed
    ``_STRUCTURE``); None when every output agrees."""
    names = list(reference.entry.outputs.leaf_names())
    batch = trial.inputs[0].shape[0]
    if len(outputs) != len(reference.outputs) or any(
            leaf.dim() <= dim or leaf.shape[dim] != batch for leaf, dim in zip(outputs, dims)):
        shapes = ", ".join("x".join(map(str, leaf.shape)) or "a scalar" for leaf in outputs)
        return (f"{_STRUCTURE}when {trial.what}, the outputs ({shapes}) no longer follow "
                f"its {batch} rows")
    kept, wanted = torch.tensor(trial.kept), torch.tensor(trial.reference_rows)
    got = [leaf.index_select(dim, kept) for leaf, dim in zip(outputs, dims)]
    want = [leaf.index_select(dim, wanted) for leaf, dim in zip(reference.outputs, dims)]
    structure = structure_difference(got, want, names, sides=("then", "in the reference batch"))
    if structure is not None:
        return f"{_STRUCTURE}when {trial.what}, {structure}"
    bound = proof_bound(reference.entry.noise)
    for name, g, w in zip(names, got, want):
        agreement = proof_agreement(g, w, reference.entry.noise)
        if not agreement.ok:
            change = (f"by {agreement.max_rel:.3g} of its scale (bound {bound:.2g})"
                      if agreement.max_rel < float("inf") else
                      f"by {agreement.max_abs:.3g} where the reference batch gave zeros or NaN")
            return (f"when {trial.what}, {name} of the kept rows changes {change}: each "
                    "row's answer depends on the rows batched with it")
    return None


def _run(forward: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return flatten(forward(*inputs))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200]


def _verdict(independent: bool, detail: str) -> RowProof:
    if len(detail) > MAX_ROW_DETAIL:
        detail = detail[:MAX_ROW_DETAIL - 1] + "…"
    return RowProof(independent=independent, detail=detail)
