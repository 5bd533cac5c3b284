"""The Open Inference Protocol's gRPC calls answered by a replica's HTTP server.

HAProxy, in front of every replica, speaks HTTP/2 to gRPC clients and can pass each call on
to a replica as an HTTP/1.1 request: ``POST /inference.GRPCInferenceService/<rpc>``, the
5-byte-framed message as its body (``_haproxy`` points the gRPC frontend's backend at the
replicas' HTTP servers). The replica answers it here, with the same ``GrpcApi`` bodies as
Ray Serve's own gRPC server, but on uvicorn's HTTP path: grpc's asyncio server costs a
replica's event loop about 3.6 times an HTTP request's CPU per call
(``benchmarks/results/2026-12-06_cpu_grpc-over-http1-probe/``), and that loop is what limits
a replica on a GPU.

A reply is the framed message with the status in trailers (``grpc-status: 0``), which
HTTP/1.1 carries only after a chunked body: the reply names them in ``TRAILERS_HEADER``, and
``_uvicorn_compat`` writes them after the last chunk (uvicorn has no ASGI trailers). A
failed call is trailers-only: the status and its message as headers, no body.
"""

from __future__ import annotations

import functools
import struct
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._inflate import COMPRESSIONS, inflate
from ._oip_grpc import ForwardedCall

if TYPE_CHECKING:
    from types import ModuleType

    from starlette.requests import Request
    from starlette.responses import Response

    from ._http import HttpLimits
    from ._oip_grpc import GrpcApi

#: The path prefix of the protocol's gRPC calls as HTTP requests.
GRPC_PREFIX = "/inference.GRPCInferenceService/"
#: A reply header naming the trailers to write after its body (never sent as a header).
TRAILERS_HEADER = b"x-qkan-pack-trailers"
#: Room for a gRPC message's fields around its tensors (names, shapes, parameters).
GRPC_MESSAGE_SLACK = 64 * 1024
#: A message's 5-byte prefix: compressed or not, then its length.
_PREFIX = struct.Struct(">BI")
#: The trailers of a call answered.
_ANSWERED = [(TRAILERS_HEADER, b"grpc-status: 0")]
#: Request headers that are HTTP's, not the call's metadata.
_NOT_METADATA = frozenset((b"host", b"content-type", b"content-length", b"te",
                           b"transfer-encoding", b"connection", b"user-agent",
                           b"x-request-disconnect-disabled", b"x-forwarded-for"))


def grpc_message_limit(limits: HttpLimits) -> int:
    """The largest gRPC message a replica takes (and Ray's gRPC servers send):
    ``--max-body-mb`` as for HTTP bodies, with room for the message's fields. gRPC reads a
    whole message before any method runs, token check included, so the bound must be the
    server's own."""
    return limits.max_body_bytes + GRPC_MESSAGE_SLACK


def is_grpc_call(scope: Mapping[str, Any]) -> bool:
    """A gRPC call HAProxy passed on as HTTP/1.1 (its path and ``application/grpc``)."""
    if not scope["path"].startswith(GRPC_PREFIX) or scope.get("method") != "POST":
        return False
    return any(name == b"content-type" and value.startswith(b"application/grpc")
               for name, value in scope["headers"])


