"""``qkan-pack serve`` end to end: one server process (2 replicas, HAProxy ingress, a token,
tight limits) shared by the module, driven over HTTP as clients drive it. Each test states the
point of issue 19 it covers. Lifecycle tests (their own servers) are in test_lifecycle.py."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ._server import Server, command_line, is_loopback, listeners, strict_json, tagged_pids

pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
pytestmark = [pytest.mark.serve, pytest.mark.slow]

TOKEN = "test-token-0123456789abcdef"
_UNAUTHORIZED = (b'{"error":"missing or wrong bearer token: send '
                 b"'Authorization: Bearer <token>'\"}")
BODY_LIMIT = 64 * 1024  # --max-body-mb 0.0625
ACCEPTED = ["x 1x2 float32", "x 8x2 float32"]


@pytest.fixture(scope="module")
def server(artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # a token file others may write is refused
    running = Server(artifact, ["--replicas", "2", "--auth-token-file", str(token_file),
                                "--max-batch-wait-ms", "20", "--max-ongoing-requests", "4",
                                "--max-queued-requests", "4", "--max-body-mb", "0.0625",
                                "--body-timeout-s", "2", "--grace-s", "5"], token=TOKEN).start()
    try:
        yield running
        code, stderr = running.stop(signal.SIGTERM)
        assert code == 0, stderr
        assert "stopped" in stderr and "INFO" not in stderr, stderr  # Ray's logs stay quiet
        deadline = time.monotonic() + 10
        from ._server import tagged_pids
        while tagged_pids(running.tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tagged_pids(running.tag) == []  # nothing left: Ray, HAProxy, replicas
    finally:
        running.kill()


@pytest.fixture(scope="module")
def predictor(artifact: Path) -> Any:
    from qkan_pack import Predictor

    with Predictor.load(artifact, "cpu") as loaded:
        yield loaded


def _rows(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (count, 2)).astype(np.float32)


def _close(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=1e-5, atol=1e-6)


def _all_stats(server: Server) -> dict[str, dict[str, Any]]:
    """Each replica's counters by replica id (HAProxy alternates between them)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(40):
        status, stats = server.json("/stats")
        assert status == 200
        seen[stats["replica"]] = stats
        if len(seen) == 2:
            break
    return seen


def test_start_prints_the_ready_line_and_url_only(server: Server) -> None:
    # device "auto" resolves to the first GPU where there is one (this test runs on both hosts)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert server.stdout[0].startswith(f"serving {server.artifact} (sha256:")
    assert f"at http://127.0.0.1:{server.port}/ with 2 replica(s) on {device}" in server.stdout[0]
    assert "bearer token required" in server.stdout[0]


@pytest.mark.parametrize(("method", "path"), [("GET", "/"), ("POST", "/"), ("GET", "/stats"),
                                              ("POST", "/stats/reset"), ("GET", "/nowhere")])
@pytest.mark.parametrize("token", [None, "wrong-token-0123456789"])
def test_every_route_needs_the_token(server: Server, method: str, path: str,
                                     token: str | None) -> None:
    body = b'{"inputs": [[0.1, 0.2]]}' if method == "POST" else None
    status, headers, raw = server.request(path, body, method=method, token=token)
    assert status == 401 and headers["content-type"] == "application/json"
    assert "bearer token" in strict_json(raw)["error"]
    assert headers["www-authenticate"].startswith("Bearer")


#: The processes of the serve's own HTTP servers: HAProxy (frontend, stats, exporter), the
#: replicas' direct ingress, Ray Serve's proxy.
HTTP_SERVERS = (b"haproxy", b"ServeReplica", b"ProxyActor")


