"""Write artifacts atomically: a reader never sees a half-written one.

Every file goes into a temp directory beside the target (same filesystem), is fsynced, the
manifest is written last, then the directory is renamed into place (or atomically
exchanged with an existing artifact under ``force``). A killed build leaves at most a
``.<name>.partial-*`` directory, never at the target and swept by the next build (where
renameat2 is missing, the two-rename swap may also leave the old artifact moved aside as
``.<name>.old-<pid>``: the next build puts it back). Write failures (a full disk) raise
``ArtifactError`` and leave the target as it was; so does a manifest the reader would
refuse (``readable_manifest``: ``ManifestError`` before anything is written).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, ManifestError
from ..format import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    dumps_manifest,
    manifest_to_dict,
    parse_manifest,
)
from ..runtime import artifact_digest, output_path, refuse_unsafe_output, sha256_hex

_PARTIAL_MARK = ".partial-"
_BACKUP_MARK = ".old-"
_RENAME_EXCHANGE = 2


def file_entries(files: Mapping[str, bytes]) -> dict[str, FileEntry]:
    return {name: FileEntry(size=len(data), sha256=sha256_hex(data)) for name, data in files.items()}


def write_artifact(target: str | os.PathLike[str], manifest: Manifest, files: Mapping[str, bytes],
                   *, force: bool = False, protect: Sequence[str | os.PathLike[str]] = ()
                   ) -> tuple[Manifest, str]:
    """Write ``files`` plus a manifest listing them; return the final manifest (its
    ``format_version`` the one the writer chose for its keys) and the digest.

    The manifest is refused before anything on disk changes unless a reader takes it back
    (``readable_manifest``): a build never replaces an artifact with one nothing can read.
    ``protect``: folders the output must neither be nor contain (the model's own folder).
    """
    final = dataclasses.replace(manifest, files=file_entries(files))
    manifest_bytes, read_back = readable_manifest(final)
    install_artifact(target, {**files, MANIFEST_NAME: manifest_bytes}, force=force,
                     protect=protect)
    final = dataclasses.replace(final, format_version=read_back.format_version)
    return final, artifact_digest(manifest_bytes)


def readable_manifest(manifest: Manifest) -> tuple[bytes, Manifest]:
    """``manifest``'s bytes, and the manifest a reader takes back from them: within the size
    every reader accepts (``MAX_MANIFEST_BYTES``), parsed by ``format.parse_manifest`` and
    written again to the same bytes (nothing the writer emits is refused, dropped or changed
    by the reader). A ``ManifestError`` says what to change; nothing is written."""
    data = dumps_manifest(manifest)
    if len(data) > MAX_MANIFEST_BYTES:
        raise _oversized(manifest, len(data))
    try:
        read_back = parse_manifest(data)
    except ManifestError as exc:
        raise ManifestError(f"the manifest this build made would be refused by every reader: "
                            f"{exc}; nothing was written") from exc
    if dumps_manifest(read_back) != data:
        raise ManifestError("the manifest this build made reads back differently (a reader "
                            "would see another artifact); nothing was written: report this "
                            "as a bug, with the build command")
    return data, read_back


#: What shrinks each top-level part of a manifest that is too large.
_SHRINK = {"metadata": "fewer or shorter class labels (a model's config.id2label), labels or "
                       "description",
           "shapes": "fewer declared shapes",
           "model": "a smaller factory config or fewer included source files"}


def _oversized(manifest: Manifest, size: int) -> ManifestError:
    """The refusal of a manifest over the reader's limit, naming its largest parts."""
    parts = sorted(((len(json.dumps(value)), key)
                    for key, value in manifest_to_dict(manifest).items()), reverse=True)[:3]
    shown = ", ".join(f"{key} {length} bytes" for length, key in parts)
    fix = _SHRINK.get(parts[0][1], f"a smaller {parts[0][1]}")
    return ManifestError(f"the manifest would be {size} bytes, more than the "
                         f"{MAX_MANIFEST_BYTES} bytes every reader accepts (largest parts: "
                         f"{shown}); nothing was written: build with {fix}")


def install_artifact(target: str | os.PathLike[str], files: Mapping[str, bytes], *,
                     force: bool = False, protect: Sequence[str | os.PathLike[str]] = (),
                     derived: Callable[[Path], Mapping[str, bytes]] | None = None) -> Path:
    """Stage ``files`` (``manifest.json`` among them, written last) beside ``target``, add the
    files ``derived`` computes from the staged directory (a signature over it), then move it
    into place.

    Refused before anything on disk changes: an output inside an existing artifact, one the
    working directory is in, one that is or contains a ``protect``ed folder. Any OS failure
    (read-only file system, permissions, full disk) is one ``ArtifactError`` naming the path.
    """
    target = output_path(target)
    refuse_unsafe_output(target, protect)
    with _write_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        with _target_lock(target):
            _sweep_partials(target)  # first: it may put back an artifact a killed build moved aside
            _refuse_existing(target, force)
            _stage_and_install(target, files, derived)
    return target


@contextlib.contextmanager
def locked_target(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``target``'s writer lock across a read-modify-write (``sign``, ``warm``): read the
    artifact inside, then install (``install_artifact`` re-enters the held lock). Without it
    a ``build --force`` installing between the read and the write would be undone, without
    a word, by the old artifact. Yields the absolute output path.

    Refuses first what ``install_artifact`` would refuse (the lock file beside a target
    inside an artifact would land in it). Where the folder does not exist there is nothing
    to lock against: the read that follows says what is missing.
    """
    path = output_path(target)
    refuse_unsafe_output(path)
    if not path.parent.is_dir():
        yield path
        return
    with contextlib.ExitStack() as held:
        with _write_errors(path):  # only taking the lock: the caller's own errors are its own
            held.enter_context(_target_lock(path))
        yield path


@contextlib.contextmanager
def _write_errors(target: Path) -> Iterator[None]:
    """Any OS failure (read-only file system, permissions, full disk) as one ``ArtifactError``
    naming the path that failed."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, ArtifactError):
            raise
        # name the path that failed, unless it is inside the staging directory (gone now)
        failed = str(exc.filename) if exc.filename and _PARTIAL_MARK not in str(exc.filename) \
            else str(target)
        where = f" ({failed})" if failed != str(target) else ""
        raise ArtifactError(
            f"cannot write artifact {target}: {exc.strerror or exc}{where}; "
            f"{_write_advice(exc.errno)}", path=failed) from exc


def _write_advice(errno_code: int | None) -> str:
    """What to do about a failed write, by its cause (advice that fits the error only)."""
    if errno_code in (errno.ENOSPC, errno.EDQUOT):
        return "free space and build again"
    if errno_code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "choose an output you may write to, or fix its permissions"
    return "choose an output in a writable directory (-o DIR)"


def _stage_and_install(target: Path, files: Mapping[str, bytes],
                       derived: Callable[[Path], Mapping[str, bytes]] | None) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{_PARTIAL_MARK}{os.getpid()}-",
                                    dir=target.parent))
    try:
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the artifact from other users
        for name, data in files.items():
            if name != MANIFEST_NAME:
                _write_file(staging / name, data)
        _write_file(staging / MANIFEST_NAME, files[MANIFEST_NAME])
        for name, data in (derived(staging) if derived is not None else {}).items():
            _write_file(staging / name, data)
        _fsync_tree(staging)
        _install(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _refuse_existing(target: Path, force: bool) -> None:
    if target.is_symlink():
        raise ArtifactError(f"output path {target} is a symlink; choose a real directory")
    if target.exists():
        if not target.is_dir():
            raise ArtifactError(f"output path {target} exists and is not a directory",
                                path=str(target))
        held = sorted(entry.name for entry in target.iterdir())
        if not held:
            return  # an empty folder made for the artifact: nothing to replace
        if MANIFEST_NAME not in held:
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            raise ArtifactError(
                f"{target} is not an artifact but holds {shown}: replacing it would delete "
                "them (with --force too); choose another output or empty it", path=str(target))
        if not force:
            raise ArtifactError(f"an artifact already exists at {target}: build with --force "
                                "to replace it", path=str(target))


@contextlib.contextmanager
def _target_lock(target: Path) -> Iterator[None]:
    """Serialise writers of one target (advisory flock beside it): builds, and ``sign`` and
    ``warm`` from their read to their write. Re-entrant within a thread (a held lock is not
    taken again: a second flock on a new descriptor would wait for itself); another thread
    or process waits."""
    lock_path = str(target.parent / f".{target.name}.lock")
    held = _held_locks()
    if lock_path in held:
        yield
        return
    with _locked_file(lock_path) as handle:
        held.add(lock_path)
        try:
            yield
        finally:
            held.discard(lock_path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path)  # removed while held: no lock file is left beside it
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _locked_file(lock_path: str) -> Any:
    """The lock file, open and flocked. A waiter can get the lock on a file its holder has
    just removed: then the path names another file (or none), and the lock is taken again on
    what the path names now, so that every holder locks the same file."""
    while True:
        handle = open(lock_path, "a+")  # noqa: SIM115  (closed by the caller's with)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            if os.fstat(handle.fileno()).st_ino == os.stat(lock_path).st_ino:
                return handle
        except FileNotFoundError:
            pass
        except BaseException:
            handle.close()
            raise
        handle.close()


_THREAD = threading.local()


def _held_locks() -> set[str]:
    """The target locks this thread holds."""
    if not hasattr(_THREAD, "held"):
        _THREAD.held = set()
    return _THREAD.held


def _sweep_partials(target: Path) -> None:
    """Remove staging directories left by killed builds whose process is gone, and put back
    an old artifact that a build killed inside the non-atomic fallback swap had moved aside."""
    prefix = f".{target.name}{_PARTIAL_MARK}"
    for leftover in _named_with(target.parent, prefix):
        pid_text = leftover.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(leftover, ignore_errors=True)
    backup_prefix = f".{target.name}{_BACKUP_MARK}"
    for backup in _named_with(target.parent, backup_prefix):
        pid_text = backup.name[len(backup_prefix):]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if target.exists() or target.is_symlink():
                shutil.rmtree(backup, ignore_errors=True)
            else:
                os.rename(backup, target)


def _named_with(folder: Path, prefix: str) -> list[Path]:
    """Entries of ``folder`` whose name starts with ``prefix``, compared as text: a glob
    would read ``[``, ``*`` or ``?`` in an output name as a pattern, miss its own leftovers
    and match another output's (and put that one's backup back under this name)."""
    with os.scandir(folder) as entries:
        return [Path(entry.path) for entry in entries if entry.name.startswith(prefix)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, _files in os.walk(root):
        _fsync_dir(Path(folder))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _install(staging: Path, target: Path) -> None:
    """Move the staged artifact into place; an existing one is exchanged atomically."""
    if not target.exists():
        os.rename(staging, target)
        _fsync_dir(target.parent)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging)  # now holds the old artifact
        _fsync_dir(target.parent)
        return
    backup = target.parent / f".{target.name}{_BACKUP_MARK}{os.getpid()}"
    os.rename(target, backup)
    os.rename(staging, target)
    _fsync_dir(target.parent)
    shutil.rmtree(backup)


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second),
                       _RENAME_EXCHANGE)
    return result == 0
