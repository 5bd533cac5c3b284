"""Triton's installation key vouched for by a kernel set (no Triton here: a fake installation
laid out like Triton 3.6's and 3.7's, and hand-made ELF files; test_triton_releases.py runs the
seam against real Triton packages)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pkgutil
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from qkan_pack.runtime._triton_compat import (
    elf_build_id,
    libtriton_path,
    vouched_key,
    vouched_triton_key,
)

VERSION = "3.6.0"


def _elf(build_id: bytes, padding: int = 0) -> bytes:
    """A minimal 64-bit little-endian ELF: one PT_NOTE segment holding a GNU build ID."""
    note = struct.pack("<III", 4, len(build_id), 3) + b"GNU\0" + build_id
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x20, 64)  # e_phoff
    struct.pack_into("<HH", header, 0x36, 56, 1)  # e_phentsize, e_phnum
    program = struct.pack("<IIQQQQQQ", 4, 0, 120, 0, 0, len(note), len(note), 4)
    return bytes(header) + program + note + b"\0" * padding


def test_build_id_of_a_hand_made_and_a_real_elf(tmp_path: Path) -> None:
    (tmp_path / "lib.so").write_bytes(_elf(bytes(range(20))))
    assert elf_build_id(tmp_path / "lib.so") == bytes(range(20)).hex()
    (tmp_path / "text").write_text("not an ELF")
    assert elf_build_id(tmp_path / "text") is None
    (tmp_path / "short").write_bytes(_elf(bytes(20))[:70])
    assert elf_build_id(tmp_path / "short") is None
    assert elf_build_id(tmp_path / "missing") is None
    readelf = shutil.which("readelf")
    if readelf:
        executable = os.path.realpath(sys.executable)
        shown = subprocess.run([readelf, "-n", executable], capture_output=True, text=True).stdout
        if "Build ID:" in shown:
            assert elf_build_id(executable) == shown.split("Build ID:")[1].split()[0]


def _fake_triton(root: Path, build_id: bytes = b"\x01" * 20) -> Path:
    for name, text in {"runtime/cache.py": "# cache", "compiler/__init__.py": "",
                       "compiler/compiler.py": "# c", "backends/__init__.py": "",
                       "backends/driver.py": "# d", "language/__init__.py": "",
                       "language/core.py": "# core", "language/math.py": "# math"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    library = libtriton_path(root)
    library.parent.mkdir(parents=True)
    library.write_bytes(_elf(build_id, padding=4096))
    return root


def _triton_key_as_triton_36_computes_it(root: Path) -> str:
    """Transcribed from triton 3.6 runtime/cache.py ``triton_key`` (3.7's is the same; paths
    made explicit)."""
    contents = [hashlib.sha256((root / "runtime" / "cache.py").read_bytes()).hexdigest()]
    for path, prefix in ((root / "compiler", "triton.compiler."),
                         (root / "backends", "triton.backends.")):
        for lib in pkgutil.walk_packages([str(path)], prefix=prefix):
            with open(lib.module_finder.find_spec(lib.name).origin, "rb") as f:
                contents += [hashlib.sha256(f.read()).hexdigest()]
    libtriton_hash = hashlib.sha256(libtriton_path(root).read_bytes())
    contents.append(libtriton_hash.hexdigest())
    for lib in pkgutil.walk_packages([str(root / "language")], prefix="triton.language."):
        with open(lib.module_finder.find_spec(lib.name).origin, "rb") as f:
            contents += [hashlib.sha256(f.read()).hexdigest()]
    return f"{VERSION}" + "-".join(contents)


def _record(root: Path) -> dict:
    library = libtriton_path(root)
    return {"triton_key": _triton_key_as_triton_36_computes_it(root),
            "libtriton_size": library.stat().st_size, "libtriton_build_id": elf_build_id(library)}


def test_the_same_installation_is_vouched_for(tmp_path: Path) -> None:
    root = _fake_triton(tmp_path / "triton")
    record = _record(root)
    assert vouched_key(record, root, VERSION) == record["triton_key"]


@pytest.mark.parametrize("change", ["build id", "size", "source", "version", "key"])
def test_any_difference_leaves_triton_to_hash_itself(tmp_path: Path, change: str) -> None:
    root = _fake_triton(tmp_path / "triton")
    record = _record(root)
    version = VERSION
    if change == "build id":
        libtriton_path(root).write_bytes(_elf(b"\x02" * 20, padding=4096))
    elif change == "size":
        libtriton_path(root).write_bytes(_elf(b"\x01" * 20, padding=4097))
    elif change == "source":
        (root / "language" / "math.py").write_text("# edited")
    elif change == "version":
        version = "3.6.1"
    else:
        record["triton_key"] = record["triton_key"][:-1] + "x"
    assert vouched_key(record, root, version) is None


def test_without_triton_nothing_is_replaced() -> None:
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("checks the absence of Triton (the GPU test covers its presence)")
    with vouched_triton_key({"triton_key": "x"}) as vouched:
        assert vouched is False


def test_a_triton_outside_the_supported_releases_is_named_and_kernels_not_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from qkan_pack.runtime._triton_compat import SUPPORTED, unsupported_triton

    assert str(SUPPORTED) == "3.2–3.7"
    fake = types.ModuleType("triton")
    for version, refused in (("3.7.1", False), ("3.6.0", False), ("3.2.1", False),
                             ("3.8.0", True), ("3.1.0", True), ("2.3.1", True), ("dev", True)):
        fake.__version__ = version  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "triton", fake)
        said = unsupported_triton()
        assert (said is not None) == refused, version
        if refused:
            assert said.startswith(f"shipped kernels not used: Triton {version} is outside the "
                                   "supported range 3.2–3.7; kernels are compiled at load"), said