def _get(port: int, path: str, token: str | None = None) -> tuple[int, bytes] | None:
    """GET over HTTP/1.1; None when the port does not speak it (Ray's gRPC ports, which
    Ray's own token authentication guards)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        reply = conn.getresponse()
        return reply.status, reply.read()
    except (http.client.HTTPException, ConnectionError):
        return None
    finally:
        conn.close()


def _grpc_refused(port: int) -> bool:
    """Whether a request to a replica's gRPC server without Ray's own token is refused."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary("/ray.serve.ASGIService/HandleRequest")(b"", timeout=10)
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


def test_every_listener_needs_the_token_and_none_binds_beyond_loopback(server: Server) -> None:
    """Audit (issue 32, item 9): ``/-/healthz`` and ``/-/routes`` answered without the token
    on HAProxy's frontend, the replicas' direct-ingress ports and Ray's proxy; Ray's metrics
    exporters (node address, session and replica names) listened on every interface
    whatever ``--host`` said. With ``--host 127.0.0.1`` every process of the serve now
    listens on loopback only (but for one gRPC server per replica that Ray binds to [::]
    and authenticates itself), and each of its HTTP servers answers ``/-/routes`` and ``/``
    with the JSON 401 and ``/-/healthz`` with its bare status."""
    found = listeners(tagged_pids(server.tag))
    outside = [(command_line(pid)[:90], host, port) for pid, host, port in found
               if not is_loopback(host)]
    # Ray Serve binds each replica's inter-deployment gRPC server to [::] whatever the node
    # address (replica.py: "[::]:0", no setting); Ray's token authentication guards it
    assert found and len(outside) == 2, outside
    for command, _, port in outside:
        assert command.startswith("ray::ServeReplica") and _grpc_refused(port), (command, port)
    probed = []
    for pid, _, port in found:
        name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        if not any(kind in name for kind in HTTP_SERVERS) or _get(port, "/-/routes") is None:
            continue
        probed.append(name.decode())
        for path in ("/-/routes", "/", "/stats", "/metrics"):
            assert _get(port, path) == (401, _UNAUTHORIZED), (name, port, path)
        status, body = _get(port, "/-/healthz")
        if b"haproxy" in name and port != server.port:  # its stats page and exporter
            assert (status, body) == (401, _UNAUTHORIZED), (port, status, body)
        else:
            assert status in (200, 503) and body == b"", (name, port, status, body)
    # HAProxy's frontend, stats page and exporter, each replica's ingress, Ray's proxy
    assert len(probed) >= 6 and sum("ServeReplica" in p for p in probed) == 2, probed
    assert _get(server.port, "/-/routes", TOKEN)[0] == 200
    assert _get(server.port, "/-/healthz", TOKEN) == (200, b"")


def test_get_describes_the_artifact_without_process_ids(server: Server) -> None:
    status, described = server.json("/")
    assert status == 200 and described["accepted"] == ACCEPTED
    assert described["serving"]["auth"] is True and "token_sha256" not in described["serving"]
    assert described["replica"]["captured"] == ["1x2", "8x2"]
    assert "pid" not in json.dumps(described)
    assert "pid" not in json.dumps(server.json("/stats")[1])


def test_single_rows_round_trip_in_both_forms(server: Server, predictor: Any) -> None:
    row = _rows(1)
    status, reply = server.json("/", {"inputs": row.tolist()})
    assert status == 200
    _close(reply["outputs"], predictor(row))
    status, reply = server.json("/", {"inputs": row[0].tolist()})
    assert status == 200 and np.asarray(reply["outputs"]).shape == (2,)
    _close(reply["outputs"], predictor(row)[0])


def test_concurrent_rows_share_replays(server: Server, predictor: Any) -> None:
    before = _all_stats(server)
    rows = _rows(8, seed=1)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda r: server.json("/", {"inputs": [r.tolist()]}), rows))
    for row, (status, reply) in zip(rows, replies):
        assert status == 200
        _close(reply["outputs"], predictor(row[None]))
    after = _all_stats(server)
    replayed = sum(after[r]["rows_replayed"] - before.get(r, {}).get("rows_replayed", 0)
                   for r in after)
    replays = sum(sum(after[r]["replays"].values()) - sum(before.get(r, {}).get(
        "replays", {}).values()) for r in after)
    assert replayed == 8 and replays < 8, (before, after)


