"""Row independence, proved at build: whether each row of a batch gets the answer it would get
with any other rows beside it.

``qkan-pack serve`` packs single rows of different requests into one captured batch. That is
safe only when a row's outputs depend on that row alone. Batch-wide statistics break it (a
dynamic quantisation scale taken from the batch's largest value, batch norm in training mode,
a mixture of experts whose per-batch capacity drops rows), and so does any row that reads
another (a shift, a gather across the batch): one client's answer then depends on, and can
reveal, another client's input. Padding with zeros does not show it (a zero row leaves a
batch maximum unchanged), so the padding proof cannot stand in for this one.

For every declared entry with rows serve could batch (two or more; ``batch_dims``: every
input and output leading with the batch size, or a padded batch axis) build runs the model
again several ways and compares the rows it kept, along the dimension of each output that
follows the batch, with what they must be:

- **neighbours replaced**: for each bit of the row index, the rows whose bit is 0 kept and
  the others replaced by other inputs, then the other way round. Any two rows differ in some
  bit, so for every pair of rows there is a run in which the first is kept and the second is
  replaced: whichever row a row reads, some run changes it (2 x log2(batch) runs);
- **other rows kept**: the fresh draw's even (then odd) rows kept beside the reference's,
  compared with the fresh draw's own run (a leak shows only in a row whose value is small
  beside it, and a small batch of references may hold none);
- **widened neighbours**: the first half kept, the rest other inputs sixteen times as large,
  then as small (a batch-wide scale with a floor moves only for values beyond the draws);
- **copies**: the first half of the rows, the rest copies of the first row (how serve fills a
  captured batch that requests do not fill); and the last half kept behind copies of the
  last row (many requests like one client's ahead of it: a per-batch capacity, as a mixture
  of experts has, drops the rows that come last);
- **mixed lengths** (declared padding with a length axis): half the rows cut short and padded
  back, beside full-length rows, as serve's ragged batches are (a row's answer must be what
  it is beside rows of its own length);
- **alone**: a sample of rows, each run as a batch of one. Outputs that do not come out with
  one row then (a fixed table that merely has as many rows as the batch) are no row's own.
  A model that cannot run a batch of one at all skips these runs, and the verdict says so.
  The same rows alone are run again with the model in float64 beside the whole batch in
  float64 (``RowContext.wide_forward``), where the model computes in float64 throughout
  (``runtime.float64_throughout``): another batch size runs other kernels, so in
  float32 a row alone can only be held to a scale larger than its small values (its
  output's largest, or per channel where no float64 run is made); in float64 both runs
  agree to ~1e-13, and each value is held to ``WIDE_BOUND`` of its own magnitude. This is
  the one run that sees a term only the batch's size or its other rows switch on. The
  fresh draw's rows run alone as well as the reference's.

The other inputs are a fresh draw (the ``example_input`` hook with another seed, or at random
where the hook gives the same inputs again: a hook that repeats one sample would make every
run above change nothing). Each kept row must agree within the entry's noise bound
(``runtime.proof_agreement``, per channel where channels' scales differ widely, and where
the batch size is unchanged, so the same kernels compute each row, each value within the
bound of its own magnitude too: a channel whose rows are a million apart would otherwise
hide a leak into its small rows); a row run alone, through other kernels, within the
rounding of a half-precision output where it has one, held to that output's largest
magnitude over the batch (other kernels round each value by float32's resolution of the terms
it sums, which a small value's need not be), and in float64 each value within the bound of
its own magnitude. The verdict, with what showed a
dependence, is recorded per entry (``format.RowProof``); serve batches requests only into
entries proved independent.

What it cannot do: see a dependence the model shows only on inputs unlike the draws (the
reference inputs' own distribution: ``--input-range``, ``example_input``), or one smaller
than the model's rounding noise; where the model does not compute in float64 throughout
(QKAN's solvers mix complex64 buffers in), a term that only a row alone switches off is
measured against its channel's scale in float32 only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..format import MAX_ROW_DETAIL, PaddedAxis, Padding, RowProof, ShapeEntry, entry_batch
from ..format import input_batch as _input_batch
from ..runtime import (
    HALF_CEILING,
    Agreement,
    ChannelPool,
    cut_inputs,
    flatten,
    float64_throughout,
    pad_inputs,
    proof_agreement,
    proof_bound,
    structure_difference,
)
from ._padding import Reference

#: The most rows run alone per entry (evenly spaced, the first and last among them): each is
#: one more forward, and a dependence on the batch shows in every row it touches.
ALONE_ROWS = 8
#: A row alone in float64 may differ from its batch's float64 run by this share of each
#: value's own magnitude (never below ``OWN_FLOOR`` of its channel's scale): float64 runs of a
#: row-independent model at two batch sizes differ by ~1e-13 of it (transformers, CNNs,
#: RNNs), while a term only a row alone switches off, 1% beside a value of 1e6, is 1e-8.
WIDE_BOUND = 1e-9


@dataclass(frozen=True)
class _Trial:
    """One way of running an entry's batch: its inputs, which of its rows are compared
    (``kept``) with which rows (``wanted``) of the reference run, or of ``baseline``'s run
    where one is given, and what was done, in words. ``alone``: a run at another batch size
    (other kernels; the model failing to run it proves nothing either way)."""

    inputs: list[torch.Tensor]
    kept: list[int]
    wanted: list[int]
    what: str
    baseline: list[torch.Tensor] | None = None
    #: A row run alone: which float64 batch holds it (``_wide_batches``' order: 0 the
    #: reference's, 1 the fresh draw's) and its row there.
    alone_of: tuple[int, int] | None = None
    #: Inputs the model may refuse (values beyond what it was built for): failing proves
    #: nothing either way, and the trial is skipped.
    may_fail: bool = False

    @property
    def alone(self) -> bool:
        return self.alone_of is not None

    @property
    def skippable(self) -> bool:
        return self.alone or self.may_fail


@dataclass(frozen=True)
class _Moved:
    """A kept row that moved: what, in words; which output; and whether the move was within
    the entry's own float32 rounding noise (then, for a row run alone, the float64 run of it
    decides)."""

    text: str
    output: int
    within_noise: bool


@dataclass(frozen=True)
class RowContext:
    """What the proof needs besides each reference: the forward, the declared input names
    (declared order), the declared padding, and where other inputs of an entry come from."""

    forward: Callable[..., Any]
    names: Sequence[str]
    padding: Padding | None
    fresh_inputs: Callable[[int, Sequence[torch.Tensor]], Sequence[torch.Tensor]]
    #: Per entry, its outputs' channel scales (a few kept rows show none).
    pools: Sequence[ChannelPool] = ()
    #: The model in float64, bound like ``forward`` (``runtime.float64_forward``); None where
    #: it cannot be made: rows alone are then compared in float32 only.
    wide_forward: Callable[..., Any] | None = None


def prove_rows(references: Sequence[Reference], context: RowContext,
               progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda items: items,
               ) -> list[RowProof | None]:
    """Per reference (declared order), its ``RowProof``; None for an entry that has no rows
    to batch (``batch_dims``). ``context.fresh_inputs(index, reference_inputs)`` draws other
    inputs of entry ``index`` (declared order) that differ from the reference's."""
    proofs: list[RowProof | None] = [None] * len(references)
    candidates = [i for i, r in enumerate(references)
                  if (_input_batch(r.entry) or 0) >= 2 and batch_dims(r.entry, context.padding)]
    for index in progress(candidates):
        reference = references[index]
        dims = batch_dims(reference.entry, context.padding)
        if isinstance(dims, str):
            proofs[index] = _verdict(False, dims)
            continue
        assert dims is not None
        fresh = list(context.fresh_inputs(index, reference.inputs))
        wide = _wide_batches(reference.inputs, fresh, context.wide_forward)
        proofs[index] = _prove_entry(reference, dims, _trials(reference, fresh, context),
                                     context, context.pools[index] if context.pools else None,
                                     wide)
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


