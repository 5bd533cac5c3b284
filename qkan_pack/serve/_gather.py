"""Single rows gathered into one replay: the replica's batcher.

A group of rows runs when it holds ``max_rows`` rows, or ``wait_s`` after its first row, or
(``until_quiet``, serve's default) as soon as ``QUIET_PASSES`` passes of the event loop
brought it no new row, whichever comes first. Until quiet, every request that was on its
way has joined and nothing is gained by waiting, so a lone row waits only those few passes
(microseconds); two passes, not one, because a request that arrives in a pass joins in the
next (its task's first step is scheduled, not run). Without ``until_quiet`` a group always
waits ``wait_s`` for company, as Ray Serve's ``@serve.batch`` does (``--max-batch-wait-ms``).
The whole group is handed to ``run`` at once, on the event loop: a GPU replay takes
microseconds and a thread hop would cost more.

Why close on a quiet pass rather than on a timer alone: a replica's requests reach this
point a few at a time, each after Ray's own per-request work on the same loop. A short
timer closes groups holding a fraction of the requests in flight, and the extra replays
cost more loop time than they save; closing when arrivals stop fills the group with
everything in flight (measurements:
``benchmarks/results/2026-12-04_h200_serve-at-cf7e86e_timer-gatherer.txt``).

Why not Ray Serve's ``@serve.batch``: it is made for any method, so every call binds its
arguments against the body's signature, wraps them in a request object, goes through a queue
and a batch-forming task; on the replica's one event loop that is the largest item in a
request's cost (profile: ``benchmarks/results/2026-12-04_cpu_replica-microbench.md``). Here
a row costs a list append and a future, and everything else is paid once per replay.

Paced rows (gRPC). HTTP requests reach the loop together: one ``select`` finds every
connection that has a request, and their tasks all run in the next pass. gRPC requests do
not: grpc's asyncio server (Ray's gRPC ingress) asks its core for one call at a time, and
each call, then its message, crosses from gRPC's poller thread to the loop through a socket
before the next is asked for, so requests that are all waiting in gRPC reach the loop one
by one, with passes without a new row between them, and the quiet rule ran each alone
(traces and profile: ``benchmarks/results/2026-12-06_cpu_grpc-rows-per-replay.md``). A
group holding a paced row
therefore also stays open until no paced row came for ``LINGER_GAPS`` times the recent
median gap between paced rows (``ArrivalPacing``; the loop sleeps meanwhile), within the same
bound. A lone client would pay that wait on every request: after ``MISSES_TO_REST`` held
groups in a row that no other row joined, groups are held only once per ``PROBE_EVERY_S``,
until one finds company again.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..errors import ServeError

Item = TypeVar("Item")

#: Passes of the event loop without a new row after which a group runs (``until_quiet``).
QUIET_PASSES = 2
#: The longest a row waits for company when groups close once quiet (serve's default).
QUIET_BOUND_MS = 10.0
#: A group holding a paced row waits this many median gaps between paced rows for the next.
LINGER_GAPS = 3
#: Gaps between paced rows remembered for the median, and how many new ones renew it.
PACED_GAPS = 32
MEDIAN_EVERY = 8
#: Held groups in a row that no other row joined, after which holding rests (one client).
MISSES_TO_REST = 8
#: While holding rests, one group is held at most this often, to see whether company came.
PROBE_EVERY_S = 0.1


class ArrivalPacing:
    """How long a group waits for the next paced row (see the module docstring): the gaps
    between paced rows (from the previous paced row, or from the end of the last run when
    that came later: a replay holds the loop, and no row can arrive during it), and whether
    holding found company."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._gaps: deque[float] = deque(maxlen=PACED_GAPS)
        self._since: float | None = None
        self._misses = 0
        self._next_probe = 0.0
        self._linger = 0.0
        self._fresh = MEDIAN_EVERY - 1  # the first gap sets the wait at once

    def arrived(self, now: float) -> float:
        """A paced row arrived at ``now`` (``time.perf_counter``): how long its group should
        stay open for the next one (0: not at all)."""
        gap = None if self._since is None else now - self._since
        self._since = now
        if gap is not None and gap < self.bound_s:
            self._gaps.append(gap)
            self._fresh += 1
            if self._fresh >= MEDIAN_EVERY:
                self._fresh = 0
                ordered = sorted(self._gaps)
                self._linger = min(self.bound_s, LINGER_GAPS * ordered[len(ordered) // 2])
        if self._misses >= MISSES_TO_REST:
            if now < self._next_probe:
                return 0.0
            self._next_probe = now + PROBE_EVERY_S
        return self._linger

    @property
    def paced(self) -> bool:
        """Whether a paced row ever came (else runs need not be timed)."""
        return self._since is not None

    def ran(self, now: float) -> None:
        """A run ended at ``now``: the next gap counts from here."""
        self._since = now

    def closed(self, rows: int) -> None:
        """A held group ran with ``rows`` rows: company found, or a miss."""
        self._misses = 0 if rows > 1 else self._misses + 1


class RowGatherer(Generic[Item]):
    """Items waiting for one call of ``run(items) -> results`` (one result per item, in order;
    a result that is an exception is raised to that item's caller alone)."""

    def __init__(self, run: Callable[[list[Item]], Sequence[Any]], *, max_rows: int,
                 wait_s: float, until_quiet: bool = False,
                 waited: Callable[[list[float]], None] | None = None) -> None:
        """``waited``: told, as each group runs, how long each of its items waited (seconds)."""
        if max_rows < 1 or wait_s < 0:
            raise ServeError(f"a row gatherer needs max_rows >= 1 and wait_s >= 0, got "
                             f"{max_rows} and {wait_s}")
        self._run = run
        self.max_rows = max_rows
        self.wait_s = wait_s
        self.until_quiet = until_quiet
        self._items: list[Item] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._arrivals: list[float] = []  # time.perf_counter() of each item's submit
        self._waited = waited
        self._timer: asyncio.Handle | None = None
        self._deadline = 0.0
        self._seen = 0
        self._quiet = 0
        #: Paced rows' waits (``until_quiet`` only: a fixed wait holds every group anyway).
        self.pacing = ArrivalPacing(wait_s) if until_quiet else None
        self._hold_until = 0.0  # time.perf_counter(): a paced row's group stays open until then
        self._held = False

    async def submit(self, item: Item, *, paced: bool = False) -> Any:
        """``item``'s result, once its group has run. ``paced``: the item came over a
        transport that hands requests to the loop one at a time (gRPC; module docstring)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        now = time.perf_counter()
        linger = self.pacing.arrived(now) if paced and self.pacing is not None else 0.0
        self._items.append(item)
        self._futures.append(future)
        self._arrivals.append(now)
        if len(self._items) >= self.max_rows:
            self.flush()
        else:
            if self._timer is None:
                self._timer = self._arm(loop)
            if linger > 0:
                self._hold_until = max(self._hold_until, now + linger)
                self._held = True
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _arm(self, loop: asyncio.AbstractEventLoop) -> asyncio.Handle:
        """What runs the group that the first row just opened."""
        self._hold_until, self._held = 0.0, False
        if self.until_quiet:
            self._deadline = loop.time() + self.wait_s
            self._seen = len(self._items)
            self._quiet = 0
            return loop.call_soon(self._close_when_quiet)
        if self.wait_s > 0:
            return loop.call_later(self.wait_s, self.flush)
        return loop.call_soon(self.flush)

    def _close_when_quiet(self) -> None:
        """After each pass of the loop: run the group once it has been quiet for
        ``QUIET_PASSES`` passes (and a paced row's hold is over) or the wait is over; else
        look again after the next pass, or when the hold ends (the loop sleeps meanwhile,
        and wakes for any row that arrives)."""
        loop = asyncio.get_running_loop()
        self._quiet = 0 if len(self._items) > self._seen else self._quiet + 1
        self._seen = len(self._items)
        if self._quiet < QUIET_PASSES:
            if loop.time() < self._deadline:
                self._timer = loop.call_soon(self._close_when_quiet)
                return
        elif self._held:
            hold, left = self._hold_until - time.perf_counter(), self._deadline - loop.time()
            if hold > 0 and left > 0:
                self._timer = loop.call_later(min(hold, left), self._close_when_quiet)
                return
        self.flush()

    def flush(self) -> None:
        """Run every waiting item now (a full group, or the wait is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, futures, arrivals = self._items, self._futures, self._arrivals
        self._items, self._futures, self._arrivals = [], [], []
        if not items:
            return
        if self._waited is not None:
            started = time.perf_counter()
            self._waited([started - arrived for arrived in arrivals])
        if self._held:
            self._held = False
            if self.pacing is not None:
                self.pacing.closed(len(items))
        results: Sequence[Any] = []
        try:
            results = list(self._run(items))
            if len(results) != len(items):
                raise RuntimeError(f"the batch body gave {len(results)} results for "
                                   f"{len(items)} rows")
        except BaseException as exc:  # never leave a caller waiting, whatever was raised
            results = [exc] * len(items)
            if not isinstance(exc, Exception):
                raise  # (KeyboardInterrupt, ...) after the callers are answered, below
        finally:
            if self.pacing is not None and self.pacing.paced:
                self.pacing.ran(time.perf_counter())
            for future, result in zip(futures, results):
                if not future.done():  # a caller that went away (cancelled) is skipped
                    future.set_result(result)

    @property
    def rule(self) -> str:
        """When a group runs, as ``GET /`` says it."""
        if self.until_quiet:
            return f"when rows stop arriving, at most {self.wait_s * 1000:g} ms after the first"
        return "max_batch_wait_ms after the first row"