async def answer_over_http(api: GrpcApi, request: Request, limit: int) -> Response:
    """One gRPC call as an HTTP/1.1 request: unframe its message (inflating one sent
    compressed), answer it with ``api`` (``GrpcApi.answer``, token check included), and
    frame the reply with its status."""
    rpc = request.scope["path"][len(GRPC_PREFIX):]
    headers = request.scope["headers"]
    message_type = getattr(api.pb, f"{rpc}Request", None)
    if message_type is None:
        return failed("UNIMPLEMENTED", f"unknown method {rpc!r} of inference.GRPCInferenceService")
    body = await _http().read_limited(request, limit + 5)
    if body is None:
        return failed("RESOURCE_EXHAUSTED", f"the message is over the server's limit of "
                      f"{limit} bytes (serve --max-body-mb)")
    payload = _unframed(body, _header(headers, b"grpc-encoding"), limit)
    if isinstance(payload, tuple):
        return failed(*payload)
    kept = api.kept(payload) if rpc == "ModelInfer" else None
    message = None
    if kept is None:  # one not read through a kept head is parsed
        try:
            message = message_type.FromString(payload)
        except Exception as exc:  # protobuf's DecodeError
            return failed("INVALID_ARGUMENT", f"the {rpc}Request message does not parse: {exc}")
    call = _HeaderCall(headers)
    reply = await api.answer(rpc, message, call, payload, kept)
    status = getattr(call.code, "name", None) or "OK"
    if status != "OK":
        return failed(status, call.details, call.trailing_metadata)
    return _reply(reply if type(reply) is bytes else reply.SerializeToString())


class _HeaderCall(ForwardedCall):
    """A call's context whose metadata (the request's headers but HTTP's own) is decoded
    only when asked for: the token check asks, and only when serve has a token."""

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(())
        self.headers = headers

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple((k.decode("latin-1"), v.decode("latin-1"))
                     for k, v in self.headers if k not in _NOT_METADATA)


def failed(status: str, details: str,
           trailing: tuple[tuple[str, str], ...] = ()) -> Response:
    """A trailers-only reply: the call's status, message and trailing metadata (such as
    ``grpc-retry-pushback-ms``) as headers, no body."""
    import grpc

    code = getattr(grpc.StatusCode, status, grpc.StatusCode.UNKNOWN).value[0]
    return _grpc_reply(b"", [(b"grpc-status", str(code).encode()),
                             (b"grpc-message", _percent(details)),
                             *[(k.encode("latin-1"), v.encode("latin-1")) for k, v in trailing]])


def _reply(message: bytes) -> Response:
    return _grpc_reply(b"".join((_PREFIX.pack(0, len(message)), message)), _ANSWERED)


def _grpc_reply(body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
    reply = _http().raw_response(200, body)
    reply.raw_headers[1:] = [(b"content-type", b"application/grpc"), *headers]
    return reply


def _percent(details: str) -> bytes:
    """``grpc-message`` as gRPC's spec encodes it (percent-encoded UTF-8, one line)."""
    return urllib.parse.quote(details[:2000], safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"
                              ).encode("ascii")


def _unframed(body: bytes, encoding: str | None, limit: int) -> bytes | tuple[str, str]:
    """The one message of a unary call's body (inflated where its flag says compressed),
    or the status and what is wrong with the body, in words."""
    if len(body) < 5:
        return "INVALID_ARGUMENT", "the request body is not a gRPC message (under 5 bytes)"
    flag, length = _PREFIX.unpack_from(body)
    if len(body) != 5 + length:
        return ("INVALID_ARGUMENT", f"the request body holds {len(body) - 5} bytes after its "
                f"5-byte prefix, which says {length}: a unary call sends one message")
    payload = body[5:]
    if not flag:
        return payload
    window = COMPRESSIONS.get(encoding or "")
    if window is None:
        return ("INVALID_ARGUMENT", f"the message is compressed with "
                f"{encoding or 'no grpc-encoding'!r}; send identity, gzip or deflate")
    try:
        inflated = inflate(payload, window, limit)
    except Exception as exc:  # zlib.error, MalformedRequestError
        return "INVALID_ARGUMENT", f"the message does not inflate ({encoding}): {exc}"
    if inflated is None:
        return ("RESOURCE_EXHAUSTED", f"the message inflates ({encoding}) past the server's "
                f"limit of {limit} bytes (serve --max-body-mb)")
    return inflated


@functools.cache
def _http() -> ModuleType:
    """The HTTP routes' module, whose reader and replies a call uses: imported on the first
    call (this module loads without it), then found without an import per call."""
    from . import _http

    return _http


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in headers if k == name), None)
