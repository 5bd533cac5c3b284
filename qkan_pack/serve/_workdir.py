"""Each serve's work directory, the processes started for it, and the start-up sweep of the
directories that killed serves left.

A serve works in ``qkan-pack-serve-XXXXXXXX`` under the temporary directory (the name
``tempfile.mkdtemp`` makes: HAProxy's config, socket and error pages, Ray's wrapper) and
keeps two records there:

- ``OWNER_FILE``: the serve's process id, its start time (clock ticks after boot, from
  ``/proc/PID/stat``) and its PID namespace (``/proc/self/ns/pid``). An id alone is reused by
  later processes, and means nothing in another PID namespace that shares ``/tmp`` (a
  container);
- ``PROCESSES_FILE``: a line per process started for the directory, id and start time. The
  HAProxy wrapper writes its own before it execs HAProxy (same id, same start time), so the
  line names the HAProxy that Ray started, which outlives a killed serve (Ray's manager sets
  no parent-death signal on it).

The sweep removes a directory only when sure it is a dead serve's: the exact name, a
directory of this user's that no one else may write, records read without following a link
or blocking (a FIFO) and of bounded size, an owner recorded in this PID namespace that no
longer runs (its id is gone, or held by a process started at another time). It stops only
the recorded processes still running with their recorded start time: never a process found
by its command line, which would also match an operator's ``tail`` or editor of the old
config, or a live serve whose directory name extends the stale one's. Anything it cannot be sure of is
left alone with a one-line note.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ..errors import FileReadError

WORKDIR_PREFIX = "qkan-pack-serve-"
#: The names ``tempfile.mkdtemp(prefix=WORKDIR_PREFIX)`` makes (8 characters of its
#: alphabet; a test pins this shape against the running Python).
WORKDIR_NAME = re.compile(re.escape(WORKDIR_PREFIX) + r"[a-z0-9_]{8}")
OWNER_FILE = "owner.json"
PROCESSES_FILE = "processes"
MAX_OWNER_BYTES = 4096
MAX_PROCESSES_BYTES = 64 * 1024
STOP_WAIT_S = 3.0

Notice = Callable[[str], None]


@dataclass(frozen=True)
class ProcessId:
    """A process as the records name it: its id and its start time (ticks after boot)."""

    pid: int
    start: int


class _Uncertain(Exception):
    """A work directory the sweep cannot judge (the message says why): left alone."""


class _Missing(_Uncertain):
    """The record does not exist."""


def running_since(pid: int) -> int | None:
    """Process ``pid``'s start time, None when no such process runs (gone, or a zombie).
    Raises OSError when ``/proc`` cannot tell (no permission)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw.rsplit(b")", 1)[1].split()  # the command name may hold spaces and ')'
    return None if fields[0] == b"Z" else int(fields[19])


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``), None where it cannot be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def owned_workdir(workdir: Path) -> Path:
    """``workdir`` with this process recorded as its owner (written whole, then renamed
    into place: a sweep never reads half a record)."""
    me = os.getpid()
    record = {"pid": me, "start": running_since(me), "pid_ns": pid_namespace()}
    partial = workdir / f".{OWNER_FILE}.partial"
    partial.write_text(json.dumps(record))
    os.replace(partial, workdir / OWNER_FILE)
    return workdir


