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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..errors import ServeError

Item = TypeVar("Item")

#: Passes of the event loop without a new row after which a group runs (``until_quiet``).
QUIET_PASSES = 2
#: The longest a row waits for company when groups close once quiet (serve's default).
QUIET_BOUND_MS = 10.0


class RowGatherer(Generic[Item]):
    """Items waiting for one call of ``run(items) -> results`` (one result per item, in order;
    a result that is an exception is raised to that item's caller alone)."""

    def __init__(self, run: Callable[[list[Item]], Sequence[Any]], *, max_rows: int,
                 wait_s: float, until_quiet: bool = False) -> None:
        if max_rows < 1 or wait_s < 0:
            raise ServeError(f"a row gatherer needs max_rows >= 1 and wait_s >= 0, got "
                             f"{max_rows} and {wait_s}")
        self._run = run
        self.max_rows = max_rows
        self.wait_s = wait_s
        self.until_quiet = until_quiet
        self._items: list[Item] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._timer: asyncio.Handle | None = None
        self._deadline = 0.0
        self._seen = 0
        self._quiet = 0

    async def submit(self, item: Item) -> Any:
        """``item``'s result, once its group has run."""
        future = asyncio.get_running_loop().create_future()
        self._items.append(item)
        self._futures.append(future)
        if len(self._items) >= self.max_rows:
            self.flush()
        elif self._timer is None:
            self._timer = self._arm(future.get_loop())
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _arm(self, loop: asyncio.AbstractEventLoop) -> asyncio.Handle:
        """What runs the group that the first row just opened."""
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
        ``QUIET_PASSES`` passes or the wait is over; else look again after the next pass."""
        loop = asyncio.get_running_loop()
        self._quiet = 0 if len(self._items) > self._seen else self._quiet + 1
        self._seen = len(self._items)
        if self._quiet < QUIET_PASSES and loop.time() < self._deadline:
            self._timer = loop.call_soon(self._close_when_quiet)
            return
        self.flush()

    def flush(self) -> None:
        """Run every waiting item now (a full group, or the wait is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        if not items:
            return
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
            for future, result in zip(futures, results):
                if not future.done():  # a caller that went away (cancelled) is skipped
                    future.set_result(result)

    @property
    def rule(self) -> str:
        """When a group runs, as ``GET /`` says it."""
        if self.until_quiet:
            return f"when rows stop arriving, at most {self.wait_s * 1000:g} ms after the first"
        return "max_batch_wait_ms after the first row"
