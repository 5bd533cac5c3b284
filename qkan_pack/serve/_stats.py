"""A replica's counters: what ``GET /stats`` shows and what ``GET /metrics`` exports
(``_metrics`` turns a ``snapshot`` into Prometheus families at scrape time).

Requests by kind (how they were handled: rows, direct, rejected...), inference requests by
protocol and outcome with their latency, queue waits, replays per captured shape with their
duration, rows per replay, and what each replay computed for nothing (filler rows, padded
elements). Every count only grows; ``POST /stats/reset`` moves the baseline ``GET /stats``
subtracts, so Prometheus never sees a counter go back.

Why plain numbers and not prometheus_client's metric objects on the request path: a bound
``Histogram.observe`` costs about seven times a bucket increment here (each takes its own
lock), and a request records several; the families are built once per scrape instead.
Updated from the event loop and from replay threads, hence the lock.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

REQUEST_KINDS = ("rows", "direct", "rejected", "overloaded", "unauthorized", "abandoned")
#: Inference requests' outcomes (``GET /metrics``): a reply, a client error (4xx but 401), a
#: missing or wrong token, a full replica (503), the server's own failure (5xx).
OUTCOMES = ("success", "client_error", "unauthorized", "overloaded", "server_error")
#: Bounds (seconds) of the latency histograms: 100 us to 10 s.
SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def outcome_of(status: int) -> str:
    """An HTTP status as an outcome (``OUTCOMES``)."""
    if status < 400:
        return "success"
    if status == 401:
        return "unauthorized"
    if status == 503:
        return "overloaded"
    return "client_error" if status < 500 else "server_error"


class Buckets:
    """A histogram's data as plain numbers: observations per bucket (value at most each bound,
    and one beyond the last), their count and sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = SECONDS_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> Buckets:
        twin = Buckets(self.bounds)
        twin.counts, twin.total = list(self.counts), self.total
        return twin


@dataclass(frozen=True)
class Entry:
    """A captured shape as a replay computes it: its batch rows and input elements (all
    inputs), so a replay of fewer rows or shorter ones knows what it computed for nothing."""

    rows: int
    elements: int


class _Shape:
    """One captured shape's replay counters (attributes: no tuple keys on the request path)."""

    __slots__ = ("elements", "entry", "filler", "padding", "rows", "seconds")

    def __init__(self, entry: Entry | None) -> None:
        self.entry, self.seconds = entry, Buckets()
        self.rows = self.filler = self.elements = self.padding = 0


@dataclass
class Snapshot:
    """The counters at one moment (copies: the replica keeps counting)."""

    requests: Counter[str]
    answered: Counter[tuple[str, str]]
    latency: dict[str, Buckets]
    queue: Buckets
    replays: Counter[str]
    replay_seconds: dict[str, Buckets]
    rows_per_replay: Counter[int]
    rows: Counter[tuple[str, str]]
    elements: Counter[tuple[str, str]]
    direct: Counter[str]
    labels: list[str] = field(default_factory=list)
    #: When the last inference request succeeded (Unix time; 0: none yet).
    last_success: float = 0.0


