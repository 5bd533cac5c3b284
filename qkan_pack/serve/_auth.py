"""The bearer token of a serve: which tokens and token files are usable, the one comparison
(sha256 digests, constant time), and the gate Ray Serve puts in front of every HTTP server it
starts for the serve.

Only the token's sha256 leaves the serve process: replicas get it in their options, and
Ray's processes (proxies, replicas, HAProxy through its wrapper) in ``TOKEN_DIGEST_ENV``.

Why a gate besides the replica's own check (``_http.HttpApi``): Ray answers ``/-/routes`` and
``/-/healthz`` itself, in its proxies and before any app code in each replica's direct
ingress, which listens on ``--host``; its HAProxy config answers them too (``_haproxy``
requires the token there). With a token set, every request to any of these listeners needs
it, except the liveness route ``LIVENESS_PATH``: HAProxy's health checks of the replicas use
it and cannot send a token without holding it, so it stays open and answers its status code
with an empty body (nothing about the app, the replicas or the route table).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any

from ..errors import FileReadError, ServeTokenError

#: Ray Serve's callback for the middlewares of its HTTP servers, and where the gate reads
#: the digest in Ray's processes.
RAY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
GATE_CALLBACK = "qkan_pack.serve._auth:gate_middlewares"
TOKEN_DIGEST_ENV = "QKAN_PACK_SERVE_TOKEN_SHA256"
#: The one route answered without the token: its status only (200, or 503 while nothing can
#: serve), with an empty body.
LIVENESS_PATH = "/-/healthz"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 1024
#: A token file is read up to this size (its first line is the token; comments may follow).
MAX_TOKEN_FILE_BYTES = 64 * 1024
UTF8_BOM = b"\xef\xbb\xbf"
UNAUTHORIZED_BODY = (b'{"error":"missing or wrong bearer token: send '
                     b"'Authorization: Bearer <token>'\"}")
CHALLENGE = 'Bearer realm="qkan-pack"'
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def token_digest(token: str) -> str:
    """What replicas and Ray's processes keep instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_token(token: str, source: str) -> str:
    """``token`` if it can be a bearer token, else ``ServeTokenError`` naming ``source``.

    Printable ASCII only: HTTP header values are bytes that servers read as latin-1, and
    clients encode text beyond ASCII differently (curl sends the terminal's UTF-8, Python's
    http.client latin-1), so a non-ASCII token would admit some clients and refuse others."""
    problem = _token_problem(token)
    if problem:
        raise ServeTokenError(source=source, problem=problem)
    return token


def _token_problem(token: str) -> str | None:
    if not token:
        return "holds no token"
    if len(token) > MAX_TOKEN_CHARS:
        return f"holds a token longer than {MAX_TOKEN_CHARS} characters"
    for at, char in enumerate(token):
        if not char.isascii():
            return (f"holds a non-ASCII character ({ascii(char)[1:-1]} at position {at + 1}): "
                    "HTTP clients encode such characters differently; use ASCII letters, "
                    "digits and punctuation (e.g. openssl rand -hex 32)")
        if not char.isprintable() or char.isspace():
            return (f"holds whitespace or a control character ({ascii(char)[1:-1]} at "
                    f"position {at + 1}) in the token")
    if len(token) < MIN_TOKEN_CHARS:
        return (f"holds a token shorter than {MIN_TOKEN_CHARS} characters "
                "(e.g. openssl rand -hex 32)")
    return None


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in ``path``: its first line, stripped. Read as every supplied file is
    (``runtime.read_regular_file``: a regular file, a FIFO refused without waiting on it),
    of at most ``MAX_TOKEN_FILE_BYTES``, that its group and others cannot write (whoever
    can write it chooses the token), in UTF-8 (a leading byte-order mark is dropped: editors
    on Windows write one, and it became part of the token)."""
    from ..runtime import read_regular_file  # here: serve's modules import no runtime

    source = f"token file {path}"
    try:
        data = read_regular_file(path, limit=MAX_TOKEN_FILE_BYTES,
                                 vet=partial(_others_cannot_write, path))
    except FileReadError as exc:
        raise ServeTokenError(source=source, problem=exc.problem) from None
    try:
        text = data.removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ServeTokenError(source=source, problem=(
            f"is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8 or ASCII"
        )) from None
    return check_token((text.strip().splitlines() or [""])[0].strip(), source)


def _others_cannot_write(path: str | os.PathLike[str], info: os.stat_result) -> str | None:
    if info.st_mode & 0o022:
        return (f"is writable by its group or others (mode {stat.S_IMODE(info.st_mode):04o}): "
                f"whoever can write it chooses the token; run chmod 600 {path}")
    return None


def authorization(scope: Scope) -> bytes | None:
    """The request's first ``Authorization`` header, read from the raw ASGI headers."""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"authorization":
            return value
    return None


