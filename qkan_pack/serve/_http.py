"""The HTTP API of a replica: bearer-token check, bounded admission, body limits, routes.
Every reply, errors included, is a JSON body (``_wire.dumps``).

Routes (under the route prefix): ``GET /`` describes the artifact and replica, ``POST /``
predicts, ``GET /stats`` reads this replica's counters, ``POST /stats/reset`` zeroes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import InputError, MalformedRequestError, OverloadedError
from ._wire import dumps, encode_outputs, parse_request

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request
    from starlette.responses import Response

    from ._model import ModelCore

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
#: Bodies at least this large are parsed and their replies encoded in a worker thread, so a
#: big body never holds the event loop that every small request needs.
INLINE_PARSE_BYTES = 64 * 1024
logger = logging.getLogger(__name__)


def token_digest(token: str) -> str:
    """What replicas keep instead of the token (it never enters Ray's state)."""
    return hashlib.sha256(token.encode()).hexdigest()


#: Fewest requests a replica works on at once by default (a batch of one still overlaps
#: parsing the next requests with the replay).
MIN_DEFAULT_ONGOING = 8


@dataclass(frozen=True)
class HttpLimits:
    """Per-replica request limits (see ``build_app``). ``max_ongoing``/``max_queued`` None:
    derived from the replica's batch size (``with_admission``)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = 30.0
    max_ongoing: int | None = None
    max_queued: int | None = None
    retry_after_s: int = 1
    token_sha256: str | None = None

    def with_admission(self, batch_rows: int) -> HttpLimits:
        """Unset bounds filled in: at work, one full batch (at least ``MIN_DEFAULT_ONGOING``);
        waiting, half as many. Measured on an H200 (1 replica of a 32-row model, 4x the
        saturating 32 clients): bounds near the saturation point held throughput (1.02x) and
        accepted p99 (1.74x), where 64 + 64 let every request in and p99 rose 6x."""
        ongoing, queued = self.admission_bounds(batch_rows)
        return replace(self, max_ongoing=ongoing, max_queued=queued)

    def admission_bounds(self, batch_rows: int) -> tuple[int, int]:
        """(at work, waiting): the bounds set, else derived as ``with_admission`` says."""
        ongoing = self.max_ongoing or max(batch_rows, MIN_DEFAULT_ONGOING)
        return ongoing, self.max_queued if self.max_queued is not None else ongoing // 2


class Admission:
    """At most ``ongoing`` requests at work and ``queued`` waiting; the rest are refused at
    once (an unbounded queue is what made latency collapse under load)."""

    def __init__(self, ongoing: int, queued: int) -> None:
        self._ongoing = ongoing
        self._free = ongoing
        self._queued = queued
        self._waiters: list[asyncio.Future[None]] = []

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._free > 0:
            self._free -= 1
        elif len(self._waiters) >= self._queued:
            raise OverloadedError(ongoing=self._ongoing, queued=len(self._waiters))
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # the releasing request hands its slot over
            except asyncio.CancelledError:
                self._drop(waiter)
                raise
        try:
            yield
        finally:
            self._release()

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        elif waiter.done() and not waiter.cancelled():
            self._release()  # it was handed a slot it will not use

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class HttpApi:
    """Dispatches one starlette request; owns no model state (``ModelCore`` does)."""

    def __init__(self, core: ModelCore, limits: HttpLimits, describe: Callable[[], dict[str, Any]],
                 stats: Callable[[bool], dict[str, Any]], accepted: list[str]) -> None:
        self.core = core
        self.limits = limits
        self._describe = describe
        self._stats = stats
        self._accepted = accepted
        self._admission = Admission(*limits.admission_bounds(core.max_batch_size))
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("", "POST"): self._predict, ("", "GET"): self._get_description,
            ("", "HEAD"): self._get_description, ("/stats", "GET"): self._get_stats,
            ("/stats/reset", "POST"): self._reset_stats,
        }

    async def handle(self, request: Request) -> Response:
        if not self._authorized(request):
            self.core.stats.request("unauthorized")
            return json_response(401, {"error": "missing or wrong bearer token: send "
                                       "'Authorization: Bearer <token>'"},
                                 {"WWW-Authenticate": 'Bearer realm="qkan-pack"'})
        path = request.url.path.removeprefix(request.scope.get("root_path", "")).rstrip("/")
        handler = self._routes.get((path, request.method))
        if handler is not None:
            return await handler(request)
        if any(p == path for p, _ in self._routes):
            allowed = sorted(m for p, m in self._routes if p == path)
            return json_response(405, {"error": f"{request.method} is not allowed on "
                                       f"{path or '/'}; use {', '.join(allowed)}"})
        return json_response(404, {"error": f"no route {path!r}; use GET /, POST /, "
                                   "GET /stats, POST /stats/reset"})

    def _authorized(self, request: Request) -> bool:
        want = self.limits.token_sha256
        if want is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token_digest(token.strip()), want)

    async def _get_description(self, request: Request) -> Response:
        return json_response(200, self._describe())

    async def _get_stats(self, request: Request) -> Response:
        return json_response(200, self._stats(False))

    async def _reset_stats(self, request: Request) -> Response:
        return json_response(200, self._stats(True))

    async def _predict(self, request: Request) -> Response:
        try:
            async with self._admission.slot():
                return await self._predict_admitted(request)
        except OverloadedError:
            self.core.stats.request("overloaded")
            return json_response(503, {"error": "overloaded: this replica's queue is full; "
                                       f"retry after {self.limits.retry_after_s} s"},
                                 {"Retry-After": str(self.limits.retry_after_s)})

    async def _predict_admitted(self, request: Request) -> Response:
        limit = self.limits.max_body_bytes
        try:
            body = await within(read_limited(request, limit), self.limits.body_timeout_s)
        except asyncio.TimeoutError:
            return json_response(408, {"error": "request body not received within "
                                       f"{self.limits.body_timeout_s:g} s"})
        if body is None:
            return json_response(413, {"error": f"request body exceeds {limit} bytes; send "
                                       "fewer rows per request or base64 buffers"})
        large = len(body) >= INLINE_PARSE_BYTES
        try:
            given, encoding = await _maybe_thread(large, parse_request, body, self.core.names)
            outputs = await self.core.infer(given)
            payload = await _maybe_thread(large, lambda: dumps({"outputs": encode_outputs(
                outputs, encoding)}))
        except MalformedRequestError as exc:
            return json_response(400, {"error": str(exc)})
        except InputError as exc:
            return json_response(422, {"error": str(exc), "accepted": self._accepted})
        except Exception as exc:
            logger.exception("request failed")
            return json_response(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
        return raw_response(200, payload)


_TASK_DEADLINES = sys.version_info >= (3, 11)  # asyncio.timeout


async def within(work: Awaitable[Any], seconds: float) -> Any:
    """``work``'s result, or ``asyncio.TimeoutError`` after ``seconds``. On Python 3.11+ a
    deadline on the current task (``asyncio.timeout``), not ``wait_for``'s extra task per
    call: this runs once per request on the replica's one event loop."""
    if _TASK_DEADLINES:
        async with asyncio.timeout(seconds):
            return await work
    return await asyncio.wait_for(work, seconds)


async def _maybe_thread(threaded: bool, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if threaded else fn(*args)


async def read_limited(request: Request, limit: int) -> bytes | None:
    """The body, or None once it exceeds ``limit`` bytes (by Content-Length, before reading
    anything, or while streaming)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return raw_response(status, dumps(payload), headers)


def raw_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    from starlette.responses import Response

    return Response(body, status_code=status, headers=headers, media_type="application/json")

