"""Every access to Triton's internals, in one place: its installation key and its cache knob.

Both exist for shipped kernels (``_kernels``): a load points Triton's cache at the shipped
set (``knobs.cache.dir``, overridden through the knob object's ``__dict__`` so that the
environment variable rules) and may answer ``triton.runtime.cache.triton_key()`` itself.
They were written against the Triton releases in ``SUPPORTED`` (``_supported.TRITON``), each
read from its sources: ``triton_key``'s inputs and order, the cache layout (one directory per
kernel hash, files beside a ``__grp__<name>`` JSON index of absolute ``child_paths``) and the
``knobs.cache.dir`` descriptor are the same in 3.2 to 3.7; CI exercises this module against
the newest of them installed on a CPU (``tests/runtime/test_triton_releases.py``). Outside that
range ``unsupported_triton`` says so and a load compiles as usual instead of using shipped
kernels.

Spare a fresh process Triton's hash of its own installation when a kernel set vouches for it.

Before its first kernel lookup, every process computes ``triton.runtime.cache.triton_key()``
(Triton 3.x): the sha256 of every source file of Triton's compiler, backends and language,
and of ``libtriton.so`` -- over 400 MB in Triton 3.6 and 3.7, about 0.4 s from a warm page cache and more
from a cold disk, most of the first forward when the kernels are shipped. The value only
identifies the installation (it is part of every cache key).

``qkan-pack warm`` records the value together with libtriton's size and GNU build ID (the
linker's hash of the library's contents). At load, the value is rebuilt from this host's
files: the small sources hashed exactly as Triton hashes them, libtriton's digest taken from
the record only when its size and build ID match this host's library. When the rebuilt value
equals the recorded one, ``triton_key`` answers it for the duration of the load; any
difference (another Triton build, a changed algorithm, no build ID) leaves Triton to hash as
usual. Correctness never depends on it: a wrong key could only miss the shipped kernels.

The ELF note is read here (a page or two of the file) rather than with pyelftools, whose
import alone costs ~0.1 s on the path this module exists to shorten.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._supported import TRITON

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["record_installation", "triton_key_file"]

#: Triton releases whose internals this module was written against (stated in ``_supported``).
SUPPORTED = TRITON
#: A kernel set's record: ``kernels/<key>`` + this suffix (JSON, written by ``warm``).
TRITON_KEY_SUFFIX = "-triton-key.json"
_PT_NOTE = 4
_NT_GNU_BUILD_ID = 3


def triton_key_file(directory: str) -> str:
    return directory + TRITON_KEY_SUFFIX


def elf_build_id(path: str | os.PathLike[str]) -> str | None:
    """The GNU build ID of a 64-bit little-endian ELF file (hex), or None."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
            if header[:6] != b"\x7fELF\x02\x01":
                return None
            phoff, = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            handle.seek(phoff)
            table = handle.read(phentsize * phnum)
            for index in range(phnum):
                kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, index * phentsize)
                if kind == _PT_NOTE:
                    handle.seek(offset)
                    found = _build_id_note(handle.read(size))
                    if found:
                        return found
    except (OSError, struct.error):
        return None
    return None


def _build_id_note(notes: bytes) -> str | None:
    position = 0
    while position + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, position)
        name_end = position + 12 + ((namesz + 3) & ~3)
        if kind == _NT_GNU_BUILD_ID and notes[position + 12:position + 12 + namesz] == b"GNU\0":
            return notes[name_end:name_end + descsz].hex()
        position = name_end + ((descsz + 3) & ~3)
    return None


def libtriton_path(triton_root: Path) -> Path:
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    return triton_root / "_C" / f"libtriton.{ext}"


def record_installation() -> dict[str, Any] | None:
    """What ``warm`` ships: this process's ``triton_key()`` and libtriton's fingerprint."""
    try:
        from triton.runtime import cache
    except ImportError:
        return None
    library = libtriton_path(Path(cache.__file__).resolve().parent.parent)
    build_id = elf_build_id(library)
    if build_id is None:
        return None
    return {"triton_key": cache.triton_key(), "libtriton_size": library.stat().st_size,
            "libtriton_build_id": build_id}


