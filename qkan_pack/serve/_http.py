"""The HTTP API of a replica: bearer-token check, bounded admission, body limits, routes.
Every reply, errors included, is a JSON body (``_wire.dumps``).

Routes (under the route prefix): ``GET /`` describes the artifact and replica, ``POST /``
predicts, ``GET /stats`` reads this replica's counters, ``POST /stats/reset`` zeroes them,
``GET /metrics`` is every replica's counters in Prometheus's text format (``_metrics``);
``/v2/...`` is the Open Inference Protocol (``_oip``), behind the same token, admission and
limits; a model repository's version also answers its JSON routes (``/models/<name>`` and
``/models/<name>/versions/<v>``, as ``/``). Each inference request's outcome and latency
are counted (``ReplicaStats.answered``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError, MalformedRequestError, OverloadedError
from ._auth import CHALLENGE, UNAUTHORIZED_BODY, authorization, bearer_matches
from ._http_replies import binary_response, json_response, method_not_allowed, raw_response
from ._inflate import COMPRESSIONS, inflate
from ._offload import WireHelper
from ._oip import BINARY_HEADER, FIXED_MODEL, InferRequest, OipModel, ready_only
from ._stats import outcome_of
from ._wire import encode_reply, header_count, output_nbytes, parse_request

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ._model import ModelCore

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
#: JSON at least this large is parsed in the replica's helper process (``_offload``), on
#: ``POST /`` and ``/v2`` alike, so a big body never holds the event loop that every small
#: request needs.
INLINE_PARSE_BYTES = 64 * 1024
#: Outputs at least this large (numpy bytes; their JSON is ~3x) are encoded there too.
INLINE_ENCODE_BYTES = 16 * 1024
#: Compressed bodies at least this large are inflated in a worker thread. Deflate makes at
#: most ~1032 bytes of one, so what inflates on the event loop stays near a megabyte.
INLINE_INFLATE_BYTES = 1024
logger = logging.getLogger(__name__)


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
        waiting, half as many: bounds near a replica's saturation point keep its throughput
        and bound the p99 of the requests it accepts, where bounds far above it let every
        request in and p99 grows with the queue (measurements:
        ``benchmarks/results/2026-12-04_h200_serve_default-bounds-at-800394d.txt``)."""
        ongoing, queued = self.admission_bounds(batch_rows)
        return replace(self, max_ongoing=ongoing, max_queued=queued)

    def admission_bounds(self, batch_rows: int) -> tuple[int, int]:
        """(at work, waiting): the bounds set, else derived as ``with_admission`` says."""
        ongoing = self.max_ongoing or max(batch_rows, MIN_DEFAULT_ONGOING)
        return ongoing, self.max_queued if self.max_queued is not None else ongoing // 2


class Admission:
    """At most ``ongoing`` requests at work and ``queued`` waiting; the rest are refused at
    once (an unbounded queue makes latency collapse under load). ``acquire`` takes a
    free slot without suspending; every acquire is paired with one ``release``."""

    def __init__(self, ongoing: int, queued: int) -> None:
        self._ongoing = ongoing
        self._free = ongoing
        self._queued = queued
        self._waiters: list[asyncio.Future[None]] = []

    async def acquire(self) -> None:
        """A slot; waits in the queue when none is free, ``OverloadedError`` when it is full."""
        if self._free > 0:
            self._free -= 1
            return
        if len(self._waiters) >= self._queued:
            raise OverloadedError(ongoing=self._ongoing, queued=len(self._waiters))
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # the releasing request hands its slot over
        except asyncio.CancelledError:
            self._drop(waiter)
            raise

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        elif waiter.done() and not waiter.cancelled():
            self.release()  # it was handed a slot it will not use

    def pending(self) -> tuple[int, int]:
        """(at work, waiting): requests holding a slot, and those queued for one (what
        ``qkan_pack_pending_requests`` exports: the depth operators alert on)."""
        waiting = sum(1 for waiter in self._waiters if not waiter.done())
        return self._ongoing - self._free, waiting

    def release(self) -> None:
        """Give a slot back: to the longest waiter, else to the free pool."""
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class BodyDeadline:
    """The body-read deadline of every request, kept by one timer: a read still running
    ``seconds`` after it started is cancelled and raises ``asyncio.TimeoutError`` (the 408).

    Why not ``asyncio.timeout`` per request: that is a timer armed and cancelled on the
    replica's one event loop for every request. All deadlines here are the same length, so
    they expire in the order the reads started; one timer, set for the oldest read, serves
    them all, and a read costs a dict entry.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def read(self, work: Awaitable[Any]) -> Any:
        """``work``'s result, or ``asyncio.TimeoutError`` once the deadline passed."""
        task = asyncio.current_task()
        if task is None:  # not in a task (no request is served so): nothing to cancel
            return await work
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: the old one's timer and reads are gone
            self._loop, self._timer = loop, None
            self._reading.clear()
            self._expired.clear()
        deadline = loop.time() + self.seconds
        self._reading[task] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        try:
            return await work
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            self._expired.discard(task)
            if hasattr(task, "uncancel") and task.uncancel() > 0:
                raise  # the caller cancelled too, in the same pass: its cancel wins
            raise asyncio.TimeoutError from None
        finally:
            self._reading.pop(task, None)

    def _expire(self) -> None:
        """Cancel every read past its deadline; re-arm for the oldest one left."""
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for task, deadline in list(self._reading.items()):
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            del self._reading[task]
            self._expired.add(task)
            task.cancel()


