"""``qkan-pack bench-serve`` stopped from outside leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ._server import TAG_ENV, free_port, tagged_pids

pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'qkan-pack[serve]')")
pytestmark = [pytest.mark.serve, pytest.mark.slow]


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_to_bench_serve_stops_the_server_it_started(artifact: Path) -> None:
    """Before the fix, SIGTERM (as ``timeout`` sends) ended bench-serve at once; the server,
    in its own session, kept the port and its Ray, and the next run failed 'port in use'."""
    port, tag = free_port(), uuid.uuid4().hex
    bench = subprocess.Popen(
        [sys.executable, "-m", "qkan_pack", "bench-serve", str(artifact), "--clients", "1",
         "--seconds", "60", "--warmup", "0", "--no-noop", "--processes", "1", "--port", str(port)],
        env={**os.environ, TAG_ENV: tag}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _listening(port):
            assert bench.poll() is None, bench.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the server never listened"
            time.sleep(0.5)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(180) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while (tagged_pids(tag) or _listening(port)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _listening(port), f"port {port} still served after bench-serve stopped"
        assert tagged_pids(tag) == [], "processes left behind"
    finally:
        for pid in tagged_pids(tag):
            os.kill(pid, signal.SIGKILL)


def test_bench_serve_drives_named_integer_inputs_behind_a_token(tmp_path: Path) -> None:
    """Before, bench-serve refused any artifact with more than one input ("one-input
    artifacts only") and sent float rows whatever the dtype; now every request is a row of
    each input, by name, with token ids inside the embedding. Its clients (and its /stats
    reads) also send the token of a server started with ``--auth-token-file``, which they
    did not (every request a 401); the token stays out of the report."""
    import json

    from qkan_pack import build

    from ..conftest import MODELS

    path = build(MODELS / "multi_io.py", [{"a": (1, 3), "b": (1, 4)}, {"a": (8, 3), "b": (8, 4)}],
                 output=tmp_path / "multi", dtype={"b": "int64"}).path
    out, token = tmp_path / "load.json", tmp_path / "token"
    token.write_text("bench-serve-token-0123456789\n")
    token.chmod(0o600)  # a token file others may write is refused
    done = subprocess.run(
        [sys.executable, "-m", "qkan_pack", "bench-serve", str(path), "--clients", "2",
         "--seconds", "1", "--warmup", "0.5", "--no-noop", "--processes", "1", "--port",
         str(free_port()), "--json", str(out), "--serve-args", f"--auth-token-file {token}"],
        capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    report = out.read_text()
    (point,) = json.loads(report)["curves"]["model"]
    assert point["ok"] > 0 and set(point["statuses"]) == {"200"}, point
    assert point["rows_per_replay"]  # /stats answered with the token
    assert "bench-serve-token" not in report


def test_bench_serve_measures_every_protocol_against_one_server(artifact: Path,
                                                                tmp_path: Path) -> None:
    """``--protocol json,oip-json,oip-binary,oip-grpc --rows-per-request 8`` behind a token:
    every protocol's clients (the JSON route, the Open Inference Protocol's HTTP infer with
    JSON and binary tensors, its gRPC ModelInfer, messages from tritonclient's stubs) get only
    200s/OK from one server started with a gRPC port, each request an intact 8-row batch
    (8 rows per replay), reported per protocol with rows/s and ratios to the JSON route."""
    import json

    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
    out, token = tmp_path / "load.json", tmp_path / "token"
    token.write_text("bench-serve-token-0123456789\n")
    token.chmod(0o600)
    protocols = ["json", "oip-json", "oip-binary", "oip-grpc"]
    done = subprocess.run(
        [sys.executable, "-m", "qkan_pack", "bench-serve", str(artifact), "--clients", "2",
         "--seconds", "1", "--warmup", "0.5", "--no-noop", "--processes", "1", "--port",
         str(free_port()), "--json", str(out), "--protocol", ",".join(protocols),
         "--rows-per-request", "8", "--serve-args", f"--auth-token-file {token}"],
        capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    print(done.stdout)  # the CPU figures, for the record of a run (-s)
    report = json.loads(out.read_text())
    assert report["schema"] == "qkan-pack/bench-serve/2"
    assert "--grpc-port" in report["server"]["model"]["command"]
    points = report["curves"]["model"]
    assert [p["protocol"] for p in points] == protocols
    for point in points:
        assert point["ok"] > 0 and set(point["statuses"]) == {"200"}, point
        assert point["rows_per_request"] == 8, point
        assert point["rows_per_s"] == pytest.approx(8 * point["requests_per_s"], abs=1)
        _assert_cpu_per_request(point)
    assert set(report["ratios"]) == set(protocols[1:])
    assert all(set(by_clients) == {"2"} for by_clients in report["ratios"].values())
    assert "against the JSON route" in done.stdout


def test_bench_serve_measures_a_repository_against_one_model_alone(tmp_path: Path) -> None:
    """``bench-serve REPO``: two servers side by side (the repository, and its first model
    alone), every client count measured alone, all models at once and one model through
    the repository, only 200s, the ratios to the model alone, a plot; both servers stopped."""
    import json

    from qkan_pack import build

    from ..conftest import MODELS

    for name in ("m1", "m2"):
        build(MODELS / "plain_mlp.py", "1x2,8x2", output=tmp_path / "repo" / name / "1",
              name=name, progress=False)
    out, plot = tmp_path / "load.json", tmp_path / "load.png"
    done = subprocess.run(
        [sys.executable, "-m", "qkan_pack", "bench-serve", str(tmp_path / "repo"), "--clients",
         "2", "--seconds", "1", "--warmup", "0.3", "--processes", "1", "--port",
         str(free_port()), "--json", str(out), "--plot", str(plot)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)  # the CPU figures, for the record of a run (-s)
    report = json.loads(out.read_text())
    assert report["repository"] == {"models": ["m1", "m2"], "alone": "m1/1"}
    assert list(report["curves"]) == ["alone", "all", "one"]
    for points in report["curves"].values():
        (point,) = points
        assert point["ok"] > 0 and set(point["statuses"]) == {"200"}, point
        assert point["rows_per_replay"], point
        _assert_cpu_per_request(point)
    assert set(report["ratios"]) == {"all", "one"}
    assert {name: server["exit_code"] for name, server in report["server"].items()} == {
        "repository": 0, "alone": 0}
    assert "req/s against m1/1 alone at the same clients" in done.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _assert_cpu_per_request(point: dict) -> None:
    """Every part's CPU per request is measured: the replicas, HAProxy (found among the
    server's processes: about a hundred microseconds per request) and the clients certainly
    spent some (Ray's other processes may stay under the kernel's 10-ms tick)."""
    cpu = point["cpu_us_per_request"]
    assert set(cpu) == {"replicas", "haproxy", "ray", "clients"}, point
    assert min(cpu["replicas"], cpu["haproxy"], cpu["clients"]) > 0, point
    assert cpu["ray"] >= 0, point
