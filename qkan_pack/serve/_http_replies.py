"""The replies a replica and a repository's router write themselves: JSON (errors included),
raw bytes, and the protocol's binary replies, as starlette ``Response`` objects whose headers
are written out once (``_json_reply_type``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._wire import dumps

if TYPE_CHECKING:
    from starlette.responses import Response


def method_not_allowed(method: str, path: str, allowed: str) -> Response:
    return json_response(405, {"error": f"{method} is not allowed on {path}; use {allowed}"},
                         {"Allow": allowed})


def binary_response(payload: bytes, header_length: int) -> Response:
    """An Open Inference Protocol reply with binary tensors after its JSON header."""
    reply = raw_response(200, payload)
    reply.raw_headers[1:] = [(b"content-type", b"application/octet-stream"),
                             (b"inference-header-content-length", b"%d" % header_length)]
    return reply


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return raw_response(status, dumps(payload), headers)


def raw_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return _json_reply_type()(status, body, headers)


@functools.cache
def _json_reply_type() -> Callable[[int, bytes, dict[str, str] | None], Response]:
    """A starlette ``Response`` (Ray Serve sends only those as they are) whose headers are
    written out directly: starlette's constructor re-derives them from the media type for
    every reply, several times what writing them here costs. Made on first use, so
    that this module loads without starlette."""
    from starlette.responses import Response

    class JsonReply(Response):
        media_type = "application/json"

        def __init__(self, status: int, body: bytes, headers: dict[str, str] | None) -> None:
            self.status_code = status
            self.body = body
            self.background = None
            self.raw_headers = [(b"content-length", str(len(body)).encode()),
                                (b"content-type", b"application/json")]
            if headers:
                self.raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                     for k, v in headers.items()]

    return JsonReply

