"""Naming libcuda for Triton while loading, so that it skips ``ldconfig -p`` (GPU effect:
the lead's profiled cold start; here, the lookup and the scoping of the variable)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qkan_pack.runtime._kernels import LIBCUDA_ENV, _libcuda_hint, mapped_libcuda_dir


def _maps(tmp_path: Path, library: Path) -> Path:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 00:00 0    [heap]\n"
        f"7f10-7f20 r-xp 00001000 08:01 4242  {library}\n"
        "7f30-7f40 r--p 00000000 08:01 17   /usr/lib/libc.so.6\n")
    return maps


def test_the_mapped_driver_library_names_the_directory(tmp_path: Path) -> None:
    drivers = tmp_path / "drivers"
    drivers.mkdir()
    (drivers / "libcuda.so.1").write_bytes(b"")
    (drivers / "libcuda.so.580.95").write_bytes(b"")
    assert mapped_libcuda_dir(str(_maps(tmp_path, drivers / "libcuda.so.580.95"))) == str(drivers)


def test_no_usable_directory_means_no_hint(tmp_path: Path) -> None:
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "libcuda.so.580.95").write_bytes(b"")  # no libcuda.so.1 beside it
    assert mapped_libcuda_dir(str(_maps(tmp_path, lonely / "libcuda.so.580.95"))) is None
    assert mapped_libcuda_dir(str(tmp_path / "no-maps")) is None


def test_the_variable_is_set_only_while_loading(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.delenv(LIBCUDA_ENV, raising=False)
    monkeypatch.setattr("qkan_pack.runtime._kernels.mapped_libcuda_dir", lambda: str(tmp_path))
    with _libcuda_hint():
        assert os.environ[LIBCUDA_ENV] == str(tmp_path)
    assert LIBCUDA_ENV not in os.environ


def test_a_users_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LIBCUDA_ENV, "/opt/mine")
    monkeypatch.setattr("qkan_pack.runtime._kernels.mapped_libcuda_dir", lambda: "/elsewhere")
    with _libcuda_hint():
        assert os.environ[LIBCUDA_ENV] == "/opt/mine"
    assert os.environ[LIBCUDA_ENV] == "/opt/mine"
