"""Every access to uvicorn's internals, in one place: each reply leaves a replica in one
socket write (status line, headers and body together).

uvicorn (the HTTP server inside every Ray Serve replica) writes a reply's status line and
headers when the app sends ``http.response.start`` and its body when the app sends
``http.response.body``: two ``transport.write`` calls, two ``send`` system calls, two TCP
segments. Ray's replica passes the two ASGI messages through a queue, so other work on the
event loop (a batch's replay) can run between them. That costs twice:

- CPU: the two writes were the largest single item of a replica's per-request time (py-spy,
  ``benchmarks/results/2026-12-04_cpu_replica-cpu-per-request.md``: 18.8% of the no-op's
  samples, 13.7% of the model's);
- lost replies: a replica killed between the two writes leaves the client a 200 whose body
  never comes, which HAProxy has already passed on and can neither retry nor replace
  (``benchmarks/results/2026-12-04_cpu_serve_kill-loop_truncated-replies.txt``).

``write_replies_whole`` makes uvicorn hold a reply's head until the first body write and send
both in one write. A replica that dies in between has sent nothing, which HAProxy retries on
another replica (``retry-on empty-response``); an app that fails after starting its reply has
its connection closed with nothing sent, where the client used to get headers and no body.
Streamed replies are unchanged after their first chunk. The change is to uvicorn's two
protocol classes, in the replica's process only (each replica calls it once at start), and is
skipped, with the reason, if uvicorn is outside ``SUPPORTED`` or their ``send`` is not what
this was written against.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from .._supported import UVICORN
from ._grpc_http import TRAILERS_HEADER

#: uvicorn releases whose ``RequestResponseCycle.send`` this was written against (stated in
#: ``_supported``; the ``serve`` extra declares the same range).
SUPPORTED = UVICORN
#: Marks a protocol class whose ``send`` already holds reply heads.
_MARK = "_qkan_pack_whole_replies"
_HELD = "_qkan_pack_held_head"
_TRAILERS = "_qkan_pack_trailers"
#: How uvicorn ends a chunked body: the last chunk, then no trailers.
_LAST_CHUNK = b"0\r\n\r\n"


class _HeldWrites:
    """The connection's transport while uvicorn writes a reply's head: writes are kept."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HeadFirst:
    """The connection's transport while uvicorn writes a body: the held head goes out with
    the first write, or on its own before a close or once the body's send returned. A send
    that raised sends nothing and the head stays held (uvicorn then closes the connection:
    an empty reply, which HAProxy may retry, rather than headers without their body)."""

    def __init__(self, transport: Any, head: list[bytes], trailers: bytes | None = None) -> None:
        self._transport = transport
        self._head: list[bytes] | None = head
        self._trailers = trailers

    def write(self, data: bytes) -> None:
        head, self._head = self._head, None
        if self._trailers is not None and data.endswith(_LAST_CHUNK):
            data = data[:-2] + self._trailers + b"\r\n\r\n"  # after the last chunk's line
            self._trailers = None
        self._transport.write(b"".join((*head, data)) if head else data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def flush(self) -> None:
        head, self._head = self._head, None
        if head:
            self._transport.write(b"".join(head))

    @property
    def unwritten(self) -> list[bytes] | None:
        """The head, while it has not been written."""
        return self._head

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


Send = Callable[[Any, dict[str, Any]], Awaitable[None]]


def _holding_heads(send: Send) -> Send:
    """uvicorn's ``RequestResponseCycle.send`` with the head held for the first body write."""

    @functools.wraps(send)
    async def send_whole(self: Any, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            message = _trailers_taken(self, message)
            transport, held = self.transport, _HeldWrites(self.transport)
            self.transport = held
            try:
                await send(self, message)
            finally:
                self.transport = transport
            if held.chunks:
                setattr(self, _HELD, held.chunks)
            return
        head = self.__dict__.pop(_HELD, None)
        trailers = None if message.get("more_body") else self.__dict__.pop(_TRAILERS, None)
        if head is None and trailers is None:
            await send(self, message)
            return
        transport, joined = self.transport, _HeadFirst(self.transport, head or [], trailers)
        self.transport = joined
        try:
            await send(self, message)
        except BaseException:
            if joined.unwritten:  # an app that catches the error and sends on keeps its head
                setattr(self, _HELD, joined.unwritten)
            raise
        finally:
            self.transport = transport
        if not getattr(self, "disconnected", False):
            joined.flush()  # a reply without body bytes (HEAD): its head alone

    return send_whole


def _trailers_taken(cycle: Any, message: dict[str, Any]) -> dict[str, Any]:
    """A reply head naming trailers (``_grpc_http.TRAILERS_HEADER``: a gRPC call's status)
    without that header and its length, so that uvicorn sends the body chunked; the
    trailers are kept on ``cycle`` for its last chunk. Any other head as it is."""
    headers = message.get("headers") or ()
    trailers = [value for name, value in headers if name.lower() == TRAILERS_HEADER]
    if not trailers:
        return message
    setattr(cycle, _TRAILERS, b"\r\n".join(trailers))
    kept = [(name, value) for name, value in headers
            if name.lower() not in (TRAILERS_HEADER, b"content-length")]
    return {**message, "headers": kept}


def write_replies_whole() -> list[str]:
    """Make this process's uvicorn write each reply in one piece (idempotent). Returns why
    an installed protocol class was left alone, one line each (nothing when all changed)."""
    return _each_cycle(change=True)


def replies_whole_here() -> bool:
    """Whether ``write_replies_whole`` changes every installed protocol class here (what a
    replica with this uvicorn then does, trailers included), changing nothing."""
    return not _each_cycle(change=False)


def _each_cycle(change: bool) -> list[str]:
    release = unsupported_uvicorn()
    if release is not None:
        return [release]
    skipped = []
    for module_name in ("uvicorn.protocols.http.httptools_impl", "uvicorn.protocols.http.h11_impl"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # httptools is optional for uvicorn (it then uses h11)
            continue
        cycle = getattr(module, "RequestResponseCycle", None)
        problem = _unexpected(cycle)
        if problem:
            skipped.append(f"{module_name}: {problem}")
        elif change and cycle is not None and not getattr(cycle, _MARK, False):
            cycle.send = _holding_heads(cycle.send)
            setattr(cycle, _MARK, True)
    return skipped


def unsupported_uvicorn() -> str | None:
    """Why this uvicorn is not one the change was written against, or None."""
    try:
        import uvicorn
    except ImportError:
        return "uvicorn is not installed"
    if not SUPPORTED.admits(uvicorn.__version__):
        return SUPPORTED.outside(uvicorn.__version__, "replies are written as uvicorn writes them")
    return None


def _unexpected(cycle: Any) -> str | None:
    """Why ``cycle`` is not the uvicorn class this was written against, else None."""
    if cycle is None or hasattr(cycle, "__slots__"):
        return "no RequestResponseCycle without __slots__"
    if getattr(cycle, _MARK, False):
        return None
    send = getattr(cycle, "send", None)
    if not inspect.iscoroutinefunction(send):
        return "its send is not a coroutine function"
    try:
        source = inspect.getsource(send)
    except (OSError, TypeError):
        return "the source of its send is not available"
    if "self.transport.write(" not in source or "self.response_started" not in source:
        return "its send does not write through self.transport"
    return None