#: Said with a verdict a row alone gave where no float64 comparison ran: float32 rounding
#: of a small channel's large terms can look like a dependence there.
_FLOAT32_ONLY = (" (compared in float32 only: the model does not run in float64 throughout, "
                 "which a tensor kept as a plain attribute rather than a registered buffer "
                 "prevents)")


@dataclass(frozen=True)
class _WideBatch:
    """One batch (the reference's, or the fresh draw's: ``what`` its rows are, in words) and
    the model's float64 outputs on it."""

    inputs: Sequence[torch.Tensor]
    outputs: list[torch.Tensor]
    what: str


def _wide_batches(reference: Sequence[torch.Tensor], fresh: Sequence[torch.Tensor],
                  wide_forward: Callable[..., Any] | None) -> list[_WideBatch]:
    """The reference batch and the fresh draw run in float64, where the model is float64
    throughout (``float64_throughout``); none otherwise (rows alone are then compared in
    float32 only)."""
    if wide_forward is None:
        return []
    batches = []
    for inputs, what in ((reference, "row {row}"), (fresh, "row {row} of other inputs")):
        outputs = float64_throughout(wide_forward, inputs)
        if outputs is None:
            return []
        batches.append(_WideBatch(inputs, outputs, what))
    return batches


def _prove_entry(reference: Reference, dims: Sequence[int], trials: Sequence[_Trial],
                 context: RowContext, pool: ChannelPool | None,
                 wide: Sequence[_WideBatch] = ()) -> RowProof:
    """Run every trial; the first kept row that moves beyond the bound decides. Where the
    model cannot run a batch of one, the rows-alone trials are skipped, and the verdict
    says so. ``wide``: the batches whose rows alone are compared in float64 too (then a row
    alone in float32 is held to its output's largest magnitude only, and one that moves no
    more than the model's own float32 rounding is left to its float64 run: a chaotic model's
    rounding can exceed the proof's bound)."""
    skipped = ""
    deferred: list[tuple[_Trial, _Moved]] = []
    baselines: dict[int, list[torch.Tensor]] = {}  # by the baseline's identity: run once
    for trial in trials:
        if trial.alone and skipped:
            continue
        try:
            outputs = _run(context.forward, trial.inputs)
            wanted: Sequence[torch.Tensor] = reference.outputs
            if trial.baseline is not None:
                if id(trial.baseline) not in baselines:
                    baselines[id(trial.baseline)] = _run(context.forward, trial.baseline)
                wanted = baselines[id(trial.baseline)]
        except Exception as exc:
            reason = f"the model fails when {trial.what}: {_describe(exc)}"
            if not trial.skippable:
                return _verdict(False, reason)
            if trial.alone:
                skipped = f"rows alone not compared ({reason})"
            continue
        moved = _row_difference(reference, dims, trial, outputs, wanted, pool,
                                wide_checked=bool(wide))
        if moved is None:
            continue
        if trial.alone and wide and moved.within_noise:
            deferred.append((trial, moved))
            continue
        return _verdict(False, moved.text + (_FLOAT32_ONLY if trial.alone and not wide else ""))
    compared: set[tuple[int, int, int]] = set()
    if not skipped and context.wide_forward is not None:
        for index, batch in enumerate(wide):
            problem, seen = _wide_alone_difference(reference, dims, context.wide_forward,
                                                   batch, pool)
            if problem is not None:
                return _verdict(False, problem)
            compared |= {(index, row, output) for row, output in seen}
    return _deferred_verdict(deferred, compared, reference.entry.noise) or _verdict(True, skipped)


