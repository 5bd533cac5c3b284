"""A serving replica's CPU time per request, model against no-op, under real load.

Starts ``qkan-pack serve ARTIFACT`` (1 replica, HAProxy ingress, the defaults) and then the
same with ``--noop``, alternately ``--pairs`` times; each time drives it with ``--clients``
keep-alive clients (threads in one separate process) sending one row, and reads the replica
process's ``utime + stime`` (``/proc/PID/stat``, all its threads) before and after each of 3
windows of ``--seconds``; a run's figure is the median window's CPU seconds / requests
answered. Unlike req/s on a small machine, where clients, HAProxy and Ray share the cores,
this is what one request costs the replica; at saturation a replica's req/s is about its
inverse, so no-op / model is the ratio issue 19's 0.9x target is about.

    python benchmarks/serve_replica_cpu.py ARTIFACT --pairs 3 --json out.json \\
        [--serve-args '--device cuda']

Record and findings: ``benchmarks/results/2026-12-04_cpu_replica-cpu-per-request.md``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BODY = b'{"inputs": [[0.1, 0.2]]}'


def _load(port: int, body: bytes, clients: int, stop_at: float, out: Any) -> None:
    """Keep-alive clients until ``stop_at``: (200s, others) into ``out``."""
    counts = [0, 0]
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while time.time() < stop_at:
            try:
                conn.request("POST", "/", body, {"Content-Type": "application/json"})
                reply = conn.getresponse()
                reply.read()
                ok = reply.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            with lock:
                counts[0 if ok else 1] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(tuple(counts))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _replica_pids() -> list[int]:
    """This machine's Ray Serve replica processes (one serve at a time is measured)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"ServeReplica" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False


def _windows(port: int, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up then 3 measured windows; the median window's µs of replica CPU per request."""
    windows = []
    for _ in range(3):
        for seconds, measured in ((args.warmup, False), (args.seconds, True)):
            queue: Any = multiprocessing.Queue()
            before, started = _cpu_seconds(pid), time.time()
            worker = multiprocessing.Process(target=_load, args=(
                port, args.body, args.clients, time.time() + seconds, queue))
            worker.start()
            ok, failed = queue.get()
            worker.join()
            if measured:
                cpu, wall = _cpu_seconds(pid) - before, time.time() - started
                windows.append({"us_per_request": cpu / max(ok, 1) * 1e6,
                                "requests_per_s": ok / wall, "busy_cores": cpu / wall,
                                "failed": failed})
    middle = sorted(windows, key=lambda w: w["us_per_request"])[1]
    return {**middle, "windows": windows}


def run_once(artifact: Path, noop: bool, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, "-m", "qkan_pack", "serve", str(artifact), "--port", str(args.port),
               *shlex.split(args.serve_args), *(["--noop"] if noop else [])]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        deadline = time.time() + args.start_timeout
        while not _ready(args.port):
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"serve did not start: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
        replicas = _replica_pids()
        if len(replicas) != 1:
            raise SystemExit(f"expected one replica process, found {replicas} (another serve "
                             "running?)")
        return {"mode": "noop" if noop else "model", **_windows(args.port, replicas[0], args)}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--start-timeout", type=float, default=240.0)
    parser.add_argument("--serve-args", default="", help="more qkan-pack serve options")
    parser.add_argument("--body", type=str.encode, default=BODY,
                        help="the request body (one row of the artifact's input)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = []
    for pair in range(args.pairs):
        for noop in (False, True):
            run = run_once(args.artifact, noop, args)
            runs.append(run)
            print(f"pair {pair + 1}/{args.pairs} {run['mode']:5s}: {run['us_per_request']:6.1f} µs "
                  f"replica CPU/request, {run['requests_per_s']:7.0f} req/s, replica busy "
                  f"{run['busy_cores']:.2f} cores, failed {run['failed']}", flush=True)
    medians = {mode: statistics.median(r["us_per_request"] for r in runs if r["mode"] == mode)
               for mode in ("model", "noop")}
    print(f"median: model {medians['model']:.1f} µs, no-op {medians['noop']:.1f} µs, "
          f"no-op / model {medians['noop'] / medians['model']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"artifact": str(args.artifact), "clients": args.clients,
                                         "serve_args": args.serve_args, "runs": runs,
                                         "median_us": medians}, indent=2))


if __name__ == "__main__":
    main()
