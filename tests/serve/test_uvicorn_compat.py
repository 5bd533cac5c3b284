"""A replica's uvicorn writes each reply in one piece (``serve/_uvicorn_compat``): nothing of a
reply reaches the client before its body is ready, the bytes are the same as before, and a
reply that fails after its start sends nothing at all. A real uvicorn server on loopback,
for each of its two HTTP implementations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from ._server import free_port

uvicorn = pytest.importorskip("uvicorn", reason="uvicorn comes with Ray Serve")


def _app(body_gate: asyncio.Event, fail_after_start: bool = False) -> Callable:
    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"11")]})
        await body_gate.wait()
        if fail_after_start:
            raise RuntimeError("the model failed after the reply started")
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    return app


async def _with_server(http: str, app: Callable, client: Callable) -> Any:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=http, lifespan="off",
                            log_level="critical", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        return await client(port)
    finally:
        server.should_exit = True
        await task


REQUEST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
HEAD_REQUEST = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"


def _http_kinds() -> list[str]:
    kinds = ["h11"]
    try:
        import httptools  # noqa: F401
    except ImportError:
        return kinds
    return ["httptools", *kinds]


@pytest.fixture(autouse=True)
def _whole_replies() -> None:
    from qkan_pack.serve._uvicorn_compat import write_replies_whole

    assert write_replies_whole() == []


@pytest.mark.parametrize("http", _http_kinds())
def test_nothing_of_a_reply_leaves_before_its_body(http: str) -> None:
    """Before: the status line and headers left at once, the body when it was ready (a
    replica killed in between left the client a 200 without its body)."""

    async def scenario() -> tuple[bytes, bytes, bytes]:
        gate = asyncio.Event()

        async def client(port: int) -> tuple[bytes, bytes, bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            try:
                early = await asyncio.wait_for(reader.read(4096), 0.3)
            except asyncio.TimeoutError:
                early = b""
            gate.set()
            reply = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), 5)
            writer.write(REQUEST)  # the connection stays usable (keep-alive)
            again = await asyncio.wait_for(reader.readuntil(b'{"ok":true}'), 5)
            writer.close()
            return early, reply, again

        return await _with_server(http, _app(gate), client)

    early, reply, again = asyncio.run(scenario())
    assert early == b""
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 11\r\n" in reply
    assert reply.endswith(b'\r\n\r\n{"ok":true}')
    assert again.startswith(b"HTTP/1.1 200 OK\r\n") and again.endswith(b'\r\n\r\n{"ok":true}')


@pytest.mark.parametrize("http", _http_kinds())
def test_a_reply_that_fails_after_its_start_sends_nothing(http: str) -> None:
    """Before: the client got the headers of a 200 and then a closed connection."""

    async def scenario() -> bytes:
        gate = asyncio.Event()
        gate.set()

        async def client(port: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            received = await asyncio.wait_for(reader.read(), 5)  # until the server closes
            writer.close()
            return received

        return await _with_server(http, _app(gate, fail_after_start=True), client)

    assert asyncio.run(scenario()) == b""


@pytest.mark.parametrize("http", _http_kinds())
def test_a_head_reply_still_sends_its_headers(http: str) -> None:
    async def scenario() -> bytes:
        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"11")]})
            await send({"type": "http.response.body", "body": b""})

        async def client(port: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HEAD_REQUEST)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.close()
            return head

        return await _with_server(http, app, client)

    head = asyncio.run(scenario())
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 11\r\n" in head


def test_a_uvicorn_this_was_not_written_for_is_left_alone() -> None:
    from qkan_pack.serve._uvicorn_compat import _unexpected

    class Slotted:
        __slots__ = ()

    class Plain:
        def send(self, message: dict) -> None:  # not a coroutine
            pass

    class Elsewhere:
        async def send(self, message: dict) -> None:
            await self.writer.write(message)

    assert "__slots__" in _unexpected(Slotted)
    assert "coroutine" in _unexpected(Plain)
    assert "self.transport" in _unexpected(Elsewhere)


@pytest.mark.parametrize("http", _http_kinds())
def test_an_app_that_catches_a_failed_send_keeps_its_head(http: str) -> None:
    """Audit: the held head was taken before the body's send ran; when that send raised (a
    second start) and the app caught it and sent its body, the client got the body alone."""

    async def scenario() -> bytes:
        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"2")]})
            with pytest.raises(RuntimeError):
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        async def client(port: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = await asyncio.wait_for(reader.readuntil(b"ok"), 5)
            writer.close()
            return reply

        return await _with_server(http, app, client)

    reply = asyncio.run(scenario())
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nok")


def test_a_uvicorn_outside_the_supported_releases_is_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from qkan_pack.serve._uvicorn_compat import SUPPORTED, unsupported_uvicorn, write_replies_whole

    assert unsupported_uvicorn() is None, uvicorn.__version__  # the installed one is supported
    monkeypatch.setattr(uvicorn, "__version__", "1.2.0")
    said = write_replies_whole()
    assert said == [f"uvicorn 1.2.0 is outside the supported range {SUPPORTED}; replies are "
                    "written as uvicorn writes them"]


@pytest.mark.parametrize("http", _http_kinds())
def test_a_reply_naming_trailers_ends_its_chunked_body_with_them(http: str) -> None:
    """gRPC over HTTP/1.1 (``_grpc_http``): the status of a call goes in trailers after a
    chunked body, which uvicorn cannot send; the reply names them in a header that never
    leaves, its length is dropped, and the last chunk carries them. The connection stays
    usable."""
    from qkan_pack.serve._grpc_http import TRAILERS_HEADER

    async def scenario() -> tuple[bytes, bytes]:
        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/grpc"),
                                    (b"content-length", b"5"),
                                    (TRAILERS_HEADER, b"grpc-status: 0")]})
            await send({"type": "http.response.body", "body": b"hello"})

        async def client(port: int) -> tuple[bytes, bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            first = await asyncio.wait_for(reader.readuntil(b"grpc-status: 0\r\n\r\n"), 5)
            writer.write(REQUEST)
            second = await asyncio.wait_for(reader.readuntil(b"grpc-status: 0\r\n\r\n"), 5)
            writer.close()
            return first, second

        return await _with_server(http, app, client)

    for reply in asyncio.run(scenario()):
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), reply
        assert b"transfer-encoding: chunked" in head.lower(), reply
        assert b"content-length" not in head.lower() and TRAILERS_HEADER not in head.lower()
        assert body == b"5\r\nhello\r\n0\r\ngrpc-status: 0\r\n\r\n", reply