def bearer_matches(header: bytes | None, token_sha256: str) -> bool:
    """Whether ``header`` is ``Bearer <token>`` for the token whose sha256 is given (the
    digests compared in constant time)."""
    scheme, _, token = (header or b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(
        hashlib.sha256(token.strip()).hexdigest(), token_sha256)


def check_digest(value: str) -> str:
    """A sha256 as 64 lowercase hex digits (it is written into HAProxy's config)."""
    if not _SHA256_HEX.fullmatch(value):
        raise ServeTokenError(source=TOKEN_DIGEST_ENV, problem="is not a sha256 hex digest")
    return value


#: Which requests this process's app checks the token of itself: gRPC calls over HTTP, in
#: an ``ArtifactServer`` (``_grpc_http.is_grpc_call``). The gate passes them on, so that a
#: call without the token gets the protocol's ``UNAUTHENTICATED``, counted as the replica
#: counts it. A replica process holds one app; any other (a repository's router, the no-op)
#: sets none and the gate answers every request.
_checked_by_app: Callable[[Scope], bool] = lambda scope: False  # noqa: E731


def app_checks_tokens_of(requests: Callable[[Scope], bool]) -> None:
    """Say that this process's app checks the token of ``requests`` itself."""
    global _checked_by_app
    _checked_by_app = requests


class TokenGate:
    """ASGI middleware in front of each HTTP server Ray Serve starts for the serve (its
    proxies, each replica's direct ingress): a request without the token gets the JSON 401
    before Ray's own routes or the app see it; ``LIVENESS_PATH`` passes without it, reduced
    to its status code (see the module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], *,
                 token_sha256: str) -> None:
        self.app = app
        self.token_sha256 = check_digest(token_sha256)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")[len(scope.get("root_path", "")):]
        if kind == "http" and path == LIVENESS_PATH:
            await self.app(scope, receive, _status_only(send))
        elif bearer_matches(authorization(scope), self.token_sha256) or _checked_by_app(scope):
            await self.app(scope, receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        else:
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
                (b"www-authenticate", CHALLENGE.encode())]})
            await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})


def _status_only(send: Send) -> Send:
    """``send`` passing on a reply's status code with an empty body and no other header."""
    async def status_only(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            await send({"type": kind, "status": message["status"],
                        "headers": [(b"content-length", b"0")]})
        elif kind == "http.response.body" and not message.get("more_body", False):
            await send({"type": kind, "body": b""})

    return status_only


def gate_middlewares() -> list[Any]:
    """Ray Serve's HTTP callback (``RAY_CALLBACK_ENV`` names it in the environment of Ray's
    processes): the gate when the serve has a token (``TOKEN_DIGEST_ENV``), else none."""
    from starlette.middleware import Middleware

    digest = os.environ.get(TOKEN_DIGEST_ENV)
    return [Middleware(TokenGate, token_sha256=digest)] if digest else []


def gate_env(token_sha256: str | None) -> dict[str, str]:
    """The environment that puts the gate in front of Ray's HTTP servers (none without a
    token)."""
    if token_sha256 is None:
        return {}
    return {RAY_CALLBACK_ENV: GATE_CALLBACK, TOKEN_DIGEST_ENV: check_digest(token_sha256)}

