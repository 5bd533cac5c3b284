"""The model half of a replica: one ``Predictor``, requests fitted to its inputs, single rows
gathered (``_gather.RowGatherer``) into captured shapes whose rows build proved independent
(else, and with ``exact``, each request replayed alone; a failed replay of several rows
replayed row by row, so that only the rows that fail alone fail), counters. No HTTP and no
Ray here: the handle and the HTTP API both call ``infer``."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, ServeError
from ._gather import QUIET_BOUND_MS, RowGatherer
from ._ragged import RaggedPlan, RaggedRow
from ._rows import (
    Tail,
    captured_batch,
    dependent_rows,
    mixes_requests,
    route_table,
    row_plan,
    unrouted,
)
from ._stats import Entry, ReplicaStats
from ._wire import (
    Given,
    check_index_bounds,
    fit,
    given_from_python,
    host_outputs,
    map_leaves,
    to_tensor,
    torch_module,
)

if TYPE_CHECKING:
    from ..format import Manifest
    from ..runtime import Predictor

#: Multi-row requests at least this large replay in a worker thread, so that a big replay
#: on a CPU replica does not hold up the event loop (and every small request behind it).
THREAD_ROWS = 64


def _halves(items: list[int]) -> list[list[int]]:
    """``items`` in two halves (the first the larger)."""
    middle = (len(items) + 1) // 2
    return [items[:middle], items[middle:]]


def own_copy(share: Any) -> Any:
    """A row's share of a batch's output as an array or tensor of its own: a slice is a view
    of the whole batch, which a tensor carries when it is pickled (a Ray handle's reply) and
    numpy keeps as ``.base``: every other client's row with it."""
    return share.copy() if isinstance(share, np.ndarray) else share.clone()


def _filled(parts: Sequence[np.ndarray], batch: int) -> np.ndarray:
    """One input's rows stacked, then copies of the first row up to ``batch`` rows."""
    missing = batch - len(parts)
    if missing:
        parts = [*parts, np.broadcast_to(parts[0], (missing, *parts[0].shape[1:]))]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def replay_entries(manifest: Manifest) -> dict[str, Entry]:
    """Each captured shape's batch rows and input elements, for what a replay of fewer or
    shorter rows computed for nothing (``ReplicaStats.replay``)."""
    def rows(shapes: list[tuple[int, ...]]) -> int:
        firsts = {shape[0] for shape in shapes if shape}
        return firsts.pop() if len(firsts) == 1 and all(shapes) else 1

    return {e.label: Entry(rows([tuple(s) for _, s in e.inputs]),
                           sum(math.prod(s) for _, s in e.inputs)) for e in manifest.shapes}


def _elements(arrays: Sequence[np.ndarray]) -> int:
    return sum(a.size for a in arrays)


@dataclass
class _Row:
    arrays: list[np.ndarray]
    tail: Tail


class ModelCore:
    """Fit, route, batch and replay; counts what it did in ``stats``."""

    def __init__(self, predictor: Predictor, *, max_batch_size: int,
                 max_batch_wait_ms: float | None, exact: bool) -> None:
        """``max_batch_wait_ms`` None: groups close once rows stop arriving (at most
        ``QUIET_BOUND_MS``); a number: every group waits that long for company."""
        manifest = predictor.manifest
        self.predictor = predictor
        self.names = manifest.input_names
        self._name_set = frozenset(self.names)
        self._dtypes = tuple(d.dtype for d in manifest.inputs)
        self._bounds = tuple(d.index_bounds for d in manifest.inputs)
        self.plan = row_plan(manifest)
        self._dependent = dependent_rows(manifest)
        self._exact_shapes = {tuple(s for _, s in e.inputs): e.label for e in manifest.shapes}
        self._routes = route_table(self.plan, self._exact_shapes)
        self.accepted = manifest.signatures()
        self.exact = exact
        self.max_batch_size = 1 if exact else max_batch_size
        self._ragged = RaggedPlan(manifest) if manifest.padding is not None else None
        self._labels = [e.label for e in manifest.shapes]
        self.stats = ReplicaStats(self._labels if self._ragged is not None else
                                  [label for sizes in self.plan.values() for _, label in sizes],
                                  replay_entries(manifest))
        self.fault: str | None = None
        quiet = max_batch_wait_ms is None
        body: Callable[[list[Any]], list[Any]] = self._run_rows
        rows = self.max_batch_size
        if self._ragged is not None:
            body, rows = self._run_ragged, min(self.max_batch_size, self._ragged.max_rows)
        #: Rows of different requests share a replay only in entries proved row-independent.
        self.mixes = not exact and mixes_requests(manifest) and (
            self._ragged is None or self._ragged.rows_proved)
        self._gatherer: RowGatherer[Any] | None = RowGatherer(
            body, max_rows=max(1, rows), until_quiet=quiet, waited=self.stats.waited,
            wait_s=(QUIET_BOUND_MS if max_batch_wait_ms is None else max_batch_wait_ms) / 1000
        ) if self.mixes else None
        self.batch_rule = (self._gatherer.rule if self._gatherer is not None else
                           "never: each request replays alone (exact)" if exact else
                           "never: each request replays alone (no captured shape's rows were "
                           "proved independent at build)")

    def given(self, inputs: tuple, named: Mapping[str, Any]) -> dict[str, Given]:
        """Handle arguments (positional and/or by name) as wire inputs."""
        if len(inputs) > len(self.names):
            raise InputError(f"expected {len(self.names)} input(s) {list(self.names)}, "
                             f"got {len(inputs)}", accepted=self.accepted)
        given = {n: given_from_python(v, f"input {n!r}") for n, v in zip(self.names, inputs)}
        clash = sorted(set(given) & set(named))
        if clash:
            raise InputError(f"input(s) {clash} given both by position and by name")
        given.update({n: given_from_python(v, f"input {n!r}") for n, v in named.items()})
        return given

    async def infer(self, given: Mapping[str, Given], *, paced: bool = False) -> Any:
        """Outputs (``host_outputs``: numpy arrays) for one request: a single row joins a
        batch (alone when ``exact``), a captured shape passes through; anything else is an
        ``InputError``. ``paced``: the request came over gRPC, whose requests reach the loop
        one at a time (``RowGatherer.submit``)."""
        try:
            arrays = self._fit(given)
            shapes = tuple(a.shape for a in arrays)
            if self._ragged is not None:
                return await self._infer_ragged(arrays, shapes, paced)
            way = self._routes.get(shapes)
            if way is None:
                raise unrouted(shapes, self.plan, self.predictor.manifest, self._dependent)
        except InputError:
            self.stats.request("rejected")
            raise
        if way.tail is None:
            label = self._exact_shapes[shapes]
            self.stats.request("direct", label)
            return await self._replay_whole(arrays, label)
        if way.squeezed:
            arrays = [a[None] for a in arrays]
        self.stats.request("rows")
        if self._gatherer is None:  # the row replays alone, in the smallest entry it fits
            self.stats.waited((0.0,))
            out = self._run_rows([_Row(arrays, way.tail)])[0]
            if isinstance(out, BaseException):
                raise out
        else:
            out = await self._gatherer.submit(_Row(arrays, way.tail), paced=paced)
        # [0, ...]: a row's share of a per-row output is a 0-d array (a numpy scalar would
        # lose its array type, and the handle could not give it back as a tensor)
        return map_leaves(lambda t: t[0, ...], out) if way.squeezed else out

    async def _infer_ragged(self, arrays: list[np.ndarray], shapes: tuple, paced: bool) -> Any:
        """A request of an artifact with declared padding that is not a captured shape: a
        single row joins a ragged group (``_ragged``); a larger request that fits replays
        alone, padded by the predictor. ``InputError`` stays the caller's to count."""
        assert self._ragged is not None
        found = self._ragged.row(arrays)
        if found is None:
            entry = self._ragged.entry(shapes)
            if entry is None:
                raise self._ragged.refuse(shapes)
            self.stats.request("direct", self._exact_shapes.get(shapes, "padded"))
            return await self._replay_whole(arrays, self._label(entry))
        row, squeezed = found
        self.stats.request("rows")
        if self._gatherer is None:  # the row replays alone, padded by the predictor
            self.stats.waited((0.0,))
            started = time.perf_counter()
            out = self._ragged.share(self.replay(row.arrays), 0, row, squeezed)
            self.stats.replay(self._label(self._ragged.entry_of([row])), 1,
                              time.perf_counter() - started, _elements(row.arrays))
            return out
        return await self._gatherer.submit((row, squeezed), paced=paced)

    async def _replay_whole(self, arrays: list[np.ndarray], label: str) -> Any:
        """A whole request in its captured shape ``label`` (padded into it by the predictor
        when it is smaller along declared axes): in a worker thread when it is large."""
        rows = arrays[0].shape[0] if arrays[0].ndim else 1
        self.stats.waited((0.0,))
        started = time.perf_counter()
        if rows >= THREAD_ROWS:
            out = await asyncio.to_thread(self.replay, arrays)
        else:
            out = self.replay(arrays)
        self.stats.replay(label, rows, time.perf_counter() - started, _elements(arrays))
        return out

    def _run_ragged(self, submitted: list[tuple[RaggedRow, bool]]) -> list[Any]:
        """The gatherer's body for ragged rows (each with whether it came without its batch
        dimension): per chunk, pad to the longest row, stack, replay, give each row its own
        share."""
        assert self._ragged is not None
        results: list[Any] = [None] * len(submitted)
        for chunk, entry in self._ragged.chunks([row for row, _ in submitted]):
            self._replay_ragged(submitted, chunk, entry, results)
        return results

    def _replay_ragged(self, submitted: Sequence[tuple[RaggedRow, bool]], chunk: list[int],
                       entry: int | None, results: list[Any]) -> None:
        """One replay of the ``chunk`` rows of ``submitted``, padded into ``entry``; each
        row alone again when it fails (``_retry_alone``)."""
        assert self._ragged is not None
        members = [submitted[i][0] for i in chunk]
        started = time.perf_counter()
        try:
            out = self.replay(self._ragged.stack(members))
        except Exception as exc:
            if self._retry_alone(exc, chunk, results):
                for half in _halves(chunk):
                    rows = [submitted[i][0] for i in half]
                    self._replay_ragged(submitted, half, self._ragged.entry_of(rows), results)
            return
        self.stats.replay(self._label(entry), len(members), time.perf_counter() - started,
                          sum(_elements(m.arrays) for m in members))
        for j, i in enumerate(chunk):
            results[i] = self._ragged.share(out, j, members[j], squeezed=submitted[i][1])

    def _label(self, entry: int | None) -> str:
        return self._labels[entry] if entry is not None else "padded"

    def _fit(self, given: Mapping[str, Given]) -> list[np.ndarray]:
        if given.keys() != self._name_set:
            unknown = sorted(set(given) - self._name_set)
            missing = [n for n in self.names if n not in given]
            raise InputError(f"inputs must be exactly {list(self.names)}; "
                             f"unknown {unknown}, missing {missing}", accepted=self.accepted)
        return [check_index_bounds(fit(given[n], n, d, self.accepted), n, bounds, self.accepted)
                for n, d, bounds in zip(self.names, self._dtypes, self._bounds)]

    def _run_rows(self, rows: list[_Row]) -> list[Any]:
        """The gatherer's body: per row shape, stack into captured batches, replay, split
        (a row that fails alone gets its exception as its result: ``_retry_alone``)."""
        results: list[Any] = [None] * len(rows)
        groups: dict[Tail, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(row.tail, []).append(i)
        for tail, members in groups.items():
            sizes = self.plan[tail]
            for start in range(0, len(members), sizes[-1][0]):
                chunk = members[start:start + sizes[-1][0]]
                self._replay_chunk([rows[i] for i in chunk], sizes, chunk, results)
        return results

    def _replay_chunk(self, rows: Sequence[_Row], sizes: Sequence[tuple[int, str]],
                      slots: Sequence[int], results: list[Any]) -> None:
        """One replay of ``rows`` in the smallest captured batch that holds them, the batch
        filled with copies of the first row (``row_plan`` offers a larger batch only where
        build proved rows independent, with such copies among the neighbours it tried); each
        row alone again when it fails (``_retry_alone``)."""
        batch, label = captured_batch(sizes, len(rows))
        stacked = [_filled(parts, batch) for parts in zip(*(row.arrays for row in rows))]
        started = time.perf_counter()
        try:
            out = self.replay(stacked)
        except Exception as exc:
            if self._retry_alone(exc, slots, results):
                for half in _halves(list(range(len(rows)))):
                    self._replay_chunk([rows[j] for j in half], sizes, [slots[j] for j in half],
                                       results)
            return
        self.stats.replay(label, len(rows), time.perf_counter() - started)
        for j, i in enumerate(slots):
            results[i] = map_leaves(lambda t, j=j: own_copy(t[j:j + 1]), out)

    def _retry_alone(self, exc: Exception, slots: Sequence[int], results: list[Any]) -> bool:
        """After a failed replay of the rows at ``slots``: whether to replay them again in
        two halves (``_halves``: down to rows alone, so that only the rows that fail alone
        fail, each with its own error, at about 2 log2(rows) replays for one bad row rather
        than one replay per row). One client's bad input (an id past a one-hot's classes)
        must neither fail the requests batched with it nor show them its error text, which
        may quote its values. Not after a device error (``fault``: the replica is unhealthy,
        Ray replaces it, and no further replay on it can be trusted), nor for a single row:
        then every row gets ``exc``."""
        if len(slots) > 1 and self.fault is None:
            return True
        for i in slots:
            results[i] = exc
        return False

    def replay(self, arrays: Sequence[np.ndarray]) -> Any:
        """One predictor call on ``fit`` arrays, outputs as ``host_outputs``; a device error
        marks the replica unhealthy (Ray replaces it)."""
        try:
            return host_outputs(self.predictor(*map(to_tensor, arrays, self._dtypes)))
        except InputError:
            raise
        except Exception as exc:
            if self.predictor.device.type == "cuda":
                self.fault = f"{type(exc).__name__}: {exc}"
            raise

    def gpu_memory(self) -> dict[str, int]:
        """The CUDA memory this process holds on the predictor's device (``allocated``,
        ``reserved``), as torch counts it; empty off CUDA."""
        device = self.predictor.device
        if device.type != "cuda":
            return {}
        cuda = torch_module().cuda
        return {"allocated": int(cuda.memory_allocated(device)),
                "reserved": int(cuda.memory_reserved(device))}

    def check_health(self) -> None:
        """Unhealthy after a device error in a replay; on CUDA also sync the device, which
        surfaces a dead context."""
        if self.fault is not None:
            raise ServeError(f"replica is unhealthy after a device error: {self.fault}",
                             hint="Ray Serve replaces it")
        if self.predictor.device.type == "cuda":
            torch_module().cuda.synchronize(self.predictor.device)