class ReplicaStats:
    """Counters since the replica started; ``view`` reads them since the last reset."""

    def __init__(self, labels: Sequence[str], entries: Mapping[str, Entry] | None = None) -> None:
        self._labels = list(labels)
        #: Each captured shape's batch rows and input elements, by label.
        self.entries = dict(entries or {"": Entry(1, 1)})
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._answered: Counter[tuple[str, str]] = Counter()
        self._latency: dict[str, Buckets] = {}
        self._queue = Buckets()
        self._shapes: dict[str, _Shape] = {}
        self._rows_per_replay: Counter[int] = Counter()
        self._direct: Counter[str] = Counter()
        self._last_success = 0.0
        self._baseline = self._copy()
        self._since = time.time()

    # -- the request path ------------------------------------------------------------

    def request(self, kind: str, shape: str | None = None) -> None:
        with self._lock:
            self._requests[kind] += 1
            if shape is not None:
                self._direct[shape] += 1

    def answered(self, protocol: str, outcome: str, seconds: float) -> None:
        """An inference request's outcome (``OUTCOMES``) over ``protocol``; a success's
        latency (from the handler's start to its reply) goes to the histogram."""
        with self._lock:
            self._answered[protocol, outcome] += 1
            if outcome == "success":
                self._last_success = time.time()
                buckets = self._latency.get(protocol)
                if buckets is None:
                    buckets = self._latency[protocol] = Buckets()
                buckets.counts[bisect_left(buckets.bounds, seconds)] += 1
                buckets.total += seconds

    def waited(self, seconds: Iterable[float]) -> None:
        """Each request's wait in the batcher before its replay (0: it replayed at once)."""
        queue = self._queue
        counts, bounds = queue.counts, queue.bounds
        with self._lock:
            for value in seconds:
                counts[bisect_left(bounds, value)] += 1
                queue.total += value

    def replay(self, label: str, rows: int, seconds: float = 0.0,
               elements: int | None = None) -> None:
        """One replay of captured shape ``label`` carrying ``rows`` requests' rows and
        ``elements`` of their input elements (None: whole rows of the shape's own size);
        the rest of the shape was computed for nothing."""
        shape = self._shapes.get(label)
        if shape is None:
            shape = self._shapes.setdefault(label, _Shape(self.entries.get(label)))
        entry, buckets = shape.entry, shape.seconds
        with self._lock:
            self._rows_per_replay[rows] += 1
            buckets.counts[bisect_left(buckets.bounds, seconds)] += 1
            buckets.total += seconds
            if entry is None:
                return
            if elements is None:
                elements = entry.elements * rows // max(1, entry.rows)
            shape.rows += rows
            shape.filler += max(0, entry.rows - rows)
            shape.elements += elements
            shape.padding += max(0, entry.elements - elements)

    # -- readers ---------------------------------------------------------------------

    def _copy(self) -> Snapshot:
        shapes = self._shapes.items()
        rows: Counter[tuple[str, str]] = Counter()
        elements: Counter[tuple[str, str]] = Counter()
        for label, shape in shapes:
            if shape.entry is not None:
                rows[label, "request"], rows[label, "filler"] = shape.rows, shape.filler
                elements[label, "request"] = shape.elements
                elements[label, "padding"] = shape.padding
        return Snapshot(
            requests=Counter(self._requests), answered=Counter(self._answered),
            latency={k: b.copy() for k, b in self._latency.items()}, queue=self._queue.copy(),
            replays=Counter({label: sum(shape.seconds.counts) for label, shape in shapes}),
            replay_seconds={label: shape.seconds.copy() for label, shape in shapes},
            rows_per_replay=Counter(self._rows_per_replay), rows=rows, elements=elements,
            direct=Counter(self._direct), labels=list(self._labels),
            last_success=self._last_success)

    def snapshot(self) -> Snapshot:
        """Every counter since the replica started (what ``/metrics`` exports)."""
        with self._lock:
            return self._copy()

    def view(self, *, reset: bool = False) -> dict[str, Any]:
        """A JSON-ready view since the last reset (``reset`` starts a new one after
        reading; the totals ``snapshot`` reads go on)."""
        with self._lock:
            now, base = self._copy(), self._baseline
            rows = now.rows_per_replay - base.rows_per_replay
            replays = now.replays - base.replays
            requests = now.requests - base.requests
            snapshot = {
                "requests": {k: requests.get(k, 0) for k in REQUEST_KINDS},
                "replays": {label: replays.get(label, 0) for label in self._labels},
                "rows_per_replay": {str(k): v for k, v in sorted(rows.items())},
                "rows_replayed": sum(k * v for k, v in rows.items()),
                "direct_shapes": dict(now.direct - base.direct),
                "seconds": round(time.time() - self._since, 3),
            }
            if reset:
                self._baseline, self._since = now, time.time()
        return snapshot
