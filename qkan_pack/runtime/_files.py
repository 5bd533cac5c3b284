"""The one reader of files that a user or an artifact supplies: an artifact's manifest,
signature and listed files, trusted key files, serve's token file and its work directory's
records.

Such a path may name anything: a FIFO (a plain ``open`` waits for a writer forever), a
device (``/dev/zero`` never ends), a symlink to either, a file that grows while it is read,
or one swapped between a check and the read. So the file is opened once, without blocking
(and, where asked, without following a link), checked on that descriptor to be a regular
file, and read through it up to a limit: what is checked is what is read. A caller that
streams a large file (a multi-gigabyte checkpoint through ``torch.load``) takes the checked
descriptor itself (``open_regular_file``) instead of its bytes.

Torch-free: ``inspect`` and ``serve``'s supervisor use it without importing torch.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from ..errors import FileReadError

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["open_regular_file", "read_regular_file"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
#: The least one read asks for once the file's checked size is read (it grew meanwhile).
_CHUNK = 1 << 20


def read_regular_file(path: str | os.PathLike[str], *, limit: int, follow_symlinks: bool = True,
                      dir_fd: int | None = None,
                      vet: Callable[[os.stat_result], str | None] | None = None) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    ``follow_symlinks=False`` refuses a link at ``path`` itself (an artifact's files: a link
    could point outside it). ``dir_fd`` opens ``path`` relative to an open directory.
    ``vet`` sees the descriptor's ``os.stat_result`` before anything is read and returns
    why the file is refused (its mode, owner or size), or None.

    Raises ``FileReadError`` (``.reason``: ``missing``, ``link``, ``unreadable``,
    ``special``, ``refused``, ``too large``), which each caller says in its own terms.
    """
    fd = _open(path, follow_symlinks, dir_fd)
    try:
        info = _checked(fd, path, limit, vet)
        data = _read_at_most(fd, limit + 1, path, info.st_size)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after fstat
        raise _too_large(path, limit)
    return data


@contextmanager
def open_regular_file(path: str | os.PathLike[str], *, limit: int,
                      follow_symlinks: bool = True, dir_fd: int | None = None,
                      vet: Callable[[os.stat_result], str | None] | None = None
                      ) -> Iterator[BinaryIO]:
    """The regular file at ``path`` opened for reading, checked as ``read_regular_file``
    checks it (``limit`` bounds its size when opened), for a reader that streams it
    (``torch.load``, ``numpy.load``) rather than holding all its bytes: it reads the
    descriptor that was checked, never the path again. Closed on leaving the block."""
    fd = _open(path, follow_symlinks, dir_fd)
    try:
        _checked(fd, path, limit, vet)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle


def _checked(fd: int, path: str | os.PathLike[str], limit: int,
             vet: Callable[[os.stat_result], str | None] | None) -> os.stat_result:
    """``fd``'s status, once it is known to be a regular file within ``limit`` that ``vet``
    does not refuse."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise FileReadError(path=str(path), reason="special",
                            problem="is not a regular file (a FIFO, device or directory): "
                                    "refused without reading it")
    refused = vet(info) if vet is not None else None
    if refused is not None:
        raise FileReadError(path=str(path), reason="refused", problem=refused)
    if info.st_size > limit:
        raise _too_large(path, limit, info.st_size)
    return info


def _open(path: str | os.PathLike[str], follow_symlinks: bool, dir_fd: int | None) -> int:
    flags = _OPEN_FLAGS | (0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0))
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileReadError(path=str(path), reason="missing", problem="does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise FileReadError(path=str(path), reason="link",
                                problem="is a symlink: refused (a link may point anywhere)"
                                ) from None
        raise FileReadError(path=str(path), reason="unreadable",
                            problem=f"cannot be opened ({exc.strerror})") from None


def _read_at_most(fd: int, most: int, path: str | os.PathLike[str], size: int) -> bytes:
    """At most ``most`` bytes from ``fd``, a file of ``size`` bytes when checked (one read
    for a regular file, more if it is short). Each read asks for what the file holds, not
    for ``most``: ``os.read`` allocates what it is asked for, and a large limit (a weights
    file's) would be an allocation of that size whatever the file holds."""
    chunks, left = [], most
    try:
        while left > 0:
            chunk = os.read(fd, min(left, max(size + 1, _CHUNK)))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
            size -= len(chunk)
    except OSError as exc:
        raise FileReadError(path=str(path), reason="unreadable",
                            problem=f"cannot be read ({exc.strerror})") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(path: str | os.PathLike[str], limit: int, size: int | None = None) -> FileReadError:
    found = f"it is {size} bytes" if size is not None else "it grew while it was read"
    return FileReadError(path=str(path), reason="too large",
                         problem=f"is larger than {limit} bytes, the limit here ({found})")