def _deferred_verdict(deferred: Sequence[tuple[_Trial, _Moved]],
                      compared: set[tuple[int, int, int]], noise: float | None) -> RowProof | None:
    """The verdict on rows alone whose float32 runs moved within the model's own rounding:
    dependent where no float64 run compared one of them, else independent, saying so; None
    where there were none."""
    if not deferred:
        return None
    for trial, moved in deferred:
        assert trial.alone_of is not None
        if (*trial.alone_of, moved.output) not in compared:
            return _verdict(False, f"{moved.text}, and no float64 run compared it")
    return _verdict(True, f"rows alone differ in float32 within the model's own rounding "
                          f"(noise {noise:.2g}); in float64 they agree")


def _wide_alone_difference(reference: Reference, dims: Sequence[int],
                           wide_forward: Callable[..., Any], batch: _WideBatch,
                           pool: ChannelPool | None) -> tuple[str | None, set[tuple[int, int]]]:
    """The batch's rows alone in float64 against the whole batch in float64, each value held
    to ``WIDE_BOUND`` of its own magnitude (``proof_agreement(same_kernels=True)``), in
    words (None when they agree), and the (row, output) pairs compared. A row the float64
    model fails alone on, or computes below float64, is left to the float32 runs. Only
    outputs that are float64 in both runs are compared."""
    batched = batch.outputs
    names = list(reference.entry.outputs.leaf_names())
    compared: set[tuple[int, int]] = set()
    for row in _alone_rows(batch.inputs[0].shape[0]):
        alone = float64_throughout(wide_forward, [t[row:row + 1] for t in batch.inputs])
        if alone is None or len(alone) != len(batched):
            continue
        for output, (name, got, whole, dim) in enumerate(zip(names, alone, batched, dims)):
            if got.dtype != torch.float64 or whole.dtype != torch.float64 or (
                    got.dim() <= dim or got.shape[dim] != 1):
                continue
            want = whole.narrow(dim, row, 1)
            if got.shape != want.shape:
                continue
            agreement = proof_agreement(got, want, reference.entry.noise, bound=WIDE_BOUND,
                                        pool=pool, output=output, same_kernels=True)
            if not agreement.ok:
                return (f"when {batch.what.format(row=row)} runs alone (a batch of one) in "
                        f"float64, {name} changes {_change(agreement, WIDE_BOUND)}: "
                        "each row's answer depends on the batch it runs in"), compared
            compared.add((row, output))
    return None, compared


