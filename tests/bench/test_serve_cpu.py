"""bench-serve's CPU per request: each server process's role and CPU time read from the
kernel, and the microseconds per request each role spent between two readings."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

from qkan_pack.bench._load import LoadResult
from qkan_pack.bench._serve_render import render_point
from qkan_pack.bench._serve_results import summarise
from qkan_pack.bench._server_process import (
    ROLES,
    ProcessCpu,
    cpu_per_request,
    cpu_usage,
    process_role,
)


def test_a_process_cpu_time_is_read_from_the_kernel() -> None:
    """This process's CPU seconds grow by what it spends, its start time stays; a process
    that is gone has no reading."""
    started, before = cpu_usage(os.getpid()) or (0, 0.0)
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    now = cpu_usage(os.getpid())
    assert now is not None and now[0] == started and now[1] - before >= 0.1
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert cpu_usage(gone.pid) is None
    assert process_role(os.getpid()) == "ray"  # neither a replica nor HAProxy


def test_cpu_per_request_splits_the_servers_time_by_role() -> None:
    """Per role, the CPU spent between two readings over the requests sent: a process that
    started in between counts whole, one that ended counts nothing, a pid the kernel gave
    to a new process counts the new one whole (never a negative figure); no requests, no
    figures."""
    before = {1: ProcessCpu("replicas", 5, 10.0), 2: ProcessCpu("haproxy", 5, 1.0),
              3: ProcessCpu("ray", 5, 5.0), 4: ProcessCpu("replicas", 5, 2.0),
              6: ProcessCpu("ray", 5, 3.0)}
    after = {1: ProcessCpu("replicas", 5, 10.4), 2: ProcessCpu("haproxy", 5, 1.1),
             3: ProcessCpu("ray", 5, 5.05), 5: ProcessCpu("replicas", 9, 0.2),
             6: ProcessCpu("ray", 9, 0.01)}  # 4 ended, 5 started, 6 is another process now
    assert cpu_per_request(before, after, 1000) == {"replicas": 600.0, "haproxy": 100.0,
                                                     "ray": 60.0}
    assert set(ROLES) == {"replicas", "haproxy", "ray"}
    assert cpu_per_request(before, after, 0) == {}


def test_a_point_shows_the_clients_cpu_per_request_sent() -> None:
    """The clients' CPU counts every request sent (warm-up and refusals too), and the point's
    line shows each role's microseconds, or '-' for one not measured."""
    result = LoadResult([1.0] * 90, Counter({200: 90, "503": 10}), sent=200, cpu_s=0.03)
    point = summarise(8, result, 1.0)
    assert point.cpu_us_per_request == {"clients": 150.0}
    point.cpu_us_per_request.update({"replicas": 512.0, "haproxy": 20.0, "ray": 3.0})
    assert render_point(point).split()[7:11] == ["512", "20", "3", "150"]
    assert render_point(summarise(8, LoadResult([1.0], Counter({200: 1})), 1.0)).split()[7:11] \
        == ["-"] * 4
