"""HAProxy's own replies, in place of its plain-text errors: the JSON 503 with ``Retry-After``
(its 502/503/504, and the listener every HTTP app backend falls back to when no replica can
take a request), the JSON 408 (headers or a buffered body too slow), and for gRPC backends
the call's trailers-only ``UNAVAILABLE`` with the message and ``grpc-retry-pushback-ms``
(gRPC's Retry-After): a gRPC client read an HTTP 503 as "Received http2 header with
status: 503", without either. Part of the HAProxy wrapper's rewrite (``_haproxy``), in a
module of its own.
"""

from __future__ import annotations

import os

ERROR_CODES = (502, 503, 504)
TIMEOUT_CODE = 408
UNAVAILABLE_MESSAGE = ("no replica can answer now (the server is starting, stopping or "
                       "replacing a replica); retry after 1 s")
UNAVAILABLE_BODY = b'{"error":"%s"}' % UNAVAILABLE_MESSAGE.encode()
#: HAProxy's own listener answering every request with the JSON 503 (``_haproxy``): each app
#: backend's backup server, on a unix socket in the error files' directory. Where that path
#: is too long for a socket it is left out, and a request that no replica can take may end
#: in a closed connection again.
UNAVAILABLE_SECTION = "frontend qkan-pack-unavailable"
UNAVAILABLE_SOCKET = "unavailable.sock"
UNAVAILABLE_SERVER = "qkan-pack-unavailable"
#: The same for gRPC backends: a gRPC client reads an HTTP 503 as "Received http2 header
#: with status: 503", without the message or the pushback; these answer with the call's
#: trailers-only reply instead (UNAVAILABLE, the message, ``grpc-retry-pushback-ms``), as a
#: replica's own refusal does (``_oip_grpc``), and HAProxy's 502/503/504 on a gRPC backend
#: come from gRPC error files (``GRPC_ERROR_FILE``) likewise.
GRPC_UNAVAILABLE_SECTION = "frontend qkan-pack-unavailable-grpc"
GRPC_UNAVAILABLE_SOCKET = "unavailable-grpc.sock"
GRPC_UNAVAILABLE_SERVER = "qkan-pack-unavailable-grpc"
GRPC_ERROR_FILE = "grpc-{code}.http"
#: gRPC's UNAVAILABLE, the status its HTTP mapping gives 502, 503 and 504.
GRPC_UNAVAILABLE = 14
#: gRPC's DEADLINE_EXCEEDED: a call whose message did not arrive in time (HAProxy's 408).
GRPC_DEADLINE_EXCEEDED = 4
_SOCKET_PATH_MAX = 107  # sockaddr_un's sun_path, less its terminating NUL


def grpc_status_headers(message: str, retry_after_s: int) -> str:
    """An HAProxy reply's headers that make it a gRPC call's trailers-only reply: status
    UNAVAILABLE, ``message`` (plain ASCII without quotes or ``%``: no percent-encoding
    needed) and the pushback. Not its content type: HAProxy drops a reply's
    ``content-type`` when it has no body (``GRPC_CONTENT_TYPE`` sets it after)."""
    return (f'hdr grpc-status {GRPC_UNAVAILABLE} hdr grpc-message "{message}" '
            f'hdr grpc-retry-pushback-ms {retry_after_s * 1000}')


#: The content type gRPC requires of every reply, trailers-only ones included (grpc-go and
#: grpc-java refuse a reply without it), set on HAProxy's own replies to a gRPC backend's
#: calls (a replica's carry theirs): ``http-request deny`` and ``return`` drop
#: ``hdr content-type`` without a body ("header 'content-type' always ignored by the http
#: reply"). The listener's (``grpc_unavailable_section``) sets it on every reply.
GRPC_CONTENT_TYPE = ("    http-after-response set-header content-type application/grpc "
                     "if { status 200 } !{ res.hdr(content-type) -m found }")


def unavailable_socket(error_dir: str, name: str) -> str | None:
    """Where one of HAProxy's own 503 listeners listens, if that path fits a unix socket."""
    path = f"{error_dir}/{name}"
    return path if len(os.fsencode(path)) <= _SOCKET_PATH_MAX else None


def unavailable_section(socket_path: str | None) -> list[str]:
    """The listener every HTTP app backend falls back to when no replica can take a request
    (none without its socket)."""
    return _listener(UNAVAILABLE_SECTION, socket_path, [
        "    http-request return status 503 content-type application/json hdr Retry-After 1 "
        f"hdr Cache-Control no-cache string '{UNAVAILABLE_BODY.decode()}'"])


def grpc_unavailable_section(socket_path: str | None) -> list[str]:
    """``unavailable_section`` for gRPC backends: the call's trailers-only UNAVAILABLE."""
    return _listener(GRPC_UNAVAILABLE_SECTION, socket_path, [
        f"    http-request return status 200 {grpc_status_headers(UNAVAILABLE_MESSAGE, 1)}",
        "    http-after-response set-header content-type application/grpc"])


def _listener(section: str, socket_path: str | None, rules: list[str]) -> list[str]:
    """One of HAProxy's own listeners on a unix socket, answering every request by ``rules``
    (none without its socket)."""
    if socket_path is None:
        return []
    return [section, "    mode http", "    no log", f"    bind unix@{socket_path} mode 600", *rules]


def error_response() -> bytes:
    """The raw HTTP reply HAProxy sends instead of its 502/503/504."""
    return _raw_reply("503 Service Unavailable", UNAVAILABLE_BODY, "Retry-After: 1\r\n")


def grpc_error_response() -> bytes:
    """The raw reply HAProxy sends a gRPC call instead of its 502/503/504: the call's
    trailers-only UNAVAILABLE (an HTTP 200 whose headers carry the status, as gRPC's)."""
    return _grpc_raw_reply(GRPC_UNAVAILABLE, UNAVAILABLE_MESSAGE, "grpc-retry-pushback-ms: 1000\r\n")


def grpc_timeout_response(timeout_s: int) -> bytes:
    """The raw reply HAProxy's gRPC frontend sends a call whose headers or message took too
    long to arrive (its 408): DEADLINE_EXCEEDED, the server's deadline for receiving it,
    where grpcio read the JSON 408 as UNKNOWN, "Received http2 header with status: 408"."""
    return _grpc_raw_reply(GRPC_DEADLINE_EXCEEDED, "request headers or message not received "
                           f"within {timeout_s} s")


def _grpc_raw_reply(status: int, message: str, extra_headers: str = "") -> bytes:
    head = ("HTTP/1.1 200 OK\r\nContent-Type: application/grpc\r\n"
            f"grpc-status: {status}\r\ngrpc-message: {message}\r\n{extra_headers}"
            "Cache-Control: no-cache\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    return head.encode()


def timeout_response(timeout_s: int) -> bytes:
    """The raw HTTP reply HAProxy sends when headers (or a buffered body) are too slow."""
    body = (b'{"error":"request headers or body not received within %d s"}' % timeout_s)
    return _raw_reply("408 Request Timeout", body)


def _raw_reply(status: str, body: bytes, extra_headers: str = "") -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra_headers}"
            "Cache-Control: no-cache\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body
