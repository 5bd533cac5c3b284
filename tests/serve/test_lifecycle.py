"""``qkan-pack serve`` lifecycle, each test with a server of its own: one server per port,
exposure warning, placement shortfall, a replica that cannot load, the one-replica gap,
Ctrl-C (SIGINT to the process group) draining and stopping everything, SIGTERM to the
whole process group doing the same, and the Python ingress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ..conftest import MODELS
from ._server import Server, free_port, strict_json, tagged_pids

ENV_TOKEN = "env-token-0123456789"

pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
pytestmark = [pytest.mark.serve, pytest.mark.slow]


def _serve(*args: str, env: dict[str, str] | None = None, timeout: float = 60
           ) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "qkan_pack", "serve", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return done, time.monotonic() - started


def _wait_gone(tag: str, timeout_s: float = 15) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return tagged_pids(tag)


def test_beyond_loopback_without_a_token_warns_and_a_shortfall_fails_fast(artifact: Path) -> None:
    done, took = _serve(str(artifact), "--host", "0.0.0.0", "--port", str(free_port()),
                        "--replicas", "64", "--cpus-per-replica", "1")
    assert done.returncode == 1 and took < 30, done.stderr
    assert "WARNING: serving on 0.0.0.0 without a token" in done.stderr
    assert f"cannot place 64 replicas x 1 CPU; this cluster has {os.cpu_count()}" in done.stderr


def test_a_replica_that_cannot_load_never_serves(tmp_path: Path) -> None:
    from qkan_pack import build

    build(MODELS / "fails_in_serve.py", "1x2", output=tmp_path / "a")
    port = free_port()
    done, _ = _serve(str(tmp_path / "a"), "--port", str(port), timeout=240,
                        env={"QKAN_PACK_TEST_FAIL_LOAD": "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("a replica failed to start: qkan_pack.errors.ReplicaLoadError: the replica on node "
            "127.0.0.1 (id " in done.stderr), done.stderr  # its loopback node
    assert "this replica was told to fail its load" in done.stderr
    assert "serving" not in done.stdout


def test_one_server_per_port_and_the_one_replica_gap(artifact: Path) -> None:
    server = Server(artifact, ["--grace-s", "3"], env={"QKAN_PACK_SERVE_TOKEN": ENV_TOKEN},
                    token=ENV_TOKEN).start()
    try:
        done, took = _serve(str(artifact), "--port", str(server.port))
        assert done.returncode == 1 and took < 10
        assert f"port {server.port} on 127.0.0.1 is already in use" in done.stderr
        assert server.json("/", token=None)[0] == 401  # the token came from the environment
        assert server.json("/", {"inputs": [[0.1, 0.2]]})[0] == 200
        _the_token_is_in_no_environment_but_the_commands(server)
        _one_replica_gap(server)
        _ctrl_c_drains_and_stops_everything(server)
    finally:
        server.kill()


def _the_token_is_in_no_environment_but_the_commands(server: Server) -> None:
    """Audit (issue 32, item 9): a token given in QKAN_PACK_SERVE_TOKEN stayed in the
    environment of 12 of the serve's 14 processes, the replicas (which run model code)
    included. Only the command the user started holds it now; the replicas hold its sha256."""
    import hashlib

    environments = {}
    for pid in tagged_pids(server.tag):
        try:
            environments[pid] = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
    holders = [pid for pid, env in environments.items() if ENV_TOKEN.encode() in env]
    assert holders == [server.process.pid] and len(environments) >= 8, (holders, environments.keys())
    digest = hashlib.sha256(ENV_TOKEN.encode()).hexdigest().encode()
    assert all(digest in environments[pid] for pid in server.replica_pids())


def _one_replica_gap(server: Server) -> None:
    """SIGKILL of the only replica: requests meanwhile get a JSON 503 with Retry-After until
    the replacement serves, and none is closed without a reply (with Ray's ``http-reuse
    always`` the requests in flight at the kill were)."""
    victim = server.replica_pids()[0]
    os.kill(victim, signal.SIGKILL)
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            status, headers, raw = server.request("/", b'{"inputs": [[0.1, 0.2]]}')
        except OSError:  # closed without a reply
            seen[0] = seen.get(0, 0) + 1
            continue
        assert headers.get("content-type", "").startswith("application/json"), raw
        seen[status] = seen.get(status, 0) + 1
        if status == 503:
            assert headers["retry-after"] == "1" and strict_json(raw)["error"]
        replicas = server.replica_pids()
        if status == 200 and replicas and victim not in replicas:
            break
        time.sleep(0.05)
    assert set(seen) <= {200, 503}, seen
    assert victim not in server.replica_pids() and seen.get(200) and seen.get(503), seen


def _ctrl_c_drains_and_stops_everything(server: Server) -> None:
    statuses: list[int] = []
    bodies: list[bytes] = []

    def client() -> None:
        for _ in range(40):
            try:
                status, _, raw = server.request("/", b'{"inputs": [[0.1, 0.2]]}')
                statuses.append(status)
                bodies.append(raw)
            except OSError:
                return  # the server is gone: a refused connection, not a failed request

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    time.sleep(0.3)
    os.killpg(server.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    _, stderr = server.process.communicate(timeout=90)
    for thread in clients:
        thread.join()
    assert server.process.returncode == 0, stderr
    assert set(statuses) <= {200, 503}, set(bodies)  # answered, or told to retry: never cut
    assert _wait_gone(server.tag) == []


@pytest.mark.parametrize("host", ["::1", "127.0.0.2"])
def test_a_specific_host_serves_through_haproxy(artifact: Path, host: str) -> None:
    """Regression: with ``--host ::1`` or ``127.0.0.2`` the replicas bound that address while
    HAProxy addressed them as ``127.0.0.1`` (Ray's choice): every replica was down and the
    start failed after 60 s ("Proxies not available"). The wrapper addresses local replicas
    where they bind now."""
    import socket
    import urllib.request

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
    except OSError:
        pytest.skip(f"this host cannot bind {host}")
    server = Server(artifact, ["--host", host, "--grace-s", "1"]).start(timeout_s=120)
    url = f"http://[{host}]:{server.port}/" if ":" in host else f"http://{host}:{server.port}/"
    try:
        assert f"at {url} " in server.stdout[-1]
        request = urllib.request.Request(url, data=b'{"inputs": [[0.1, 0.2]]}')
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200 and len(strict_json(reply.read())["outputs"][0]) == 2
        _group_sigterm_stops_in_order(server)
    finally:
        server.kill()


def test_the_python_ingress_serves_json_replies_and_stops(artifact: Path) -> None:
    """``--ingress python`` (Ray's proxy actor in front, no HAProxy): replies travel from the
    replica to the proxy as ASGI messages, so the replica's own reply type and its one-write
    replies (``serve/_uvicorn_compat``) must not change what a client gets."""
    server = Server(artifact, ["--ingress", "python", "--grace-s", "1"], token=ENV_TOKEN,
                    env={"QKAN_PACK_SERVE_TOKEN": ENV_TOKEN}).start(timeout_s=120)
    try:
        status, reply = server.json("/", {"inputs": [[0.1, 0.2]]})
        assert status == 200 and len(reply["outputs"][0]) == 2
        status, reply = server.json("/", {"inputs": [[0.1, 0.2, 0.3]]})
        assert status == 422 and "not accepted" in reply["error"]
        # Ray's proxy answers its own routes before the app: the gate is in front of them
        assert server.request("/-/routes", token=None)[0] == 401
        assert server.request("/-/routes")[0] == 200
        status, _, body = server.request("/-/healthz", token=None)
        assert status == 200 and body == b""
        _group_sigterm_stops_in_order(server)
    finally:
        server.kill()


def _group_sigterm_stops_in_order(server: Server) -> None:
    """SIGTERM to the serve's whole process group (``kill -TERM -PGID``, GNU ``timeout``)
    killed the local Ray's control store and raylet with it: the serve waited ~60 s for the
    control store, exited 1 without cleaning up and left HAProxy on the port. The server now
    runs in a session of its own (``qkan_pack/_session.py``): the group is the supervisor alone."""
    started = time.monotonic()
    os.killpg(server.process.pid, signal.SIGTERM)
    _, stderr = server.process.communicate(timeout=45)
    assert server.process.returncode == 0 and time.monotonic() - started < 30, stderr
    assert stderr.rstrip().endswith("stopped"), stderr
    assert _wait_gone(server.tag) == []


def test_serve_forever_works_after_the_caller_imported_ray(artifact: Path) -> None:
    """Audit: Ray caches RAY_AUTH_MODE when first imported, so with ``import ray`` before
    ``serve_forever`` the driver stayed 'disabled' against the control store it started
    with tokens: AuthenticationError after a minute of retries, exit 1. The session now has
    Ray read its environment again before ``ray.init``."""
    script = (
        "import sys, threading, ray\n"
        "from qkan_pack.serve import Listen, ServeOptions, serve_forever\n"
        "stop = threading.Event()\n"
        "def ready(url, description):\n"
        "    print('READY', description['digest'], flush=True)\n"
        "    stop.set()\n"
        "serve_forever(sys.argv[1], ServeOptions(device='cpu', grace_s=1),\n"
        "              Listen(port=int(sys.argv[2])), on_ready=ready, stop=stop)\n")
    done = subprocess.run([sys.executable, "-c", script, str(artifact), str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("READY sha256:"), done.stderr[-2000:]