def record_process(workdir: Path, pid: int) -> None:
    """Add ``pid`` (with its start time) to ``workdir``'s processes: a later sweep, or this
    serve's own stop, may stop it."""
    start = running_since(pid)
    if start is None:
        return
    fd = os.open(workdir / PROCESSES_FILE,
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{pid} {start}\n".encode())  # one short append: never interleaved
    finally:
        os.close(fd)


def sweep_stale_workdirs(root: Path | None = None, notice: Notice = lambda line: None
                         ) -> list[Path]:
    """Remove the work directories of serves that were killed (SIGKILL skips all cleanup),
    first stopping the processes recorded for them (module docstring). Another user's
    directory, or one whose owner runs, is skipped; one it cannot judge is left with a
    ``notice``. Returns what was removed."""
    base = root or Path(tempfile.gettempdir())
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    removed = []
    for name in names:
        if not WORKDIR_NAME.fullmatch(name):
            continue
        workdir = base / name
        try:
            leftovers = _stale_processes(workdir)
        except _Uncertain as why:
            notice(f"note: left {workdir} alone: {why}; remove it by hand if no serve uses it")
            continue
        if leftovers is None:
            continue
        stop_processes(leftovers)
        shutil.rmtree(workdir, ignore_errors=True)  # never follows a link (fd-based)
        removed.append(workdir)
    return removed


def stop_recorded_processes(workdir: Path, wait_s: float = STOP_WAIT_S) -> list[int]:
    """Stop the processes recorded for ``workdir`` that still run (this serve's own stop:
    the HAProxy that Ray's kill of its manager orphaned)."""
    try:
        fd = _open_directory(workdir)
    except OSError:
        return []
    try:
        return stop_processes(_recorded(fd), wait_s)
    except _Uncertain:
        return []
    finally:
        os.close(fd)


def stop_processes(processes: Sequence[ProcessId], wait_s: float = STOP_WAIT_S) -> list[int]:
    """SIGTERM, then SIGKILL after ``wait_s``, each of ``processes`` that still runs with its
    recorded start time and belongs to this user. Returns the ids signalled."""
    handles = [h for h in map(_Handle.open, processes) if h is not None]
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for handle in handles:
                handle.signal(sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(h.running() for h in handles):
                time.sleep(0.05)
            if not any(h.running() for h in handles):
                break
    finally:
        for handle in handles:
            handle.close()
    return [h.process.pid for h in handles]


class _Handle:
    """A recorded process, pinned (Linux ``pidfd``) once its start time matched: a signal
    can then reach no other process that took its id meanwhile."""

    def __init__(self, process: ProcessId, fd: int | None) -> None:
        self.process = process
        self.fd = fd

    @classmethod
    def open(cls, process: ProcessId) -> _Handle | None:
        fd = None
        with suppress(AttributeError, OSError):  # no pidfd here (old kernel, not Linux), or gone
            fd = os.pidfd_open(process.pid)
        handle = cls(process, fd)
        if handle.running() and _owned_by_me(process.pid):
            return handle
        handle.close()
        return None

    def running(self) -> bool:
        try:
            return running_since(self.process.pid) == self.process.start
        except OSError:
            return False

    def signal(self, sig: signal.Signals) -> None:
        with suppress(ProcessLookupError, PermissionError):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            elif self.running():
                os.kill(self.process.pid, sig)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def _stale_processes(workdir: Path) -> list[ProcessId] | None:
    """The processes recorded for ``workdir`` when it is a dead serve's; None when it is not
    this user's serve directory or its owner runs. Raises ``_Uncertain`` otherwise."""
    try:
        fd = _open_directory(workdir)
    except OSError:
        return None  # a link (ELOOP), not a directory, or gone: no serve made it
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            return None  # another user's serve: theirs to sweep
        if info.st_mode & 0o022:
            raise _Uncertain(f"others may write into it (mode {stat.S_IMODE(info.st_mode):04o}; "
                             "serve makes its directories 0700)")
        owner = _owner(_read_record(fd, OWNER_FILE, MAX_OWNER_BYTES))
        if owner is None:
            raise _Uncertain(f"its {OWNER_FILE} is not a serve's owner record")
        pid, start, namespace = owner
        here = pid_namespace()
        if namespace is None or here is None or start is None:
            raise _Uncertain("the PID namespace or start time of its owner is unknown")
        if namespace != here:
            raise _Uncertain(f"its owner (process {pid}) ran in another PID namespace "
                             f"({namespace}), which cannot be checked from here")
        try:
            if running_since(pid) == start:
                return None  # a live serve's
        except OSError as exc:
            raise _Uncertain(f"cannot tell whether its owner (process {pid}) runs "
                             f"({exc.strerror})") from None
        return _recorded(fd)
    finally:
        os.close(fd)


def _open_directory(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _owner(data: bytes) -> tuple[int, int | None, str | None] | None:
    """(pid, start, PID namespace) from an owner record, None when it is not one."""
    try:
        record = json.loads(data)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    pid, start, namespace = record.get("pid"), record.get("start"), record.get("pid_ns")
    if (type(pid) is not int or pid <= 0 or not (start is None or type(start) is int)
            or not (namespace is None or isinstance(namespace, str))):
        return None
    return pid, start, namespace


def _recorded(directory_fd: int) -> list[ProcessId]:
    """The processes in a directory's ``PROCESSES_FILE`` (none when it has none)."""
    try:
        data = _read_record(directory_fd, PROCESSES_FILE, MAX_PROCESSES_BYTES)
    except _Missing:
        return []
    processes = []
    for line in data.decode("ascii", "replace").splitlines():
        fields = line.split()
        if len(fields) != 2 or not all(f.isdigit() and f.isascii() for f in fields):
            raise _Uncertain(f"its {PROCESSES_FILE} record is garbled ({line[:40]!r})")
        processes.append(ProcessId(int(fields[0]), int(fields[1])))
    return processes


def _read_record(directory_fd: int, name: str, limit: int) -> bytes:
    """The bytes of record ``name``, read as every supplied file is
    (``runtime.read_regular_file``): opened relative to the directory without following a
    link or blocking (a FIFO), and only from a regular file of this user's of at most
    ``limit`` bytes (a link to ``/dev/zero`` would run a read out of memory)."""
    from ..runtime import read_regular_file  # here: serve's modules import no runtime

    try:
        return read_regular_file(name, limit=limit, dir_fd=directory_fd, follow_symlinks=False,
                                 vet=_this_users)
    except FileReadError as exc:
        if exc.reason == "missing":
            raise _Missing(f"it has no {name}") from None
        raise _Uncertain(f"its {name} {exc.problem}") from None


def _this_users(info: os.stat_result) -> str | None:
    return None if info.st_uid == os.getuid() else "belongs to another user"
