"""Load from several client processes (so that the generator is not the ceiling): each
process runs threads that send requests back to back, each client over its own kept-alive
connection, and returns its latencies. A request is one row of each input, or a batch of
``rows_per_request`` rows, in one of the server's protocols (``PROTOCOLS``): its own JSON
route, or the Open Inference Protocol over HTTP (JSON or binary tensors) or gRPC. Bodies are
encoded before the clock starts. Nothing here imports torch, Ray or the server: the protocols
are written from their specification (gRPC's messages from tritonclient's generated stubs)."""

from __future__ import annotations

import http.client
import math
import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from threading import Thread
from typing import Any

import orjson

from .._extras import install_hint, missing_module
from ..errors import BenchError
from ..format import DTYPES
from ._cpus import pin_cpus

#: What a load can speak: the server's JSON route (``POST /``), the Open Inference
#: Protocol's HTTP ``infer`` with JSON tensors or with the binary tensor data extension, and
#: its gRPC ``ModelInfer`` (``serve --grpc-port``).
PROTOCOLS = ("json", "oip-json", "oip-binary", "oip-grpc")
#: A gRPC call that succeeded counts as an HTTP 200, so that every protocol's points read
#: alike; a failed one counts under its status code's name (``UNAVAILABLE``...).
GRPC_OK = 200


@dataclass(frozen=True)
class RowInput:
    """One input of a request: its name, the row's shape (the captured shapes without their
    batch dimension), and what values to send: ``kind`` "float" or "int" drawn from
    ``[low, high)``, or "bool" (JSON booleans: the wire refuses 0/1 for bool); ``dtype``,
    the manifest's, names the protocol's datatype and the width of raw tensors."""

    name: str
    shape: tuple[int, ...]
    kind: str = "float"
    low: float = -1.0
    high: float = 1.0
    #: Dims of ``shape`` that take the request's length (``LoadSpec.lengths``): the row's
    #: dims of an artifact's padded length axis.
    varying: tuple[int, ...] = ()
    dtype: str = "float32"


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
    protocol: str = "json"  # one of PROTOCOLS
    rows_per_request: int = 1
    #: The Open Inference Protocol's name of the model (``GET /``'s "oip"), for its routes.
    model: str = ""
    grpc_port: int = 0  # ``serve --grpc-port``, for "oip-grpc"
    #: The JSON route's paths, spread over the clients (client ``i`` posts to
    #: ``paths[i % len(paths)]``: a model repository's ``/models/<name>``); () : ``/``.
    paths: tuple[str, ...] = ()
    #: The CPUs the client processes run on (``bench-serve --split-cpus``); empty: any.
    cpus: frozenset[int] = frozenset()


@dataclass
class LoadResult:
    """The timed part's latencies and statuses; ``sent``, every request sent (warm-up and
    refusals included), and ``cpu_s``, the client processes' CPU time while they sent them:
    what the clients cost per request (``sent`` is the denominator)."""

    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    sent: int = 0
    cpu_s: float = 0.0

    def merge(self, other: LoadResult) -> None:
        self.latencies_ms += other.latencies_ms
        self.statuses.update(other.statuses)
        self.sent += other.sent
        self.cpu_s += other.cpu_s


#: Distinct bodies each client cycles through: drawing and encoding a large row (an image)
#: per request would make the load generator the ceiling.
BODIES_PER_CLIENT = 8