def vouched_key(record: dict[str, Any], triton_root: Path, version: str) -> str | None:
    """The recorded key if this host's installation rebuilds exactly that value, else None."""
    library = libtriton_path(triton_root)
    shipped = record.get("triton_key")
    try:
        size = library.stat().st_size
    except OSError:
        return None
    if (not isinstance(shipped, str) or not shipped.startswith(version)
            or size != record.get("libtriton_size")
            or elf_build_id(library) != record.get("libtriton_build_id")):
        return None
    parts = shipped[len(version):].split("-")
    front, language = _source_digests(triton_root)
    if len(parts) != len(front) + 1 + len(language):
        return None
    rebuilt = version + "-".join([*front, parts[len(front)], *language])
    return shipped if rebuilt == shipped else None


def _source_digests(triton_root: Path) -> tuple[list[str], list[str]]:
    """Triton 3.x ``triton_key``'s source hashes, in its order: runtime/cache.py, then the
    compiler and backends packages, (libtriton goes here), then the language package."""
    import pkgutil

    def digests(folder: str, prefix: str) -> list[str]:
        found = []
        for info in pkgutil.walk_packages([str(triton_root / folder)], prefix=prefix):
            # walk_packages' finders are path-entry finders, whose find_spec takes the name
            # alone; typeshed types the attribute as either kind of finder
            spec = info.module_finder.find_spec(info.name)  # type: ignore[call-arg]
            if spec is None or spec.origin is None:  # Triton's own hashing would fail too
                raise LookupError(f"no source file for {info.name}")
            found.append(hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest())
        return found

    front = [hashlib.sha256((triton_root / "runtime" / "cache.py").read_bytes()).hexdigest()]
    front += digests("compiler", "triton.compiler.") + digests("backends", "triton.backends.")
    return front, digests("language", "triton.language.")


@contextlib.contextmanager
def vouched_triton_key(record: dict[str, Any] | None) -> Iterator[bool]:
    """While inside, Triton's ``triton_key()`` answers the vouched value (yields whether)."""
    try:
        import triton
        from triton.runtime import cache
        root = Path(cache.__file__).resolve().parent.parent
        value = vouched_key(record, root, triton.__version__) if record else None
    except Exception:  # no Triton, an unexpected layout: Triton hashes as usual
        value = None
    if value is None:
        yield False
        return
    original = cache.triton_key
    cache.triton_key = lambda: value
    try:
        yield True
    finally:
        cache.triton_key = original


def unsupported_triton() -> str | None:
    """Why shipped kernels cannot be used with this host's Triton, or None (none installed
    counts as supported: nothing of Triton's is touched then)."""
    try:
        import triton
    except ImportError:
        return None
    if not SUPPORTED.admits(triton.__version__):
        return "shipped kernels not used: " + SUPPORTED.outside(
            triton.__version__, "kernels are compiled at load instead (a slower cold start); "
            "serve with a Triton in that range to use them (each kernel set's key names the "
            "torch and Triton it was warmed with)")
    return None


def cache_knobs() -> object | None:
    """Triton's cache knob object (``triton.knobs.cache``), where this Triton has one."""
    try:
        from triton import knobs
    except ImportError:
        return None
    return getattr(knobs, "cache", None)


@contextlib.contextmanager
def cache_dir_from_environment() -> Iterator[None]:
    """While inside, Triton's cache directory follows ``TRITON_CACHE_DIR`` again: a value set
    on the knob (which wins over the variable) is set aside and put back afterwards."""
    knobs = cache_knobs()
    previous = knobs.__dict__.pop("dir", None) if knobs is not None else None
    try:
        yield
    finally:
        if knobs is not None and previous is not None:
            knobs.__dict__["dir"] = previous
