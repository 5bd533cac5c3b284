"""``qkan-pack serve`` as the load tests run it: its own process (and session), started as a
user starts it, ready when it prints its ready line, stopped with SIGTERM (and everything it
started killed when it does not stop); its replicas found among its descendants, and the
ports a process listens on read from the kernel's tables.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import BenchError
from ._cpus import pin_cpus


class ServerProcess:
    """``python -m qkan_pack serve`` in its own process group; stopped with SIGTERM."""

    def __init__(self, artifact: str, args: Sequence[str], port: int, timeout_s: float,
                 token: str | None = None, grpc_port: int = 0,
                 cpus: frozenset[int] = frozenset()) -> None:
        self.port = port
        self.token = token
        self.grpc_port = grpc_port
        self.oip_model = ""  # the Open Inference Protocol's name of the model, once read
        self.command = [sys.executable, "-m", "qkan_pack", "serve", artifact, "--port", str(port),
                        *args, *(("--grpc-port", str(grpc_port)) if grpc_port else ())]
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)
        try:
            # before it imports Ray (seconds): Ray's processes, HAProxy and the replicas it
            # starts inherit the set
            pin_cpus(cpus, self.process.pid)
            self.ready_line = self._wait_ready(timeout_s)
        except BaseException:  # SIGTERM (SystemExit) or Ctrl-C while it starts: stop it too
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if line.startswith("serving "):
                return line.strip()
            if not line and self.process.poll() is not None:
                break
        self.stop()
        stderr = self.process.stderr.read() if self.process.stderr else ""
        raise BenchError(f"qkan-pack serve did not start: {stderr.strip()[-800:]}")

    def get(self, path: str, method: str = "GET") -> dict[str, Any]:
        return json.loads(self.read(path, method))

    def read(self, path: str, method: str = "GET") -> bytes:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                         data=b"" if method == "POST" else None, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.read()

    def replay_totals(self) -> tuple[float, float]:
        """(rows replayed, replays) since the server started, over every replica (``GET
        /metrics``: ``qkan_pack_rows_per_replay``'s sum and count)."""
        from prometheus_client.parser import text_string_to_metric_families

        totals = {"qkan_pack_rows_per_replay_sum": 0.0, "qkan_pack_rows_per_replay_count": 0.0}
        for family in text_string_to_metric_families(self.read("/metrics").decode()):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
        return totals["qkan_pack_rows_per_replay_sum"], totals["qkan_pack_rows_per_replay_count"]

    def replica_pids(self) -> list[int]:
        """The server's replica processes (Ray names them ``ray::ServeReplica:...``)."""
        return [pid for pid in descendants(self.process.pid) if process_role(pid) == "replicas"]

    def cpu_by_process(self) -> dict[int, ProcessCpu]:
        """Every process of the server (the command, Ray's, HAProxy) that is still there:
        its role (``process_role``), start time and the CPU seconds it has used, by pid."""
        readings = {}
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            usage = cpu_usage(pid)
            if usage is not None:
                readings[pid] = ProcessCpu(process_role(pid), *usage)
        return readings

    def stop(self, timeout_s: float = 120.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                # the command, and the server it runs in a session of its own (its group
                # holds neither the server nor Ray's processes), and all they started
                for pid in [*descendants(self.process.pid), self.process.pid]:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat_fields(entry.name)
            if len(stat) > 1:
                children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


#: What a server process does, for its CPU time per request: a replica (Ray names them
#: ``ray::ServeReplica:...``), the HAProxy ingress, or the rest (the serve command, Ray's
#: controller, proxy, raylet and GCS).
ROLES = ("replicas", "haproxy", "ray")


def process_role(pid: int) -> str:
    if b"ServeReplica" in _read(f"/proc/{pid}/cmdline"):
        return "replicas"
    if _read(f"/proc/{pid}/comm").strip() == b"haproxy":
        return "haproxy"
    return "ray"


class ProcessCpu(NamedTuple):
    """One process's reading: its role, when it started (clock ticks after boot, so that a
    pid the kernel gave to a new process is not taken for the old one) and its CPU seconds."""

    role: str
    started: int
    seconds: float


def cpu_usage(pid: int) -> tuple[int, float] | None:
    """(start time in clock ticks, user and system CPU seconds of every thread) of process
    ``pid`` (``/proc/PID/stat``); None if it is gone."""
    fields = _stat_fields(pid)
    if len(fields) < 20:
        return None
    return int(fields[19]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_request(before: Mapping[int, ProcessCpu], after: Mapping[int, ProcessCpu],
                    requests: int) -> dict[str, float]:
    """Microseconds of CPU per request of each role (``ROLES``) between two
    ``ServerProcess.cpu_by_process`` readings; a process that started between them counts
    whole, one that ended counts nothing."""
    used = dict.fromkeys(ROLES, 0.0)
    for pid, now in after.items():
        then = before.get(pid)
        used[now.role] += now.seconds - (then.seconds if then and then.started == now.started
                                         else 0.0)
    return {role: round(1e6 * seconds / requests, 1) for role, seconds in used.items()} \
        if requests else {}


def _stat_fields(pid: int | str) -> list[bytes]:
    """``/proc/PID/stat`` after the command name (its third field first); empty if gone."""
    return _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on: its sockets' inodes looked up in the
    kernel's tables (empty if it is gone)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(fd.path)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in _read(table).decode().splitlines()[1:]:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