def request_body(rows: Rows, rng: random.Random, size: int = 0,
                 lengths: tuple[int, int] | None = None, count: int = 1) -> bytes:
    """A request of the JSON route: ``count`` rows, ``{"inputs": [row, ...]}`` for one
    input, by name for several. ``size``: as many rows as fit in about that many bytes,
    padded with whitespace to exactly ``size`` -- numbers, which is what makes a large body
    costly to parse (whitespace padding alone parses in microseconds and would hide that
    cost)."""
    rows = _with_length(rows, rng, lengths)
    if not size:
        return _body(rows, rng, count)
    # bytes per row: two rows' body less one row's (names and brackets cancel)
    per_row = max(1, len(_body(rows, rng, 2)) - len(_body(rows, rng, 1)))
    count = max(1, (size - len(_body(rows, rng, 1))) // per_row + 1)
    while True:
        body = _body(rows, rng, count)
        if len(body) <= size or count == 1:
            return body + b" " * max(0, size - len(body))
        count = max(1, count * 49 // 50)


def _with_length(rows: Rows, rng: random.Random, lengths: tuple[int, int] | None) -> Rows:
    """The rows of one request: with ``lengths``, their ``varying`` dims at a drawn length."""
    if lengths is None:
        return rows
    length = rng.randint(*lengths)
    return tuple(replace(row, shape=tuple(length if d in row.varying else n
                                          for d, n in enumerate(row.shape)))
                 for row in rows)


def _body(rows: Rows, rng: random.Random, count: int) -> bytes:
    values = {row.name: [_draw(row, row.shape, rng) for _ in range(count)] for row in rows}
    return orjson.dumps({"inputs": values if len(rows) > 1 else values[rows[0].name]})


def _draw(row: RowInput, shape: tuple[int, ...], rng: random.Random) -> Any:
    if shape:
        return [_draw(row, shape[1:], rng) for _ in range(shape[0])]
    return _scalar(row, rng)


def _scalar(row: RowInput, rng: random.Random) -> Any:
    if row.kind == "bool":
        return rng.random() < 0.5
    if row.kind == "int":
        return rng.randrange(int(row.low), max(int(row.low) + 1, int(row.high)))
    return rng.uniform(row.low, row.high)


# -- the Open Inference Protocol ---------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One input of an Open Inference Protocol request: its shape (batch first) and its
    values, flat in row-major order, as JSON ``data``."""

    name: str
    dtype: str  # the manifest's
    shape: tuple[int, ...]
    values: list[Any]

    @property
    def datatype(self) -> str:
        return DTYPES[self.dtype].oip

    def raw(self) -> bytes:
        """The values as the binary extension and gRPC's ``raw_input_contents`` carry them:
        little-endian, of the dtype's wire width (bfloat16: each float32's upper 16 bits)."""
        import numpy as np

        if self.dtype == "bfloat16":
            bits = np.asarray(self.values, np.float32).view(np.uint32) >> 16
            return bits.astype("<u2").tobytes()
        return np.asarray(self.values, np.dtype(DTYPES[self.dtype].wire)).tobytes()


def oip_tensors(rows: Rows, rng: random.Random, count: int = 1,
                lengths: tuple[int, int] | None = None) -> list[Tensor]:
    """One request's inputs: ``count`` rows of each."""
    rows = _with_length(rows, rng, lengths)
    return [Tensor(row.name, row.dtype, (count, *row.shape),
                   [_scalar(row, rng) for _ in range(count * math.prod(row.shape))])
            for row in rows]


def oip_json_body(tensors: list[Tensor]) -> bytes:
    return orjson.dumps({"inputs": [{"name": t.name, "shape": list(t.shape),
                                     "datatype": t.datatype, "data": t.values}
                                    for t in tensors]})


def oip_binary_body(tensors: list[Tensor]) -> tuple[bytes, int]:
    """(body, its JSON header's length) with the binary tensor data extension: the header
    declares each input's ``binary_data_size`` and asks for binary outputs; the raw tensors
    follow it in input order."""
    raws = [t.raw() for t in tensors]
    header = orjson.dumps({
        "inputs": [{"name": t.name, "shape": list(t.shape), "datatype": t.datatype,
                    "parameters": {"binary_data_size": len(raw)}} for t, raw in zip(tensors, raws)],
        "parameters": {"binary_data_output": True}})
    return b"".join((header, *raws)), len(header)


def grpc_messages() -> Any:
    """``service_pb2``: the protocol's gRPC messages as tritonclient generates them (the
    clients call ModelInfer by its path, without the generated stub), or a BenchError
    saying what to install."""
    try:
        from tritonclient.grpc import service_pb2
    except (ImportError, RuntimeError) as exc:  # tritonclient turns a missing grpc into this
        module = missing_module(exc) or "tritonclient"
        raise BenchError(f"--protocol oip-grpc needs tritonclient's gRPC stubs ({exc}); "
                         f"{install_hint(module)}") from None
    return service_pb2


# -- clients ----------------------------------------------------------------------------


class HttpSender:
    """One client's kept-alive HTTP connection and its pre-encoded requests (a path, a
    body, headers) for the spec's protocol."""

    def __init__(self, spec: LoadSpec, rng: random.Random) -> None:
        self.spec = spec
        self.requests = self._encode(spec, rng)
        self.conn = http.client.HTTPConnection(spec.host, spec.port, timeout=60)

    @staticmethod
    def _encode(spec: LoadSpec, rng: random.Random) -> list[tuple[str, bytes, dict[str, str]]]:
        auth = {"Authorization": f"Bearer {spec.token}"} if spec.token else {}
        json_type = {"Content-Type": "application/json", **auth}
        if spec.body_bytes:  # a large body: one copy
            return [("/", request_body(spec.rows, rng, spec.body_bytes, spec.lengths), json_type)]
        count, rows = spec.rows_per_request, spec.rows
        if spec.protocol == "json":
            path = spec.paths[0] if spec.paths else "/"
            return [(path, request_body(rows, rng, 0, spec.lengths, count), json_type)
                    for _ in range(BODIES_PER_CLIENT)]
        path = f"/v2/models/{spec.model}/infer"
        if spec.protocol == "oip-json":
            return [(path, oip_json_body(oip_tensors(rows, rng, count, spec.lengths)), json_type)
                    for _ in range(BODIES_PER_CLIENT)]
        encoded = []
        for _ in range(BODIES_PER_CLIENT):
            body, header = oip_binary_body(oip_tensors(rows, rng, count, spec.lengths))
            encoded.append((path, body, {"Content-Type": "application/octet-stream",
                                         "Inference-Header-Content-Length": str(header), **auth}))
        return encoded

    def send(self, index: int) -> tuple[Any, float]:
        """(status, seconds to wait before the next request) of request ``index``."""
        path, body, headers = self.requests[index % len(self.requests)]
        try:
            self.conn.request("POST", path, body, headers)
            reply = self.conn.getresponse()
            reply.read()
            return reply.status, _retry_after(reply.getheader("Retry-After"), self.spec.backoff_s)
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.spec.host, self.spec.port, timeout=60)
            return type(exc).__name__, self.spec.backoff_s

    def close(self) -> None:
        self.conn.close()


