"""Single rows gathered into one replay: the replica's batcher.

A row waits until ``max_rows`` rows are waiting or ``wait_s`` has passed since the first of
them (``wait_s = 0``: until the event loop has run what is ready now, so rows that arrived
together share a replay and a lone row waits for nothing). Then the whole group is handed to
``run`` at once, on the event loop: a GPU replay takes microseconds and a thread hop would
cost more.

Why not Ray Serve's ``@serve.batch``: it is made for any method, so every call binds its
arguments against the body's signature, wraps them in a request object, goes through a queue
and a batch-forming task; on the replica's one event loop that was the largest item in a
request's cost (profile in ``benchmarks/results/2026-12-04_cpu_replica-microbench.md``). Here
a row costs a list append and a future, and everything else is paid once per replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")


class RowGatherer(Generic[Item]):
    """Items waiting for one call of ``run(items) -> results`` (one result per item, in order;
    a result that is an exception is raised to that item's caller alone)."""

    def __init__(self, run: Callable[[list[Item]], Sequence[Any]], *, max_rows: int,
                 wait_s: float) -> None:
        if max_rows < 1 or wait_s < 0:
            raise ValueError(f"need max_rows >= 1 and wait_s >= 0, got {max_rows}, {wait_s}")
        self._run = run
        self.max_rows = max_rows
        self.wait_s = wait_s
        self._items: list[Item] = []
        self._futures: list[asyncio.Future[Any]] = []
        self._timer: asyncio.Handle | None = None

    async def submit(self, item: Item) -> Any:
        """``item``'s result, once its group has run."""
        future = asyncio.get_running_loop().create_future()
        self._items.append(item)
        self._futures.append(future)
        if len(self._items) >= self.max_rows:
            self.flush()
        elif self._timer is None:
            self._timer = self._schedule(future.get_loop())
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> asyncio.Handle:
        if self.wait_s > 0:
            return loop.call_later(self.wait_s, self.flush)
        return loop.call_soon(self.flush)

    def flush(self) -> None:
        """Run every waiting item now (a full group, or the wait is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        items, futures = self._items, self._futures
        self._items, self._futures = [], []
        if not items:
            return
        try:
            results = self._run(items)
        except Exception as exc:  # never leave a caller waiting
            results = [exc] * len(items)
        if len(results) != len(items):
            results = [RuntimeError(f"the batch body gave {len(results)} results for "
                                    f"{len(items)} rows")] * len(items)
        for future, result in zip(futures, results):
            if not future.done():  # a caller that went away (cancelled) is skipped
                future.set_result(result)