def _change(agreement: Agreement, bound: float) -> str:
    """How far a kept row moved, in words."""
    return (f"by {agreement.max_rel:.3g} of its scale (bound {bound:.2g})"
            if agreement.max_rel < float("inf") else
            f"by {agreement.max_abs:.3g} where the reference batch gave zeros or NaN")


def _trials(reference: Reference, fresh: Sequence[torch.Tensor],
            context: RowContext) -> list[_Trial]:
    """Every run the proof makes of one entry, in the order it makes them (the cheap and
    telling first)."""
    inputs, fresh = reference.inputs, list(fresh)  # one fresh baseline: run once
    batch = inputs[0].shape[0]
    trials = _neighbour_trials(inputs, fresh, batch)
    trials += _fresh_kept_trials(inputs, fresh, batch)
    trials += _scaled_neighbour_trials(inputs, fresh, batch)
    trials += _copy_trials(inputs, batch)
    trials += _mixed_length_trials(inputs, batch, context)
    return trials + _alone_trials(inputs, fresh, batch)


def _alone_trials(inputs: Sequence[torch.Tensor], fresh: list[torch.Tensor],
                  batch: int) -> list[_Trial]:
    """A sample of rows each run as a batch of one, the reference's and then the fresh
    draw's (compared with its own run): a term only a row alone switches off shows in a
    small value, and at a batch of two or three the reference's rows may all be large."""
    rows = _alone_rows(batch)
    trials = [_Trial([t[row:row + 1] for t in inputs], [0], [row],
                     f"row {row} runs alone (a batch of one)", alone_of=(0, row))
              for row in rows]
    return trials + [_Trial([t[row:row + 1] for t in fresh], [0], [row],
                            f"row {row} of other inputs runs alone (a batch of one)",
                            baseline=fresh, alone_of=(1, row)) for row in rows]


#: Neighbours' float inputs are also tried this many times as large and as small: a batch-wide
#: scale with a floor, or a clip range, moves only for values beyond what the draws hold.
NEIGHBOUR_SCALE = 16.0