@dataclass(frozen=True)
class Reports:
    """What a replica's routes report, each made by the replica: ``GET /`` (``describe``),
    ``/stats`` (``stats``, told whether to reset), ``GET /metrics`` (``metrics``: the text
    and its content type) and Triton's statistics extension (``statistics``: the model's
    ``model_stats`` entries); no route for those left None."""

    describe: Callable[[], dict[str, Any]]
    stats: Callable[[bool], dict[str, Any]]
    metrics: Callable[[], Awaitable[tuple[bytes, str]]] | None = None
    statistics: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None


class HttpApi:
    """Dispatches one starlette request; owns no model state (``ModelCore`` does)."""

    def __init__(self, core: ModelCore, limits: HttpLimits, reports: Reports,
                 accepted: list[str], oip: OipModel | None = None,
                 aliases: Sequence[str] = ()) -> None:
        """``aliases``: more paths answering as ``/`` does (a repository's JSON routes)."""
        self._describe, self._stats = reports.describe, reports.stats
        self._metrics, self._statistics = reports.metrics, reports.statistics
        self.core = core
        self.oip = oip
        self.limits = limits
        self._accepted = accepted
        self.admission = Admission(*limits.admission_bounds(core.max_batch_size))
        self._body_deadline = BodyDeadline(limits.body_timeout_s)
        self._helper = WireHelper()
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("", "POST"): self._predict, ("", "GET"): self._get_description,
            ("", "HEAD"): self._get_description, ("/stats", "GET"): self._get_stats,
            ("/stats/reset", "POST"): self._reset_stats,
        }
        for alias in aliases:
            self._routes.update({(alias, "POST"): self._predict,
                                 (alias, "GET"): self._get_description,
                                 (alias, "HEAD"): self._get_description})
        if self._metrics is not None:
            self._routes["/metrics", "GET"] = self._get_metrics
        if oip is not None:  # the protocol's infer routes, found without parsing the path
            base = f"/v2/models/{oip.name}"
            for infer in (f"{base}/infer", f"{base}/versions/{oip.version}/infer"):
                self._routes[infer, "POST"] = self._oip_predict

    async def handle(self, request: Request) -> Response:
        scope = request.scope  # not request.url: that parses the whole URL, per request
        path = scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/")
        if not self._authorized(request):
            self.core.stats.request("unauthorized")
            self.core.stats.answered(_protocol(path), "unauthorized", 0.0)
            return raw_response(401, UNAUTHORIZED_BODY, {"WWW-Authenticate": CHALLENGE})
        handler = self._routes.get((path, request.method))
        if handler is not None:
            return await handler(request)
        if self.oip is not None and (path == "/v2" or path.startswith("/v2/")):
            return await self._oip_route(request, path)
        if any(p == path for p, _ in self._routes):
            allowed = sorted(m for p, m in self._routes if p == path)
            return json_response(405, {"error": f"{request.method} is not allowed on "
                                       f"{path or '/'}; use {', '.join(allowed)}"})
        return json_response(404, {"error": f"no route {path!r}; use GET /, POST /, "
                                   "GET /stats, POST /stats/reset, GET /metrics, or /v2/... "
                                   "(the Open Inference Protocol)"})

    def _authorized(self, request: Request) -> bool:
        want = self.limits.token_sha256
        return want is None or bearer_matches(authorization(request.scope), want)

    async def _get_description(self, request: Request) -> Response:
        return json_response(200, self._describe())

    async def _get_stats(self, request: Request) -> Response:
        return json_response(200, self._stats(False))

    async def _reset_stats(self, request: Request) -> Response:
        return json_response(200, self._stats(True))

    async def _get_metrics(self, request: Request) -> Response:
        assert self._metrics is not None
        payload, content_type = await self._metrics()
        reply = raw_response(200, payload)
        reply.raw_headers[1] = (b"content-type", content_type.encode("latin-1"))
        return reply

    async def _predict(self, request: Request) -> Response:
        return await self._admitted(request, self._predict_admitted, "json")

    async def _oip_predict(self, request: Request) -> Response:
        return await self._admitted(request, self._oip_infer, "oip-http")

    async def _admitted(self, request: Request, work: Callable[[Request], Awaitable[Response]],
                        protocol: str) -> Response:
        """``work`` within the replica's admission bounds, else a 503 with Retry-After; its
        outcome and latency counted under ``protocol``."""
        started = time.perf_counter()
        try:
            await self.admission.acquire()
        except OverloadedError:
            self.core.stats.request("overloaded")
            self.core.stats.answered(protocol, "overloaded", 0.0)
            return json_response(503, {"error": "overloaded: this replica's queue is full; "
                                       f"retry after {self.limits.retry_after_s} s"},
                                 {"Retry-After": str(self.limits.retry_after_s)})
        try:
            reply = await work(request)
        finally:
            self.admission.release()
        status = reply.status_code
        self.core.stats.answered(protocol, "success" if status == 200 else outcome_of(status),
                                 time.perf_counter() - started)
        return reply

    async def _read_body(self, request: Request) -> bytes | Response:
        """The body within the size and time limits, or the error reply that ends the request."""
        limit = self.limits.max_body_bytes
        try:
            body = await self._body_deadline.read(read_limited(request, limit))
        except asyncio.TimeoutError:
            return json_response(408, {"error": "request body not received within "
                                       f"{self.limits.body_timeout_s:g} s"})
        except Exception as exc:
            if not _client_went_away(exc):
                raise
            self.core.stats.request("abandoned")
            return json_response(400, {"error": "the client went away before sending the "
                                       "whole body"})
        if body is None:
            return json_response(413, {"error": f"request body exceeds {limit} bytes; send "
                                       "fewer rows per request or base64 buffers"})
        return body

    async def _predict_admitted(self, request: Request) -> Response:
        body = await self._read_body(request)
        if not isinstance(body, bytes):
            return body
        try:
            if len(body) >= INLINE_PARSE_BYTES:
                given, encoding = await self._helper.parse(body, self.core.names)
            else:
                given, encoding = parse_request(body, self.core.names)
            payload = await self._encode(await self.core.infer(given), encoding)
        except MalformedRequestError as exc:
            return json_response(400, {"error": str(exc)})
        except InputError as exc:
            return json_response(422, {"error": str(exc), "accepted": self._accepted})
        except Exception as exc:
            logger.exception("request failed")
            return json_response(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
        return raw_response(200, payload)

    # -- the Open Inference Protocol (``_oip``) ---------------------------------------

    async def _oip_route(self, request: Request, path: str) -> Response:
        """``/v2``, ``/v2/health/{live,ready}``, ``/v2/models/{name}[/versions/{v}]`` and its
        ``/ready``, ``/config`` and ``/infer``; errors as ``{"error": ...}``."""
        assert self.oip is not None
        parts = path.split("/")[2:]
        method = request.method
        if parts in ([], ["health", "live"], ["health", "ready"]):
            if method not in ("GET", "HEAD"):
                return method_not_allowed(method, path, "GET")
            if not parts:
                return json_response(200, self.oip.server_metadata())
            return json_response(200, {parts[1]: True})
        if parts[:1] == ["repository"]:
            return await self._repository_route(request, path, parts[1:])
        if parts == ["models", "stats"] and self._statistics is not None:  # every model's
            return await self._model_statistics(request, path)
        if len(parts) < 2 or parts[0] != "models":
            return json_response(404, {"error": f"no route {path!r} in the Open Inference "
                                       "Protocol"})
        name, version, rest = parts[1], None, parts[2:]
        if rest[:1] == ["versions"] and len(rest) >= 2:
            version, rest = rest[1], rest[2:]
        if not self.oip.addresses(name, version):
            return json_response(404, {"error": self.oip.unknown_model(name, version)})
        action = "/".join(rest)
        if action == "infer":
            if method != "POST":
                return method_not_allowed(method, path, "POST")
            return await self._admitted(request, self._oip_infer, "oip-http")
        if method not in ("GET", "HEAD"):
            return method_not_allowed(method, path, "GET")
        if action == "":
            return json_response(200, self.oip.metadata())
        if action == "ready":
            return json_response(200, {"name": self.oip.name, "ready": True})
        if action == "config":
            return json_response(200, self.oip.config())
        if action == "stats" and self._statistics is not None:
            return await self._model_statistics(request, path)
        return json_response(404, {"error": f"no route {path!r}; a model has /ready, /config "
                                   "and /infer"})

    async def _model_statistics(self, request: Request, path: str) -> Response:
        """Triton's statistics extension: ``{"model_stats": [...]}`` (``_statistics``)."""
        assert self._statistics is not None
        if request.method not in ("GET", "HEAD"):
            return method_not_allowed(request.method, path, "GET")
        return json_response(200, {"model_stats": await self._statistics()})

    async def _repository_route(self, request: Request, path: str,
                                rest: list[str]) -> Response:
        """Triton's repository extension on one artifact, as Triton answers it with model
        control ``none``: the index lists this model; load and unload are refused (400)."""
        assert self.oip is not None
        control = len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload")
        if rest != ["index"] and not control:
            return json_response(404, {"error": f"no route {path!r}; the repository extension "
                                       "has POST /v2/repository/index and /v2/repository/"
                                       "models/<name>/load and /unload"})
        if request.method != "POST":
            return method_not_allowed(request.method, path, "POST")
        if control:
            return json_response(400, {"error": FIXED_MODEL})
        body = await self._read_body(request)
        if not isinstance(body, bytes):
            return body
        ready = ready_only(body)
        if isinstance(ready, str):
            return json_response(400, {"error": ready})
        return json_response(200, self.oip.index())

    async def _oip_infer(self, request: Request) -> Response:
        assert self.oip is not None
        body = await self._read_body(request)
        if not isinstance(body, bytes):
            return body
        encoding, header_length = _headers(request.scope, b"content-encoding",
                                           BINARY_HEADER.encode())
        if encoding not in (None, "identity"):
            if len(body) < INLINE_INFLATE_BYTES:
                body = decompressed(body, encoding, self.limits.max_body_bytes)
            else:  # zlib inflates without the GIL: a worker thread leaves the loop free
                body = await asyncio.to_thread(decompressed, body, encoding,
                                               self.limits.max_body_bytes)
            if not isinstance(body, bytes):
                return body
        try:
            parsed: InferRequest  # parse_http reads a kept header first
            if json_bytes(body, header_length) >= INLINE_PARSE_BYTES:
                parsed = await self._helper.parse_infer(self.oip, body, header_length)
            else:
                parsed = self.oip.parse_http(body, header_length)
            outputs = await self.core.infer(parsed.inputs)
            if output_nbytes(outputs) < INLINE_ENCODE_BYTES:
                payload, reply_header = self.oip.reply(outputs, parsed)
            else:
                payload, reply_header = await asyncio.to_thread(self.oip.reply, outputs, parsed)
        except (MalformedRequestError, InputError) as exc:
            return json_response(400, {"error": str(exc)})  # the protocol's one client error
        except Exception as exc:
            logger.exception("request failed")
            return json_response(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
        if reply_header is None:
            return raw_response(200, payload)
        return binary_response(payload, reply_header)

    async def _encode(self, outputs: Any, encoding: str) -> bytes:
        """The reply body: small outputs here; a large array in the helper; large structured
        outputs (tuples, dicts, a model's output class: walking them takes torch, which the
        helper does not load) in a worker thread."""
        if type(outputs) is np.ndarray:  # the common reply: one output
            if outputs.nbytes < INLINE_ENCODE_BYTES:
                return encode_reply(outputs, encoding)
            return await self._helper.encode(outputs, encoding)
        if output_nbytes(outputs) < INLINE_ENCODE_BYTES:
            return encode_reply(outputs, encoding)
        return await asyncio.to_thread(encode_reply, outputs, encoding)


def forwarded_request(method: str, path: str, headers: Sequence[tuple[bytes, bytes]],
                      body: bytes) -> Request:
    """A request passed on by a model repository's router (``ArtifactServer.forward_http``)
    as the starlette request the routes take: the client's method, path, headers and whole
    body, no root path (the path is the client's own)."""
    from starlette.requests import Request

    scope = {"type": "http", "method": method, "path": path, "root_path": "",
             "headers": list(headers), "query_string": b""}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:  # read once: after the body, the request is over
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


async def read_limited(request: Request, limit: int) -> bytes | None:
    """The body, or None once it exceeds ``limit`` bytes (by Content-Length, before reading
    anything, else counted as it arrives: a server may frame a body as chunked and pass a
    smaller Content-Length on). Read from the ASGI messages themselves: starlette's
    ``request.body()`` runs an async generator per request for what is, behind HAProxy,
    a single message."""
    declared = _content_length(request.scope)
    if declared is not None and declared > limit:
        return None
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            from starlette.requests import ClientDisconnect

            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join((*chunks, chunk)) if chunks else chunk
        chunks.append(chunk)


def json_bytes(body: bytes, header_length: str | None) -> int:
    """How much of an ``infer`` body is JSON: with the binary extension, the header's length
    (the binary tensors after it are read without parsing); a length that is no byte count
    within the body counts the whole, and ``parse_http`` says what is wrong with it."""
    split = None if header_length is None else header_count(header_length)
    return len(body) if split is None or split > len(body) else split


def _client_went_away(exc: Exception) -> bool:
    """The body read ended in a client disconnect: behind HAProxy, Ray does not watch for one
    (``_haproxy.APP_REQUEST_RULES``), so the read itself sees it (imported only here:
    starlette comes with Ray)."""
    from starlette.requests import ClientDisconnect

    return isinstance(exc, ClientDisconnect)


def _content_length(scope: Mapping[str, Any]) -> int | None:
    """The declared body size, read from the raw ASGI headers (``request.headers`` would
    build a header map for this one lookup); None when absent, not a number, or beside a
    ``Transfer-Encoding`` (a value no server would pass on is then counted as it arrives)."""
    declared = None
    for key, value in scope.get("headers", ()):
        key = key.lower()
        if key == b"transfer-encoding":
            return None
        if key == b"content-length":
            declared = header_count(value)
    return declared


def decompressed(body: bytes, encoding: str, limit: int) -> bytes | Response:
    """A compressed body, inflated to at most ``limit`` bytes (413 beyond: a small body may
    inflate without bound), or the error reply (415 for another encoding, 400 for bad data)."""
    import zlib

    window = COMPRESSIONS.get(encoding.strip().lower())
    if window is None:
        return json_response(415, {"error": f"Content-Encoding {encoding!r} is not supported; "
                                   f"send {', '.join(COMPRESSIONS)} or none"})
    try:
        inflated = inflate(body, window, limit)
    except (zlib.error, MalformedRequestError) as exc:
        return json_response(400, {"error": f"the {encoding} body does not inflate: {exc}"})
    if inflated is None:
        return json_response(413, {"error": f"request body inflates beyond {limit} bytes"})
    return inflated


def _protocol(path: str) -> str:
    """The protocol a path belongs to, as the metrics label it."""
    return "oip-http" if path == "/v2" or path.startswith("/v2/") else "json"


def _headers(scope: Mapping[str, Any], *names: bytes) -> list[str | None]:
    """Request headers from the raw ASGI headers (``names`` in lower case; the first of each,
    None where absent), in one pass."""
    found: list[str | None] = [None] * len(names)
    for key, value in scope.get("headers", ()):
        key = key.lower()
        if key in names:
            index = names.index(key)
            if found[index] is None:
                found[index] = value.decode("latin-1")
    return found
