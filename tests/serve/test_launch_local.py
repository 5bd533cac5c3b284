"""What `serve` says and leaves outside Ray (no Ray needed): the ready line's device, and the
work directories of killed serves.

A serve killed with SIGKILL leaves its work directory (and possibly the HAProxy recorded in
it); the next serve removes exactly those and stops exactly that process: never a running
serve's directory or processes, never a process that merely names the directory, never a
directory it cannot judge (left with a note)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from qkan_pack.serve._launch import replica_device_text
from qkan_pack.serve._workdir import (
    OWNER_FILE,
    PROCESSES_FILE,
    WORKDIR_NAME,
    WORKDIR_PREFIX,
    owned_workdir,
    pid_namespace,
    record_process,
    running_since,
    stop_recorded_processes,
    sweep_stale_workdirs,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _workdir(root: Path, suffix: str = "killed00") -> Path:
    workdir = root / f"{WORKDIR_PREFIX}{suffix}"
    workdir.mkdir(mode=0o700)
    (workdir / "haproxy.cfg").write_text("global\n")
    return workdir


def _owner(workdir: Path, pid: int | None = None, start: int | None = 12345,
           namespace: str | None = "ours") -> Path:
    """A dead owner by default (a pid that has exited)."""
    record = {"pid": _dead_pid() if pid is None else pid, "start": start,
              "pid_ns": pid_namespace() if namespace == "ours" else namespace}
    (workdir / OWNER_FILE).write_text(json.dumps(record))
    return workdir


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts, killed at its end whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _start(spawned: list[subprocess.Popen[bytes]], *command: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(list(command), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    spawned.append(process)
    deadline = time.monotonic() + 10  # until /proc shows its command line, as an orphan's
    while command[-1].encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in process never started"
        time.sleep(0.01)
    return process


def _sweep(root: Path) -> tuple[list[Path], list[str]]:
    notes: list[str] = []
    return sweep_stale_workdirs(root, notes.append), notes


def test_work_directories_have_the_exact_shape_the_sweep_looks_for(tmp_path: Path) -> None:
    """The sweep takes only ``tempfile.mkdtemp``'s names: pinned against this Python."""
    for _ in range(20):
        assert WORKDIR_NAME.fullmatch(Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX,
                                                            dir=tmp_path)).name)
    for name in ("qkan-pack-serve-", "qkan-pack-serve-abc", "qkan-pack-serve-abcdefgh_",
                 "qkan-pack-serve-ABCDEFGH", "xqkan-pack-serve-abcdefgh"):
        assert not WORKDIR_NAME.fullmatch(name), name


