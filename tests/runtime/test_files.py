"""The one reader of supplied files (``runtime.read_regular_file``): regular files only,
never waiting on a FIFO, never reading past its bound."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from qkan_pack.errors import FileReadError
from qkan_pack.runtime import _files, open_regular_file, read_regular_file


def _reason(call: object) -> str:
    with pytest.raises(FileReadError) as info:
        call()  # type: ignore[operator]
    assert str(info.value).startswith(info.value.path)
    return info.value.reason


def test_a_regular_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_bytes(b"x" * 100)
    assert read_regular_file(path, limit=100) == b"x" * 100
    (tmp_path / "empty").write_bytes(b"")
    assert read_regular_file(tmp_path / "empty", limit=1) == b""


def test_special_files_are_refused_before_any_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(
        _reason(lambda: read_regular_file(fifo, limit=10))), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the reader waited on a FIFO")
    assert result == ["special"]
    assert _reason(lambda: read_regular_file("/dev/zero", limit=10)) == "special"
    assert _reason(lambda: read_regular_file(tmp_path, limit=10)) == "special"


def test_links_are_followed_only_when_asked(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert read_regular_file(tmp_path / "link", limit=10) == b"data"
    assert _reason(lambda: read_regular_file(tmp_path / "link", limit=10,
                                             follow_symlinks=False)) == "link"


def test_missing_large_and_vetted_files(tmp_path: Path) -> None:
    assert _reason(lambda: read_regular_file(tmp_path / "none", limit=10)) == "missing"
    (tmp_path / "big").write_bytes(b"x" * 11)
    assert _reason(lambda: read_regular_file(tmp_path / "big", limit=10)) == "too large"
    assert _reason(lambda: read_regular_file(tmp_path / "big", limit=20,
                                             vet=lambda info: "is refused")) == "refused"


def test_a_file_that_grows_after_its_size_was_checked_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "growing"
    path.write_bytes(b"x" * 50)
    real = os.fstat

    def small(fd: int) -> os.stat_result:  # the size it had when checked
        fields = list(real(fd))
        fields[6] = 5
        return os.stat_result(fields)

    monkeypatch.setattr(_files.os, "fstat", small)
    assert _reason(lambda: read_regular_file(path, limit=10)) == "too large"


def test_a_name_opens_relative_to_a_directory(tmp_path: Path) -> None:
    (tmp_path / "record").write_bytes(b"1 2\n")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_regular_file("record", limit=10, dir_fd=fd) == b"1 2\n"
    finally:
        os.close(fd)


def test_a_large_limit_costs_what_the_file_holds(tmp_path: Path) -> None:
    """Each read asked for the whole limit plus one, and ``os.read`` allocates what it is
    asked for: a limit of a weights file's size (a terabyte) was a MemoryError on a file of
    four bytes. A file that grew past what was checked is still read to the limit."""
    (tmp_path / "small").write_bytes(b"data")
    assert read_regular_file(tmp_path / "small", limit=2**40) == b"data"


def test_an_opened_file_is_checked_as_a_read_one_is(tmp_path: Path) -> None:
    """``open_regular_file`` (a reader that streams, such as torch.load) gets the descriptor
    that was checked, refused as ``read_regular_file`` refuses, and closed after the block."""
    (tmp_path / "a").write_bytes(b"abc")
    with open_regular_file(tmp_path / "a", limit=3) as handle:
        assert handle.read() == b"abc"
        fd = handle.fileno()
    with pytest.raises(OSError):
        os.fstat(fd)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _reason(lambda: open_regular_file(fifo, limit=10).__enter__()) == "special"
    assert _reason(lambda: open_regular_file("/dev/zero", limit=10).__enter__()) == "special"
    assert _reason(lambda: open_regular_file(tmp_path / "a", limit=2).__enter__()) == \
        "too large"
    assert _reason(lambda: open_regular_file(tmp_path / "none", limit=2).__enter__()) == \
        "missing"
