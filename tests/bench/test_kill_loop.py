"""bench-serve's kill loop: a replica serves once it listens on an ingress port (read from
/proc, as the loop reads it), and no kill comes before every replica serves again, so that
the loop measures replicas dying in a healthy set, never a set left without one."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from qkan_pack.bench import _serve_load
from qkan_pack.bench._serve_load import KillLoop
from qkan_pack.bench._server_process import listening_ports

#: A stand-in replica: a process that listens on a port after a delay.
_LISTENS = ("import socket, sys, time; time.sleep(float(sys.argv[2])); "
            "s = socket.create_server(('127.0.0.1', int(sys.argv[1]))); time.sleep(120)")


class _Server:
    """What the kill loop uses of ``ServerProcess``: the replicas' process ids."""

    def __init__(self) -> None:
        self.replicas: list[subprocess.Popen] = []

    def start_replica(self, port: int, listens_after_s: float = 0.0) -> subprocess.Popen:
        self.replicas.append(subprocess.Popen(
            [sys.executable, "-c", _LISTENS, str(port), str(listens_after_s)]))
        return self.replicas[-1]

    def replica_pids(self) -> list[int]:
        return [p.pid for p in self.replicas if p.poll() is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _until(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_kill_waits_until_every_replica_serves_again(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = [_free_port() for _ in range(3)]
    monkeypatch.setattr(_serve_load, "INGRESS_PORTS", ports)
    monkeypatch.setattr(_serve_load, "KILL_SETTLE_S", 0.3)
    server = _Server()
    try:
        first, second = server.start_replica(ports[0]), server.start_replica(ports[1])
        _until(lambda: listening_ports(first.pid) == {ports[0]} and listening_ports(second.pid))
        start = time.monotonic()
        loop = KillLoop(server, 2, 2, first_at=start, every_s=0.2, until=start + 30)
        loop.start()
        _until(lambda: loop.kills)
        killed = loop.kills[0][1]
        assert killed in (first.pid, second.pid)
        replacement = server.start_replica(ports[2], listens_after_s=1.5)  # Ray's: starting
        started = time.monotonic()
        _until(lambda: len(loop.kills) == 2)
        loop.stop()
        at, pid, late = loop.kills[1]
        assert at - started >= 1.5 + 0.3  # once the replacement has listened for the settle time
        assert pid != killed and late > 1.0
        assert listening_ports(replacement.pid) == {ports[2]}
        assert listening_ports(killed) == set()  # gone
    finally:
        for process in server.replicas:
            process.kill()
            process.wait()