def test_captured_batch_and_base64(server: Server, predictor: Any) -> None:
    rows = _rows(8, seed=3)
    status, reply = server.json("/", {"inputs": rows.tolist()})
    assert status == 200
    _close(reply["outputs"], predictor(rows))
    tensor = {"b64": base64.b64encode(rows.astype("<f4").tobytes()).decode(),
              "dtype": "float32", "shape": [8, 2]}
    status, reply = server.json("/", {"inputs": {"x": tensor}, "encoding": "base64"})
    out = reply["outputs"]
    assert status == 200 and out["dtype"] == "float32" and out["shape"] == [8, 2]
    _close(np.frombuffer(base64.b64decode(out["b64"]), "<f4").reshape(8, 2), predictor(rows))


@pytest.mark.parametrize(("body", "status", "message"), [
    (b'{"inputs": [[0.1, 0.2]', 400, "not valid JSON"),
    (b'{"input": [[0.1, 0.2]]}', 400, '"inputs"'),
    (b'{"inputs": [[0.1], [0.2, 0.3]]}', 400, "rectangular"),
    (b'{"inputs": [["a", "b"]]}', 400, "numbers"),
    (b'{"inputs": [[0.1, 0.2]], "inputs": [[0.1, 0.2]]}', 400, "duplicate JSON key"),
    (b'{"inputs": {"b64": "!!", "dtype": "float32", "shape": [1, 2]}}', 400, "base64"),
    (b'{"inputs": [[0.1, 0.2]], "encoding": "hex"}', 400, "encoding"),
    (b'{"inputs": [[true, false]]}', 422, "float32"),
    (b'{"inputs": [[NaN, 0.2]]}', 422, "input 'x' holds NaN, Infinity"),
    (b'{"inputs": [[0.1, -Infinity]]}', 422, "input 'x' holds NaN, Infinity"),
    (b'{"inputs": [[1e308, 0.2]]}', 422, "beyond the float32 range"),
    (b'{"inputs": [[1e999, 0.2]]}', 422, "beyond the float32 range"),
    (b'{"inputs": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]}', 422, "3x2 is not accepted"),
    (b'{"inputs": {"y": [[0.1, 0.2]]}}', 422, "unknown ['y']"),
])
def test_bad_bodies_get_a_json_reason(server: Server, body: bytes, status: int,
                                      message: str) -> None:
    got, headers, raw = server.request("/", body)
    reply = strict_json(raw)
    assert got == status and headers["content-type"] == "application/json", reply
    assert message in reply["error"]
    if status == 422:
        assert reply["accepted"] == ACCEPTED


