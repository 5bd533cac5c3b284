"""Free loopback ports for listeners that a process about to start will open (the server's
side listeners; the port a load test asks ``serve --grpc-port`` to take). A leaf, so that the
server and the tools that start it draw ports by one rule."""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Ray's default worker ports end here; side ports are drawn above it.
RAY_WORKER_PORTS_END = 19999
_FALLBACK_EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range


def side_ports(count: int, exclude: set[int], host: str = "127.0.0.1",
               rng: random.Random | None = None,
               ephemeral: tuple[int, int] | None = None) -> list[int]:
    """``count`` distinct free ports, none in ``exclude``, for side listeners (HAProxy's
    stats and metrics, Ray's fallback proxy) that nothing started later takes first: above
    Ray's worker ports and below the kernel's ephemeral range. A port the kernel hands out
    for ``bind(0)`` is ephemeral, and Ray's own processes bind ephemeral ports while the app
    deploys; one of them can take such a port before HAProxy listens on it, and HAProxy then
    fails ("Some protocols failed to start their listeners", reported as if ``--port`` were
    taken)."""
    low, _ = ephemeral or ephemeral_port_range()
    candidates = range(RAY_WORKER_PORTS_END + 1, low)
    rng = rng or random.Random()
    chosen: list[int] = []
    for _ in range(min(400, len(candidates))):
        if len(chosen) == count:
            break
        port = rng.choice(candidates)
        if port not in exclude and port not in chosen and _bindable(host, port):
            chosen.append(port)
    while len(chosen) < count:  # a host whose ephemeral range starts low: the kernel picks
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in exclude and port not in chosen:
            chosen.append(port)
    return chosen


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for ``bind(0)`` and outgoing connections (Linux; the default
    elsewhere or when unreadable)."""
    try:
        low, high = (int(v) for v in Path(path).read_text().split())
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL
    return low, high