class GrpcSender:
    """One client's gRPC channel and its ``ModelInferRequest`` messages (raw contents),
    serialised once: each call sends those bytes and takes the reply as bytes, unparsed, as
    the HTTP clients send pre-encoded bodies and read replies without parsing them (and
    Triton's perf_analyzer reuses its requests). Neither tritonclient's client class nor
    protobuf runs per call, so that the client's own cost stays close to HTTP's: with
    protobuf per call, a grpcio client cost 437 µs of CPU per request against 387 without,
    and at 8 clients (each one request in flight) that made gRPC look 6% slower than the
    server is (``benchmarks/results/2026-12-07_h100_serve-protocols-no-request-logs/``)."""

    def __init__(self, spec: LoadSpec, rng: random.Random) -> None:
        import grpc

        pb = grpc_messages()
        self.spec, self.grpc = spec, grpc
        self.bodies = []
        for _ in range(BODIES_PER_CLIENT):
            tensors = oip_tensors(spec.rows, rng, spec.rows_per_request, spec.lengths)
            self.bodies.append(pb.ModelInferRequest(
                model_name=spec.model,
                inputs=[pb.ModelInferRequest.InferInputTensor(
                    name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in tensors],
                raw_input_contents=[t.raw() for t in tensors]).SerializeToString())
        self.metadata = (("authorization", f"Bearer {spec.token}"),) if spec.token else None
        self.channel = grpc.insecure_channel(f"{spec.host}:{spec.grpc_port}")
        # ModelInfer by its path on the wire, with no serialiser either way: bytes out,
        # bytes back.
        service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
        self.model_infer = self.channel.unary_unary(f"/{service}/ModelInfer")

    def send(self, index: int) -> tuple[Any, float]:
        try:
            self.model_infer(self.bodies[index % len(self.bodies)],
                             metadata=self.metadata, timeout=60)
            return GRPC_OK, 0.0
        except self.grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            return ((code.name if code is not None else type(exc).__name__),
                    _pushback(exc, self.spec.backoff_s))

    def close(self) -> None:
        self.channel.close()


def _client(spec: LoadSpec, seed: int, start_at: float, result: LoadResult) -> None:
    rng = random.Random(seed)
    if len(spec.paths) > 1:  # this client's path (seeds count the clients from 0)
        spec = replace(spec, paths=(spec.paths[seed % len(spec.paths)],))
    sender = GrpcSender(spec, rng) if spec.protocol == "oip-grpc" else HttpSender(spec, rng)
    # A large body's row count is rarely a captured shape: its 422 comes after the parse,
    # which is the load it exists to make, so it counts as answered (no back-off).
    answered = (200, 422) if spec.body_bytes else (200,)
    stop_at = start_at + spec.warmup + spec.seconds
    sent = 0
    time.sleep(max(0.0, start_at - time.time()))  # every client starts at one moment
    try:
        while (now := time.time()) < stop_at:
            began = time.perf_counter()
            status, wait = sender.send(sent)
            sent += 1
            elapsed = 1000 * (time.perf_counter() - began)
            if now >= start_at + spec.warmup:
                result.statuses[status] += 1
                if status in answered:
                    result.latencies_ms.append(elapsed)
            if status not in answered:
                time.sleep(wait)
    finally:
        result.sent = sent
        sender.close()


def _pushback(exc: Any, default: float) -> float:
    """A polite gRPC client waits as long as the server's pushback says
    (``grpc-retry-pushback-ms`` trailing metadata, gRFC A6), as an HTTP one heeds
    ``Retry-After``."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == "grpc-retry-pushback-ms" and value.isdigit():
            return int(value) / 1000
    return default


def _retry_after(header: str | None, default: float) -> float:
    """A polite client waits as long as ``Retry-After`` says (whole seconds)."""
    try:
        return float(header) if header else default
    except ValueError:
        return default


def _process(spec: LoadSpec, threads: int, first_seed: int, start_at: float) -> LoadResult:
    if spec.protocol == "oip-grpc":
        grpc_messages()  # imported once here, not by every client thread at its start
    results = [LoadResult() for _ in range(threads)]
    workers = [Thread(target=_client, args=(spec, first_seed + i, start_at, results[i]), daemon=True)
               for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, start_at - time.time()))  # the clients' setup is not their cost
    cpu_at_start = time.process_time()
    for worker in workers:
        worker.join()
    total = LoadResult(cpu_s=time.process_time() - cpu_at_start)
    for result in results:
        total.merge(result)
    return total


def run_load(spec: LoadSpec, processes: int) -> LoadResult:
    """``spec.clients`` clients spread over up to ``processes`` processes, all starting at one
    moment; merged results of the timed part."""
    processes = max(1, min(processes, spec.clients))
    shares = [spec.clients // processes + (i < spec.clients % processes) for i in range(processes)]
    seeds = [sum(shares[:i]) for i in range(processes)]
    with multiprocessing.get_context("spawn").Pool(processes, initializer=pin_cpus,
                                                   initargs=(spec.cpus,)) as pool:
        start_at = time.time() + 1.0  # the workers import this module meanwhile
        parts = pool.starmap(_process, [(spec, n, s, start_at) for n, s in zip(shares, seeds)])
    total = LoadResult()
    for part in parts:
        total.merge(part)
    return total