def test_limits_and_routes_answer_json(server: Server) -> None:
    status, reply = server.json("/", {"inputs": [[0.5] * (BODY_LIMIT // 4)]})
    assert status == 413 and str(BODY_LIMIT) in reply["error"]
    assert server.json("/nowhere")[0] == 404
    status, reply = server.json("/stats", method="PUT")
    assert status == 405 and "GET" in reply["error"]


def _raw_post(server: Server, header: str, value: str) -> http.client.HTTPConnection:
    """A POST whose headers are sent and whose body the test writes by hand."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader(header, value)
    conn.endheaders()
    return conn


def test_a_chunked_body_over_the_limit_is_cut_off(server: Server) -> None:
    conn = _raw_post(server, "Transfer-Encoding", "chunked")
    chunk = b"[" + b"0.5," * 4096
    try:
        for _ in range(2 * BODY_LIMIT // len(chunk) + 2):
            conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except OSError:
        pass  # the server may close once it has answered
    reply = conn.getresponse()
    assert reply.status == 413 and strict_json(reply.read())["error"]


def test_a_slow_body_times_out(server: Server) -> None:
    conn = _raw_post(server, "Content-Length", "100")
    conn.send(b'{"inputs": ')  # and nothing more
    started = time.monotonic()
    reply = conn.getresponse()
    assert reply.status == 408 and "within 2 s" in strict_json(reply.read())["error"]
    assert time.monotonic() - started < 10


def test_stats_reset_only_by_post(server: Server) -> None:
    server.json("/", {"inputs": [[0.1, 0.2]]})
    assert any(s["requests"]["rows"] for s in _all_stats(server).values())
    assert server.request("/stats?reset=1")[0] == 200  # a GET reads, never resets
    assert any(s["requests"]["rows"] for s in _all_stats(server).values())
    for _ in range(40):  # reset both replicas
        status, _stats = server.json("/stats/reset", method="POST")
        assert status == 200
        if not any(s["requests"]["rows"] for s in _all_stats(server).values()):
            break
    assert not any(s["requests"]["rows"] for s in _all_stats(server).values())


def test_overload_gets_json_503_with_retry_after_at_once(server: Server) -> None:
    """2 replicas x (4 at work + 4 queued): 64 simultaneous rows cannot all be admitted."""
    barrier = threading.Barrier(64)

    def one(_: int) -> tuple[int, dict[str, str], bytes, float]:
        barrier.wait()
        started = time.monotonic()
        status, headers, raw = server.request("/", b'{"inputs": [[0.1, 0.2]]}')
        return status, headers, raw, time.monotonic() - started

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    statuses = [r[0] for r in results]
    assert set(statuses) <= {200, 503} and statuses.count(503) > 0, statuses
    for status, headers, raw, _ in results:
        assert headers["content-type"] == "application/json" and strict_json(raw)
        if status == 503:
            assert headers["retry-after"] == "1" and "overloaded" in strict_json(raw)["error"]


def test_fuzzed_bodies_never_get_a_5xx(server: Server) -> None:
    """Issue 16's serving point: every malformed body is a 4xx with a JSON reason."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    numbers = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(),
                        st.booleans(), st.none(), st.text(max_size=3))
    rows = st.lists(st.lists(numbers, max_size=4), max_size=4)
    value = st.one_of(rows, numbers, st.dictionaries(st.sampled_from(["b64", "dtype", "shape", "x"]),
                                                     st.one_of(numbers, rows), max_size=4))
    body = st.one_of(
        st.binary(max_size=64),
        st.builds(lambda v: json.dumps({"inputs": v}).encode(), value),
        st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
            st.sampled_from(["inputs", "encoding", "other"]), value, max_size=3)),
        st.builds(lambda s: s.encode(), st.text(alphabet='{}[]":,0.1eE-+NaInfity xtrul', max_size=40)))

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body)
    def check(raw_body: bytes) -> None:
        status, headers, raw = server.request("/", raw_body)
        assert status in (200, 400, 413, 422), (raw_body, status, raw)
        assert headers["content-type"] == "application/json"
        reply = strict_json(raw)
        assert ("outputs" in reply) if status == 200 else reply["error"]

    check()


def test_sigkill_of_one_replica_loses_no_request(server: Server, predictor: Any) -> None:
    """Runs last among the shared-server tests: the replacement may still be loading."""
    victims = server.replica_pids()
    assert len(victims) == 2
    row = _rows(1, seed=6)
    want = predictor(row)
    stop_at = time.monotonic() + 6
    results: list[tuple[int, Any]] = []

    def client() -> None:
        while time.monotonic() < stop_at:
            status, reply = server.json("/", {"inputs": row.tolist()})
            results.append((status, reply))

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    os.kill(victims[0], signal.SIGKILL)
    for thread in threads:
        thread.join()
    assert len(results) > 20
    assert [s for s, _ in results if s != 200] == []
    for _, reply in results:
        _close(reply["outputs"], want)
    deadline = time.monotonic() + 120
    while len(server.replica_pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(server.replica_pids()) == 2  # the replacement joined without help