def test_a_killed_serves_workdir_and_its_recorded_haproxy_are_removed(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """Audit (issue 32, item 3): the sweep SIGTERMed every process whose command line merely
    contained the stale directory's path, an operator's ``tail -f`` of the old config and a
    live serve whose directory name extends the stale one's. Only the recorded process is
    stopped now."""
    stale = _owner(_workdir(tmp_path))
    orphan = _start(spawned, "sleep", "120")  # stands in for the HAProxy Ray left
    record_process(stale, orphan.pid)
    tail = _start(spawned, "tail", "-f", str(stale / "haproxy.cfg"))
    longer = tmp_path / f"{stale.name}x"  # another serve's directory, named longer
    longer.mkdir()
    (longer / "haproxy.cfg").write_text("global\n")
    live_haproxy = _start(spawned, "tail", "-f", str(longer / "haproxy.cfg"))
    running = owned_workdir(_workdir(tmp_path, "running0"))  # this process: alive
    record_process(running, live_haproxy.pid)

    removed, notes = _sweep(tmp_path)

    assert removed == [stale] and notes == [] and not stale.exists()
    assert orphan.wait(timeout=10) is not None  # stopped, not left holding a port
    assert tail.poll() is None and live_haproxy.poll() is None
    assert running.is_dir() and longer.is_dir()


def test_a_directory_named_just_the_prefix_is_no_serves(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """Audit: a directory named exactly ``qkan-pack-serve-`` made the next serve kill every
    live serve's HAProxy (its path is a prefix of every work directory's)."""
    bare = _owner(_workdir(tmp_path, ""))
    live = owned_workdir(_workdir(tmp_path, "abcdefgh"))
    live_haproxy = _start(spawned, "tail", "-f", str(live / "haproxy.cfg"))
    record_process(live, live_haproxy.pid)
    assert _sweep(tmp_path) == ([], [])
    assert live_haproxy.poll() is None and bare.is_dir() and live.is_dir()


def test_an_owner_record_that_is_a_fifo_or_a_link_to_dev_zero_is_left_alone(
        tmp_path: Path) -> None:
    """Audit: an owner file that is a FIFO hung every later serve; a symlink to /dev/zero
    ran the read out of memory. Records are opened without following links or blocking and
    read only when they are small regular files."""
    fifo = _workdir(tmp_path, "fifo0000")
    os.mkfifo(fifo / OWNER_FILE)
    zero = _workdir(tmp_path, "zero0000")
    (zero / OWNER_FILE).symlink_to("/dev/zero")
    big = _workdir(tmp_path, "big00000")
    (big / OWNER_FILE).write_bytes(b" " * 10_000_000)
    swept: list[tuple[list[Path], list[str]]] = []
    worker = threading.Thread(target=lambda: swept.append(_sweep(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert swept, "the sweep hung on a FIFO"
    removed, notes = swept[0]
    assert removed == [] and fifo.is_dir() and zero.is_dir() and big.is_dir()
    assert len(notes) == 3 and all(n.count("\n") == 0 for n in notes), notes
    assert any(f"{big} alone: its {OWNER_FILE} is larger than" in n for n in notes), notes
    assert any(f"{fifo} alone: its {OWNER_FILE} is not a regular file" in n for n in notes)
    assert any(f"{zero} alone: its {OWNER_FILE} is a symlink" in n for n in notes), notes


def test_a_serve_in_another_pid_namespace_is_left_alone(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """Audit: a live serve in another PID namespace sharing /tmp (a container) was judged
    dead by its id (which means nothing here), its directory deleted and its processes
    killed. Its owner's namespace is recorded and compared now."""
    elsewhere = _owner(_workdir(tmp_path), namespace="pid:[4026000001]")
    bystander = _start(spawned, "sleep", "121")
    record_process(elsewhere, bystander.pid)  # an id that names another process there
    unknown = _owner(_workdir(tmp_path, "unknown0"), namespace=None)
    removed, notes = _sweep(tmp_path)
    assert removed == [] and elsewhere.is_dir() and unknown.is_dir()
    assert bystander.poll() is None
    assert [n.split(" alone: ")[0] for n in notes] == [f"note: left {elsewhere}",
                                                         f"note: left {unknown}"]
    assert "another PID namespace (pid:[4026000001])" in notes[0]


def test_an_owner_id_now_held_by_another_process_means_the_owner_is_gone(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """A process id alone is reused: the owner is alive only if its start time matches too.
    A recorded process whose id was reused is not signalled."""
    reused = _owner(_workdir(tmp_path), pid=os.getpid(), start=running_since(os.getpid()) + 1)
    stranger = _start(spawned, "sleep", "122")
    (reused / PROCESSES_FILE).write_text(f"{stranger.pid} {running_since(stranger.pid) + 1}\n")
    assert _sweep(tmp_path) == ([reused], [])
    assert stranger.poll() is None


def test_records_the_sweep_cannot_trust_leave_the_directory_alone(tmp_path: Path) -> None:
    garbled = _workdir(tmp_path, "garbled0")
    (garbled / OWNER_FILE).write_text("not a record")
    missing = _workdir(tmp_path, "missing0")  # being made, or left by an older qkan-pack
    shared = _owner(_workdir(tmp_path, "shared00"))
    shared.chmod(0o777)
    bad_processes = _owner(_workdir(tmp_path, "badproc0"))
    (bad_processes / PROCESSES_FILE).write_text("1 2 3\n")
    other = tmp_path / "not-ours"  # not the serve's name shape: not even looked at
    other.mkdir()
    _owner(other)
    removed, notes = _sweep(tmp_path)
    assert removed == [] and all(p.is_dir() for p in (garbled, missing, shared, bad_processes))
    said = dict(n.removeprefix("note: left ").split(" alone: ") for n in notes)
    assert said[str(garbled)].startswith(f"its {OWNER_FILE} is not a serve's owner record")
    assert said[str(missing)].startswith(f"it has no {OWNER_FILE}")
    assert said[str(shared)].startswith("others may write into it (mode 0777")
    assert said[str(bad_processes)].startswith(f"its {PROCESSES_FILE} record is garbled")
    assert len(said) == 4


def test_a_link_named_like_a_workdir_is_not_followed(tmp_path: Path) -> None:
    stale = _owner(_workdir(tmp_path, "target00"))
    (tmp_path / f"{WORKDIR_PREFIX}linked00").symlink_to(stale)
    removed, _ = _sweep(tmp_path)
    assert removed == [stale] and (tmp_path / f"{WORKDIR_PREFIX}linked00").is_symlink()


def test_a_serve_stops_only_the_processes_it_recorded(
        tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """The serve's own stop: the HAProxy Ray orphaned, recorded, and nothing that names the
    directory."""
    workdir = owned_workdir(_workdir(tmp_path, "mine0000"))
    haproxy = _start(spawned, "sleep", "123")
    record_process(workdir, haproxy.pid)
    tail = _start(spawned, "tail", "-f", str(workdir / "haproxy.cfg"))
    assert stop_recorded_processes(workdir) == [haproxy.pid]
    assert haproxy.wait(timeout=10) is not None and tail.poll() is None


def test_the_ready_line_says_each_replica_names_its_own_gpu_cuda_0() -> None:
    """Ray hands each replica its GPU through CUDA_VISIBLE_DEVICES: on a 2-GPU host two
    replicas on two GPUs both report cuda:0, which the ready line presented as one GPU
    (seen on an H200 x2 host)."""
    assert replica_device_text("cuda:0", 2) == (
        "cuda:0 (each replica's own view of the GPU Ray gave it)")
    assert replica_device_text("cuda:0", 1) == "cuda:0"
    assert replica_device_text("cpu", 4) == "cpu"


def test_a_local_ray_starts_as_a_loopback_node() -> None:
    """Pins the Ray internals ``loopback_ray_node`` uses: with ``ENABLE_RAY_CLUSTER`` off, the
    node address a local ``ray.init`` takes is loopback (Ray's metrics exporters then bind
    127.0.0.1); the constant is restored after."""
    pytest.importorskip("ray", reason="Ray Serve is not installed")
    from ray._private import ray_constants, services

    from qkan_pack.serve._ray_compat import loopback_ray_node

    saved = ray_constants.ENABLE_RAY_CLUSTER
    with loopback_ray_node(True):
        assert services.get_node_ip_address() == "127.0.0.1"
        assert services.resolve_ip_for_localhost("127.0.0.1") == "127.0.0.1"
    with loopback_ray_node(False):
        assert ray_constants.ENABLE_RAY_CLUSTER is saved
    assert ray_constants.ENABLE_RAY_CLUSTER is saved