def _scaled_neighbour_trials(inputs: Sequence[torch.Tensor], fresh: Sequence[torch.Tensor],
                             batch: int) -> list[_Trial]:
    """The first half kept, the rest replaced by ``fresh``'s rows with their floats
    ``NEIGHBOUR_SCALE`` times as large, then as small."""
    kept = max(1, batch // 2)
    rows = list(range(kept))
    trials = []
    for scale, words in ((NEIGHBOUR_SCALE, "as large"), (1 / NEIGHBOUR_SCALE, "as small")):
        mixed = [torch.cat([t[:kept], (o * scale if o.is_floating_point() else o)[kept:]])
                 for t, o in zip(inputs, fresh)]
        trials.append(_Trial(mixed, rows, rows,
                             f"rows {kept}.. are replaced by other inputs {NEIGHBOUR_SCALE:g} "
                             f"times {words}", may_fail=True))
    return trials


def _copy_trials(inputs: Sequence[torch.Tensor], batch: int) -> list[_Trial]:
    """Neighbours that are copies of a kept row, after it (how serve fills a captured batch
    that requests do not fill) and before it (many requests like one client's, ahead of it:
    a per-batch capacity, as a mixture of experts has, drops the rows that come last)."""
    kept = max(1, batch // 2)
    first = list(range(kept))
    last = list(range(batch - kept, batch))
    filled = [torch.cat([t[:kept], t[:1].expand(batch - kept, *t.shape[1:])]) for t in inputs]
    ahead = [torch.cat([t[-1:].expand(batch - kept, *t.shape[1:]), t[batch - kept:]])
             for t in inputs]
    return [_Trial(filled, first, first, f"rows {kept}.. are filled with copies of row 0"),
            _Trial(ahead, last, last, f"rows ..{batch - kept - 1} are copies of row {batch - 1}, "
                                       "ahead of the rows kept")]


def _neighbour_trials(inputs: Sequence[torch.Tensor], fresh: Sequence[torch.Tensor],
                      batch: int) -> list[_Trial]:
    """Per bit of the row index and per value of it: the rows with that value kept, the
    others replaced by ``fresh``'s rows."""
    trials = []
    index = torch.arange(batch)
    for bit in range(max(1, math.ceil(math.log2(batch)))):
        for side in (0, 1):
            keep = ((index >> bit) & 1) == side
            kept = index[keep].tolist()
            if not kept or len(kept) == batch:
                continue
            mixed = _rows_from(keep, inputs, fresh)
            trials.append(_Trial(mixed, kept, kept,
                                 f"the rows whose index has bit {bit} {'set' if side == 0 else 'clear'}"
                                 " are replaced by other inputs"))
    return trials


def _rows_from(keep: torch.Tensor, kept: Sequence[torch.Tensor],
               others: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each input's batch with the rows where ``keep`` is true from ``kept``, the rest from
    ``others``."""
    return [torch.where(keep.view(-1, *[1] * (t.dim() - 1)), t, other)
            for t, other in zip(kept, others)]


def _fresh_kept_trials(inputs: Sequence[torch.Tensor], fresh: list[torch.Tensor],
                       batch: int) -> list[_Trial]:
    """The other way round, for the lowest bit: ``fresh``'s even (then odd) rows kept beside
    the reference's, compared with ``fresh``'s own run. A row reads a leak within float32's
    resolution of its own value only where that value is small: at a batch of two or three
    the reference's rows alone may all be large ones."""
    index, baseline = torch.arange(batch), fresh  # the baseline run once, by its identity
    trials = []
    for side, parity in ((0, "even"), (1, "odd")):
        keep = index % 2 == side
        kept = index[keep].tolist()
        if len(kept) == batch:
            continue
        mixed = _rows_from(keep, fresh, inputs)
        trials.append(_Trial(mixed, kept, kept, f"the {parity} rows of other inputs run beside "
                             "the reference's rows", baseline=baseline))
    return trials


def _mixed_length_trials(inputs: Sequence[torch.Tensor], batch: int,
                         context: RowContext) -> list[_Trial]:
    """With a padded length axis: the even rows cut to half their length and padded back
    beside full-length odd rows; the even rows must answer as in a batch cut throughout, the
    odd ones as in the reference."""
    padding = context.padding
    if padding is None:
        return []
    names = list(context.names)
    batch_axis = padding.axis_of(names[0], 0)
    sizes: dict[PaddedAxis, int] = {}
    for index, axis in enumerate(padding.axes):
        name, dim = axis.inputs[0]
        size = inputs[names.index(name)].shape[dim]
        if index != batch_axis and size > 1:
            sizes[axis] = size // 2
    if not sizes:
        return []
    short = pad_inputs(cut_inputs(inputs, names, sizes), inputs, names, padding)
    even = torch.arange(batch) % 2 == 0
    rows = torch.arange(batch)
    mixed = _rows_from(even, short, inputs)
    what = "the even rows are cut to half their length and padded, beside full-length rows"
    return [_Trial(mixed, rows[even].tolist(), rows[even].tolist(), what, baseline=list(short)),
            _Trial(mixed, rows[~even].tolist(), rows[~even].tolist(), what)]


def _alone_rows(batch: int) -> list[int]:
    """Up to ``ALONE_ROWS`` rows, evenly spaced from the first to the last."""
    if batch <= ALONE_ROWS:
        return list(range(batch))
    step = (batch - 1) / (ALONE_ROWS - 1)
    return sorted({round(i * step) for i in range(ALONE_ROWS)})


def _row_difference(reference: Reference, dims: Sequence[int], trial: _Trial,
                    outputs: list[torch.Tensor], reference_outputs: Sequence[torch.Tensor],
                    pool: ChannelPool | None = None, *, wide_checked: bool = False,
                    ) -> _Moved | None:
    """What differs between the trial's kept rows and the rows they must equal (each output
    along its batch dim, ``dims``, channels scaled over ``pool`` too; ``wide_checked``: rows
    alone are compared in float64 as well); None when every output agrees."""
    names = list(reference.entry.outputs.leaf_names())
    batch = trial.inputs[0].shape[0]
    if len(outputs) != len(reference_outputs) or any(
            leaf.dim() <= dim or leaf.shape[dim] != batch for leaf, dim in zip(outputs, dims)):
        shapes = ", ".join("x".join(map(str, leaf.shape)) or "a scalar" for leaf in outputs)
        return _Moved(f"when {trial.what}, the outputs ({shapes}) do not follow its {batch} "
                      f"row(s): they are no row's own{_squeezed(outputs, reference_outputs)}",
                      0, within_noise=False)
    kept, wanted = torch.tensor(trial.kept), torch.tensor(trial.wanted)
    got = [leaf.index_select(dim, kept) for leaf, dim in zip(outputs, dims)]
    want = [leaf.index_select(dim, wanted) for leaf, dim in zip(reference_outputs, dims)]
    structure = structure_difference(got, want, names, sides=("then", "in the reference batch"))
    if structure is not None:
        return _Moved(f"when {trial.what}, {structure}: they are no row's own", 0,
                      within_noise=False)
    noise = reference.entry.noise
    # the same batch size runs the same kernels: each kept value is held to its own
    # magnitude too, which a channel's rows far apart in size would otherwise hide. Another
    # batch size's kernels round a value by float32's resolution of the terms it sums, of
    # the whole output's size (a ReLU channel active in few rows is small, its terms are
    # not): where its values are each held to their own magnitude in float64
    # (``_wide_alone_difference``), a row alone is held here to the largest magnitude of
    # that output over the batch; elsewhere per channel, as the other trials are
    same = not trial.alone
    for output, (name, g, w) in enumerate(zip(names, got, want)):
        whole = _largest(reference_outputs[output]) if trial.alone and wide_checked else None
        agreement = proof_agreement(g, w, noise, pool=pool, output=output, same_kernels=same,
                                    whole=whole)
        bound = proof_bound(noise)
        if not agreement.ok and trial.alone and w.dtype in HALF_CEILING:
            # another batch size runs other kernels: a half-precision output may round
            # differently by a few units of its last place
            bound = max(bound, HALF_CEILING[w.dtype])
            agreement = proof_agreement(g, w, noise, bound=bound, pool=pool, output=output,
                                        same_kernels=same, whole=whole)
        if not agreement.ok:
            return _moved(trial, name, output, agreement, bound, noise)
    return None


def _moved(trial: _Trial, name: str, output: int, agreement: Agreement, bound: float,
           noise: float | None) -> _Moved:
    """A kept value beyond the bound, in words: a row alone that moved no more than the
    model's own float32 rounding (``noise``) is not shown to depend on other rows, only not
    proved independent, and its words say so."""
    change = _change(agreement, bound)
    if trial.alone and noise is not None and agreement.max_rel <= noise:
        return _Moved(f"when {trial.what}, {name} changes {change}, within the model's own "
                      f"float32 rounding (noise {noise:.2g}): not proved independent",
                      output, within_noise=True)
    return _Moved(f"when {trial.what}, {name} of the kept rows changes {change}: each row's "
                  "answer depends on the rows batched with it", output, within_noise=False)


def _squeezed(outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> str:
    """The fix, where an output has fewer dimensions than in the batch (``.squeeze()`` on a
    (B, 1) head drops the batch dimension too at a batch of one)."""
    if len(outputs) == len(reference) and any(
            got.dim() < want.dim() for got, want in zip(outputs, reference)):
        return (" (an output loses a dimension at a batch of one, as `.squeeze()` on a (B, 1) "
                "output does; `.squeeze(-1)` keeps the batch dimension)")
    return ""


def _largest(leaf: torch.Tensor) -> float | None:
    """A float output's largest magnitude (None for another dtype, compared exactly)."""
    if not leaf.is_floating_point() or not leaf.numel():
        return None
    return float(leaf.detach().double().abs().max())


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
