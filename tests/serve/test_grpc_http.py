"""gRPC calls answered on a replica's HTTP path (``serve/_grpc_http``): the framed message in,
the framed reply and its status out (in trailers, or trailers-only for a failure), and every
malformed body a clear status, without Ray."""

from __future__ import annotations

import asyncio
import gzip
import struct
from typing import Any

import pytest

from qkan_pack.serve._grpc_http import (
    GRPC_PREFIX,
    TRAILERS_HEADER,
    answer_over_http,
    is_grpc_call,
)

pb = pytest.importorskip("tritonclient.grpc.service_pb2")


class _Api:
    """``GrpcApi``'s surface: answers ModelInfer with the request's id, or sets a status."""

    def __init__(self, status: Any = None, details: str = "", as_bytes: bool = False) -> None:
        self.pb, self.status, self.details, self.as_bytes = pb, status, details, as_bytes
        self.seen: list[tuple[str, Any, Any]] = []
        self.payloads: list[bytes | None] = []

    def kept(self, payload: bytes) -> None:
        return None  # every call parsed (GrpcApi's kept layouts: tests/serve/test_oip.py)

    async def answer(self, rpc: str, request: Any, context: Any,
                     payload: bytes | None = None, kept: Any = None) -> Any:
        self.seen.append((rpc, request, context.invocation_metadata()))
        self.payloads.append(payload)
        if self.status is not None:
            context.set_code(self.status)
            context.set_details(self.details)
            if self.status.name == "UNAVAILABLE":
                context.set_trailing_metadata((("grpc-retry-pushback-ms", "1000"),))
            return pb.ModelInferResponse()
        reply = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        return reply.SerializeToString() if self.as_bytes else reply


class _Code:
    def __init__(self, name: str) -> None:
        self.name = name


def _scope(rpc: str = "ModelInfer", headers: list[tuple[bytes, bytes]] | None = None) -> dict:
    return {"type": "http", "method": "POST", "path": GRPC_PREFIX + rpc,
            "headers": [(b"content-type", b"application/grpc"), (b"te", b"trailers"),
                        *(headers or [])]}


def _call(api: _Api, body: bytes, limit: int = 1 << 20, **scope: Any) -> Any:
    from starlette.requests import Request

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return asyncio.run(answer_over_http(api, Request(_scope(**scope), receive), limit))


def _framed(message: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(message)) + message


def _headers(reply: Any) -> dict[bytes, bytes]:
    return dict(reply.raw_headers)


REQUEST = pb.ModelInferRequest(model_name="mlp", id="r1").SerializeToString()


@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_call_is_answered_with_its_framed_reply_and_status_in_trailers(as_bytes: bool) -> None:
    """The message is answered with its bytes as they came (``GrpcApi`` reads a kept head
    from them), and a reply that comes as bytes is framed as it is."""
    api = _Api(as_bytes=as_bytes)
    reply = _call(api, _framed(REQUEST), headers=[(b"authorization", b"Bearer t")])
    headers = _headers(reply)
    assert reply.status_code == 200 and headers[b"content-type"] == b"application/grpc"
    assert headers[TRAILERS_HEADER] == b"grpc-status: 0" and b"grpc-status" not in headers
    flag, length = struct.unpack(">BI", reply.body[:5])
    assert flag == 0 and len(reply.body) == 5 + length
    assert pb.ModelInferResponse.FromString(reply.body[5:]).id == "r1"
    ((rpc, request, metadata),) = api.seen
    assert rpc == "ModelInfer" and request.model_name == "mlp" and api.payloads == [REQUEST]
    assert metadata == (("authorization", "Bearer t"),)  # HTTP's own headers are not metadata


def test_a_status_the_answer_sets_is_a_trailers_only_reply() -> None:
    reply = _call(_Api(_Code("UNAVAILABLE"), "overloaded: retry after 1 s; 100% full\n"),
                  _framed(REQUEST))
    headers = _headers(reply)
    assert reply.body == b"" and TRAILERS_HEADER not in headers
    assert headers[b"grpc-status"] == b"14"
    assert headers[b"grpc-message"] == b"overloaded: retry after 1 s; 100%25 full%0A"
    assert headers[b"grpc-retry-pushback-ms"] == b"1000"  # trailing metadata goes along


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"\0\0", b"3", b"under 5 bytes"),
    (_framed(REQUEST)[:-1], b"3", b"which says"),
    (_framed(REQUEST) + _framed(REQUEST), b"3", b"one message"),
    (_framed(b"\xff\xff\xff"), b"3", b"does not parse"),
    (_framed(REQUEST, flag=1), b"3", b"no grpc-encoding"),
    (_framed(b"x" * 64), b"8", b"over the server"),
])
def test_a_malformed_body_gets_a_status_that_says_what_is_wrong(body: bytes, status: bytes,
                                                                says: bytes) -> None:
    api = _Api()
    reply = _call(api, body, limit=32)
    headers = _headers(reply)
    assert headers[b"grpc-status"] == status and says in headers[b"grpc-message"], headers
    assert not api.seen


def test_a_compressed_message_is_inflated_within_the_limit() -> None:
    api = _Api()
    reply = _call(api, _framed(gzip.compress(REQUEST), flag=1),
                  headers=[(b"grpc-encoding", b"gzip")])
    assert _headers(reply)[TRAILERS_HEADER] == b"grpc-status: 0"
    assert api.seen[0][1].id == "r1"
    bomb = _framed(gzip.compress(b"\0" * 10_000), flag=1)
    refused = _call(_Api(), bomb, limit=1000, headers=[(b"grpc-encoding", b"gzip")])
    assert _headers(refused)[b"grpc-status"] == b"8"


def test_an_unknown_method_is_unimplemented_and_only_grpc_calls_take_this_path() -> None:
    reply = _call(_Api(), _framed(REQUEST), rpc="NoSuchCall")
    assert _headers(reply)[b"grpc-status"] == b"12"
    assert is_grpc_call(_scope())
    assert not is_grpc_call({**_scope(), "headers": [(b"content-type", b"application/json")]})
    assert not is_grpc_call({**_scope(), "path": "/v2/models/mlp/infer"})
