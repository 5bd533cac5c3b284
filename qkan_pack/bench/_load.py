"""HTTP load from several client processes (so that the generator is not the ceiling): each
process runs threads that send single-row POSTs back to back over kept-alive connections and
returns its latencies. Standard library and orjson only; nothing here imports torch, Ray or
the server."""

from __future__ import annotations

import http.client
import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from threading import Thread
from typing import Any

import orjson


@dataclass(frozen=True)
class RowInput:
    """One input of a single-row request: its name, the row's shape (the captured shapes
    without their batch dimension), and what values to send: ``kind`` "float" or "int"
    drawn from ``[low, high)``, or "bool" (JSON booleans: the wire refuses 0/1 for bool)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    low: float = -1.0
    high: float = 1.0
    #: Dims of ``shape`` that take the request's length (``LoadSpec.lengths``): the row's
    #: dims of an artifact's padded length axis.
    varying: tuple[int, ...] = ()


Rows = tuple[RowInput, ...]


@dataclass(frozen=True)
class LoadSpec:
    """One load point: ``clients`` closed-loop clients for ``seconds`` after ``warmup``."""

    host: str
    port: int
    clients: int
    seconds: float
    warmup: float
    rows: Rows
    token: str | None = None
    backoff_s: float = 0.05  # after an error without Retry-After
    body_bytes: int = 0  # > 0: every request is this large (the large-body sender)
    #: (low, high): each request's length drawn uniformly from [low, high] (inclusive) along
    #: the rows' ``varying`` dims; None: the rows' own shapes.
    lengths: tuple[int, int] | None = None


@dataclass
class LoadResult:
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)

    def merge(self, other: LoadResult) -> None:
        self.latencies_ms += other.latencies_ms
        self.statuses.update(other.statuses)


#: Distinct bodies each client cycles through: drawing and encoding a large row (an image)
#: per request would make the load generator the ceiling.
BODIES_PER_CLIENT = 8


def request_body(rows: Rows, rng: random.Random, size: int = 0,
                 lengths: tuple[int, int] | None = None) -> bytes:
    """A single-row request (a batch of one): ``{"inputs": [row]}`` for one input, by name
    for several. ``size``: as many rows as fit in about that many bytes, padded with
    whitespace to exactly ``size`` -- numbers, which is what makes a large body costly to
    parse (whitespace padding alone parses in microseconds and would hide that cost)."""
    if lengths is not None:
        length = rng.randint(*lengths)
        rows = tuple(replace(row, shape=tuple(length if d in row.varying else n
                                              for d, n in enumerate(row.shape)))
                     for row in rows)
    count = 1
    if size:  # bytes per row: two rows' body less one row's (names and brackets cancel)
        per_row = max(1, len(_body(rows, rng, 2)) - len(_body(rows, rng, 1)))
        count = max(1, (size - len(_body(rows, rng, 1))) // per_row + 1)
    while True:
        body = _body(rows, rng, count)
        if len(body) <= size or count == 1:
            return body + b" " * max(0, size - len(body))
        count = max(1, count * 49 // 50)


def _body(rows: Rows, rng: random.Random, count: int) -> bytes:
    values = {row.name: [_draw(row, row.shape, rng) for _ in range(count)] for row in rows}
    return orjson.dumps({"inputs": values if len(rows) > 1 else values[rows[0].name]})


def _draw(row: RowInput, shape: tuple[int, ...], rng: random.Random) -> Any:
    if shape:
        return [_draw(row, shape[1:], rng) for _ in range(shape[0])]
    if row.kind == "bool":
        return rng.random() < 0.5
    if row.kind == "int":
        return rng.randrange(int(row.low), max(int(row.low) + 1, int(row.high)))
    return rng.uniform(row.low, row.high)


def _client(spec: LoadSpec, seed: int, start_at: float, result: LoadResult) -> None:
    rng = random.Random(seed)
    headers = {"Content-Type": "application/json"}
    if spec.token:
        headers["Authorization"] = f"Bearer {spec.token}"
    conn = http.client.HTTPConnection(spec.host, spec.port, timeout=60)
    count = 1 if spec.body_bytes else BODIES_PER_CLIENT  # a large body: one copy
    # A large body's row count is rarely a captured shape: its 422 comes after the parse,
    # which is the load it exists to make, so it counts as answered (no back-off).
    answered = (200, 422) if spec.body_bytes else (200,)
    bodies = [request_body(spec.rows, rng, spec.body_bytes, spec.lengths) for _ in range(count)]
    stop_at = start_at + spec.warmup + spec.seconds
    sent = 0
    while (now := time.time()) < stop_at:
        body = bodies[sent % len(bodies)]
        sent += 1
        began = time.perf_counter()
        try:
            conn.request("POST", "/", body, headers)
            reply = conn.getresponse()
            reply.read()
            status: Any = reply.status
            wait = _retry_after(reply.getheader("Retry-After"), spec.backoff_s)
        except (OSError, http.client.HTTPException) as exc:
            status, wait = type(exc).__name__, spec.backoff_s
            conn.close()
            conn = http.client.HTTPConnection(spec.host, spec.port, timeout=60)
        elapsed = 1000 * (time.perf_counter() - began)
        if now >= start_at + spec.warmup:
            result.statuses[status] += 1
            if status in answered:
                result.latencies_ms.append(elapsed)
        if status not in answered:
            time.sleep(wait)
    conn.close()


def _retry_after(header: str | None, default: float) -> float:
    """A polite client waits as long as ``Retry-After`` says (whole seconds)."""
    try:
        return float(header) if header else default
    except ValueError:
        return default


def _process(spec: LoadSpec, threads: int, first_seed: int, start_at: float) -> LoadResult:
    results = [LoadResult() for _ in range(threads)]
    workers = [Thread(target=_client, args=(spec, first_seed + i, start_at, results[i]), daemon=True)
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    total = LoadResult()
    for result in results:
        total.merge(result)
    return total


def run_load(spec: LoadSpec, processes: int) -> LoadResult:
    """``spec.clients`` clients spread over up to ``processes`` processes, all starting at one
    moment; merged results of the timed part."""
    processes = max(1, min(processes, spec.clients))
    shares = [spec.clients // processes + (i < spec.clients % processes) for i in range(processes)]
    seeds = [sum(shares[:i]) for i in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        start_at = time.time() + 1.0  # the workers import this module meanwhile
        parts = pool.starmap(_process, [(spec, n, s, start_at) for n, s in zip(shares, seeds)])
    total = LoadResult()
    for part in parts:
        total.merge(part)
    return total
