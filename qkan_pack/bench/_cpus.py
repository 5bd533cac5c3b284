"""Where a load test's processes run (``bench-serve --split-cpus``): the server, and every
process it starts, on one set of CPUs, the client processes on another.

Why: on one host the client processes and the server's (a replica's event loop, HAProxy,
Ray's) compete for the same cores, so a round measures the scheduler as much as the
server; on disjoint sets neither takes the other's time, as when the clients are other
machines. Affinity is inherited: a process pinned before it starts others pins them too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import BenchError

#: Internal to ``qkan_pack.bench``: the package exports nothing from this module.
__all__: list[str] = []


def pin_cpus(cpus: frozenset[int], pid: int = 0) -> None:
    """Run process ``pid`` (0: this one), and what it starts afterwards, on ``cpus`` only
    (nothing changes when empty)."""
    if cpus:
        os.sched_setaffinity(pid, cpus)


def check_split(server: frozenset[int], clients: frozenset[int]) -> None:
    """Both sets non-empty, disjoint, and CPUs this process may run on (``BenchError``)."""
    if not hasattr(os, "sched_setaffinity"):
        raise BenchError("--split-cpus needs a platform with CPU affinity (Linux)")
    if not server or not clients or server & clients:
        raise BenchError(f"--split-cpus: give the server and the clients disjoint, non-empty CPU "
                         f"sets, got {cpu_text(server) or 'none'} and {cpu_text(clients) or 'none'}")
    allowed = os.sched_getaffinity(0)
    if not (server | clients) <= allowed:
        raise BenchError(f"--split-cpus: CPUs {cpu_text((server | clients) - allowed)} are not "
                         f"among this process's ({cpu_text(allowed)})")


def cpu_text(cpus: set[int] | frozenset[int]) -> str:
    """``0-7,12``: CPU numbers as ``taskset -c`` writes them."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def split_text(settings: Mapping[str, Any]) -> str:
    """``, server on CPUs 0-7, clients on 8-15`` for a report's settings, or nothing."""
    split = settings.get("split_cpus")
    if not split:
        return ""
    server, clients = split
    return f", server on CPUs {cpu_text(set(server))}, clients on {cpu_text(set(clients))}"
