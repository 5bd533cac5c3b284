"""HAProxy's log while a serving benchmark runs: every request line counted by method, status,
termination state and retries, and every line kept that is not a request answered at the
first try (retried or failed requests, health checks, servers going down or up, reloads).
A kill loop's evidence: which requests HAProxy retried, how many retries they took, and how
each lost one ended. Lines can be missing (UDP drops them when the listener falls behind,
and HAProxy logs nothing when it closes a kept-alive client's connection without a reply
from its request analysis): compare the total with the clients' count.

Start it, then the server with ``RAY_SERVE_HAPROXY_LOG_TARGET=127.0.0.1:PORT`` in its
environment (``qkan-pack bench-serve`` passes its own on); SIGTERM or SIGINT stops it and
writes PREFIX.summary.json (PREFIX.log holds the kept lines):

    python benchmarks/haproxy_log.py PORT PREFIX
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
from collections import Counter
from pathlib import Path

#: An ``option httplog`` request line: status, bytes, termination state, the connection
#: counts ending in retries (``+N`` when redispatched), the queues, the method.
REQUEST = re.compile(r' (\d{3}) (\d+) \S+ \S+ (\S{4}) \d+/\d+/\d+/\d+/(\+?\d+) \d+/\d+ "(\S+) ')


def main(port: int, prefix: str) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:  # past net.core.rmem_max where allowed (root): lines come in bursts at each kill
        listener.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), 16 << 20)
    except OSError:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    listener.bind(("127.0.0.1", port))
    requests: Counter[str] = Counter()
    retries: Counter[str] = Counter()
    other = 0
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    listener.settimeout(0.5)
    with Path(f"{prefix}.log").open("w") as kept:
        while not stopping:
            try:
                line = listener.recv(65535).decode(errors="replace").rstrip()
            except (TimeoutError, InterruptedError):
                continue
            match = REQUEST.search(line)
            if match is None:
                other += 1
                kept.write(line + "\n")
                continue
            status, _, state, tries, method = match.groups()
            requests[f"{method} {status} {state}"] += 1
            retries[tries] += 1
            if status != "200" or state != "----" or tries != "0":
                kept.write(line + "\n")
    summary = {"requests": dict(requests.most_common()), "total": sum(requests.values()),
               "retries": dict(sorted(retries.items(), key=lambda kv: int(kv[0].lstrip("+")))),
               "other_lines": other}
    Path(f"{prefix}.summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
