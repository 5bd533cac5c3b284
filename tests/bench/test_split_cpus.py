"""``bench-serve --split-cpus``: the server (and what it starts) and the client processes on
disjoint CPUs; the sets checked before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qkan_pack.bench import ServeLoadSettings
from qkan_pack.bench._cpus import cpu_text, pin_cpus, split_text
from qkan_pack.bench._load import LoadSpec, RowInput, run_load
from qkan_pack.errors import BenchError

from ._stub import stub_server

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs this process may use")


@needs_two
def test_the_sets_are_checked_before_anything_starts() -> None:
    first, last = ALLOWED[0], ALLOWED[-1]
    settings = ServeLoadSettings(split_cpus=((first,), (last,)))
    assert (settings.server_cpus, settings.client_cpus) == ({first}, {last})
    with pytest.raises(BenchError, match="disjoint, non-empty CPU sets"):
        ServeLoadSettings(split_cpus=((first,), (first, last)))
    with pytest.raises(BenchError, match="disjoint, non-empty CPU sets, got none and"):
        ServeLoadSettings(split_cpus=((), (last,)))
    outside = max(ALLOWED) + 1000
    with pytest.raises(BenchError, match=f"CPUs {outside} are not among this process's"):
        ServeLoadSettings(split_cpus=((first,), (outside,)))
    assert ServeLoadSettings().client_cpus == frozenset()  # anywhere, as before


def test_cpu_lists_are_written_as_taskset_writes_them() -> None:
    assert cpu_text({0, 1, 2, 3, 5, 7, 8}) == "0-3,5,7-8"
    assert split_text({"split_cpus": [[0, 1], [2]]}) == ", server on CPUs 0-1, clients on 2"
    assert split_text({"split_cpus": None}) == ""


@needs_two
def test_a_process_pinned_as_it_starts_pins_what_it_starts() -> None:
    """The server is pinned right after it starts, before it imports Ray: the processes it
    starts later (Ray's, HAProxy, the replicas) inherit the set."""
    grandchild = "import os; print(sorted(os.sched_getaffinity(0)))"
    child = ("import subprocess, sys, time\ntime.sleep(0.5)\n"
             f"print(subprocess.run([sys.executable, '-c', {grandchild!r}],"
             " capture_output=True, text=True).stdout.strip())")
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    pin_cpus(frozenset({ALLOWED[-1]}), process.pid)
    out, _ = process.communicate(timeout=60)
    assert out.strip() == f"[{ALLOWED[-1]}]"


def _pool_workers() -> list[int]:
    """This process's multiprocessing workers (``spawn_main`` children, from /proc; not its
    resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and b"spawn_main" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


@needs_two
def test_the_client_processes_run_on_the_clients_cpus() -> None:
    seen: dict[int, set[int]] = {}

    def note_workers() -> None:
        for pid in _pool_workers():
            seen.setdefault(pid, set(os.sched_getaffinity(pid)))

    with stub_server(note_workers) as port:
        result = run_load(LoadSpec(host="127.0.0.1", port=port, clients=2, seconds=0.3,
                                   warmup=0.1, rows=(RowInput("x", (2,)),),
                                   cpus=frozenset({ALLOWED[-1]})), 2)
    assert result.sent > 0 and seen
    assert all(cpus == {ALLOWED[-1]} for cpus in seen.values()), seen
