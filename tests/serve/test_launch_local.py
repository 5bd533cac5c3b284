"""What `serve` says and leaves outside Ray (no Ray needed): the ready line's device, and the
work directories of killed serves.

A serve killed with SIGKILL leaves its work directory (and possibly an HAProxy naming
it); the next serve removes exactly those: never a running serve's, never one being made,
never another user's or a symlink."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from qkan_pack.serve._launch import (
    OWNER_FILE,
    WORKDIR_PREFIX,
    owned_workdir,
    replica_device_text,
    sweep_stale_workdirs,
)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _wait_for_command_line(pid: int, marker: str) -> None:
    """Until the new process's command line is readable: right after ``Popen`` returns,
    ``/proc/PID/cmdline`` read empty in 28 of 30 tries on the CI machine, and the sweep then
    missed the stand-in orphan (the flaky failure; a real orphan HAProxy has long started)."""
    deadline = time.monotonic() + 10
    while marker.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in orphan never showed its command line"
        time.sleep(0.01)


def test_a_killed_serves_workdir_and_its_orphan_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f"{WORKDIR_PREFIX}killed"
    stale.mkdir()
    (stale / OWNER_FILE).write_text(str(_dead_pid()))
    (stale / "haproxy.cfg").write_text("global\n")
    # stands in for the HAProxy that outlived its manager: its command line names the dir
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                               str(stale / "haproxy.cfg")])
    _wait_for_command_line(orphan.pid, str(stale))
    running = tmp_path / f"{WORKDIR_PREFIX}running"
    running.mkdir()
    owned_workdir(running)  # this process: alive
    making = tmp_path / f"{WORKDIR_PREFIX}making"  # no owner file yet
    making.mkdir()
    linked = tmp_path / f"{WORKDIR_PREFIX}link"
    linked.symlink_to(stale)
    try:
        assert sweep_stale_workdirs(tmp_path) == [stale]
        assert orphan.wait(timeout=10) is not None  # stopped, not left holding a port
    finally:
        orphan.kill()
    assert not stale.exists()
    assert running.is_dir() and making.is_dir() and linked.is_symlink()


def test_unreadable_or_garbled_owner_files_are_left_alone(tmp_path: Path) -> None:
    garbled = tmp_path / f"{WORKDIR_PREFIX}garbled"
    garbled.mkdir()
    (garbled / OWNER_FILE).write_text("not a pid")
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / OWNER_FILE).write_text(str(_dead_pid()))
    assert sweep_stale_workdirs(tmp_path) == []
    assert garbled.is_dir() and other.is_dir()


def test_the_ready_line_says_each_replica_names_its_own_gpu_cuda_0() -> None:
    """Ray hands each replica its GPU through CUDA_VISIBLE_DEVICES: on a 2-GPU host two
    replicas on two GPUs both report cuda:0, which the ready line presented as one GPU
    (seen on an H200 x2 host)."""
    assert replica_device_text("cuda:0", 2) == (
        "cuda:0 (each replica's own view of the GPU Ray gave it)")
    assert replica_device_text("cuda:0", 1) == "cuda:0"
    assert replica_device_text("cpu", 4) == "cpu"
