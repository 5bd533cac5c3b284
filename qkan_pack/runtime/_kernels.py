"""Shipped GPU kernels at load: pick the set that matches this host, serve Triton from it.

An artifact may carry JIT-compiled kernels under ``kernels/<key>/`` (written by ``qkan-pack
warm``). The key names the GPU architecture and the toolchain (Triton, torch, CUDA, Python,
machine): Triton's own cache keys differ across any of them. At load, a matching set is
copied to a private temp directory and Triton is pointed at it only while the predictor
loads; the artifact and the user's own cache are never written.

Also here: ``PrecompiledExport``, what ``warm``'s child load is handed (on its command line,
then as ``Predictor.load``'s ``export``) to write the precompiled graphs compiled mode makes
for warm to ship; and ``process_environment``, the scope of a setting a library reads from
the environment (Triton's and inductor's cache directories, Ray's settings for serve).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import KernelCacheError, ManifestError
from ..format import KernelSet, loads_strict
from ._artifact import VerifiedArtifact
from ._triton_compat import cache_dir_from_environment, unsupported_triton, vouched_triton_key

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["PLAN_FILE", "TRITON_CACHE_ENV", "PrecompiledExport", "collect_kernel_cache",
           "inductor_file", "kernel_key", "kernel_name", "precompiled_dir",
           "process_environment"]


TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
#: Triton (3.x, ``backends/nvidia/driver.py: libcuda_dirs``) runs ``/sbin/ldconfig -p`` once
#: per process to find libcuda unless this names its directory.
LIBCUDA_ENV = "TRITON_LIBCUDA_PATH"
_GROUP_PREFIX = "__grp__"
_CACHE_PLACEHOLDER = "/$QKAN_PACK_KERNEL_DIR"
_SKIPPED_SUFFIXES = (".lock",)
#: A kernel set's inductor cache (compiled mode): ``kernels/<key>`` + this suffix.
INDUCTOR_SUFFIX = "-inductor.bin"
#: A kernel set's precompiled graphs (compiled mode): under ``kernels/<key>`` + this suffix,
#: the plan (``_precompiled.Plan``) in ``PLAN_FILE`` and one ``<index>.pt2`` (AOTInductor) or
#: ``<index>.bin`` (inductor) per shape.
PRECOMPILED_SUFFIX = "-precompiled"
PLAN_FILE = "plan.json"
_REFUSED_FILE = "refused.txt"
#: Held while a load points a process-wide cache (Triton's or inductor's directory, Triton's
#: key) at its private copy: two loads doing that at once would restore each other's settings
#: out of order (the second load would run on without its kernels, and the process be left
#: pointing Triton at a deleted directory). Re-entrant: compiled mode takes it inside a load that
#: holds it; always taken before the capture session's lock (``_load``).
PROCESS_CACHES = threading.RLock()


@dataclass(frozen=True)
class PrecompiledExport:
    """What ``qkan-pack warm``'s child load does with the precompiled graphs compiled mode
    makes (``Predictor.load(..., export=...)``): writes them into ``directory`` for warm to
    ship, or there says why the model has none; with ``directory`` None, makes none (warm's
    fallback after its fresh-process probe refused them). Either way the load never uses
    graphs the artifact already ships: warm is replacing them."""

    directory: Path | None

    @property
    def makes_forms(self) -> bool:
        return self.directory is not None

    def write_forms(self, plan: bytes, files: Mapping[str, bytes]) -> None:
        """The plan (``PLAN_FILE``) and its files, by their names under ``directory``."""
        for name, data in {**files, PLAN_FILE: plan}.items():
            self._write(name, data)

    def write_refusal(self, reason: str) -> None:
        """Why this model has no precompiled graphs, for warm to record."""
        self._write(_REFUSED_FILE, reason.encode())

    def read(self) -> tuple[dict[str, bytes], str | None]:
        """warm's side: the files written (plan and graphs by name; empty when none were)
        and the refusal, if one was written."""
        root = self.directory
        if root is None:
            return {}, None
        if (root / PLAN_FILE).exists():
            return {path.relative_to(root).as_posix(): path.read_bytes()
                    for path in sorted(root.rglob("*"))
                    if path.is_file() and path.name != _REFUSED_FILE}, None
        refused = root / _REFUSED_FILE
        return {}, refused.read_text() if refused.exists() else None

    def _write(self, name: str, data: bytes) -> None:
        if self.directory is None:
            return
        destination = self.directory / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(data)


def inductor_file(directory: str) -> str:
    """Where the kernel set stored under ``directory`` keeps its inductor cache, if any."""
    return directory + INDUCTOR_SUFFIX


def precompiled_dir(directory: str) -> str:
    """Where the kernel set stored under ``directory`` keeps its precompiled graphs, if any
    (beside its Triton cache, which a load copies whole)."""
    return directory + PRECOMPILED_SUFFIX


def kernel_key(device_index: int = 0) -> tuple[str, dict[str, str]]:
    """The compatibility key of this host's GPU + toolchain, and its readable details."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    major, minor = torch.cuda.get_device_capability(device_index)
    details = {
        "gpu": torch.cuda.get_device_name(device_index),
        "arch": f"sm_{major}{minor}",
        "triton": triton_version,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
    }
    key = (f"sm{major}{minor}-triton{triton_version}-torch{torch.__version__}"
           f"-cuda{torch.version.cuda}-py{sys.version_info.major}{sys.version_info.minor}"
           f"-{platform.machine()}")
    return key.replace("+", "_"), details


def collect_kernel_cache(cache: Path, entries: Iterable[str] | None = None) -> dict[str, bytes]:
    """Every finished cache file (or those of the ``entries``: top-level directories, one per
    compiled kernel), with group indexes made relocatable."""
    collected = {}
    roots = [cache] if entries is None else [cache / entry for entry in sorted(set(entries))]
    for file in sorted(f for root in roots for f in root.rglob("*")):
        if not file.is_file() or file.name.endswith(_SKIPPED_SUFFIXES) or ".tmp" in file.name:
            continue
        data = file.read_bytes()
        if file.name.startswith(_GROUP_PREFIX):
            data = _relocate_group(data, str(cache), _CACHE_PLACEHOLDER, where=str(file))
        collected[file.relative_to(cache).as_posix()] = data
    return collected


def _relocate_group(data: bytes, old_root: str, new_root: str, where: str = "group index"
                    ) -> bytes:
    """Rewrite a Triton group index's absolute ``child_paths`` from one cache root to another.

    Triton records where each compiled file of a kernel lives as absolute paths; a cache
    moved to another directory misses on every kernel unless those paths follow it. Every
    path must lie inside ``old_root`` (no ``..``, no other absolute path): an artifact's index
    naming ``/etc/...`` or ``$ROOT/../..`` would make Triton load a file from outside the
    artifact's private copy, so it is refused (``KernelCacheError``), never passed through.
    """
    try:
        group = json.loads(data)
        children = group["child_paths"]
        if not isinstance(children, dict):
            raise TypeError("child_paths is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise KernelCacheError(f"{where} is not a Triton group index ({exc}); "
                               "rebuild the kernel set with `qkan-pack warm`") from None
    group["child_paths"] = {name: _moved(path, old_root, new_root, where)
                            for name, path in children.items()}
    return json.dumps(group).encode()


def _moved(path: object, old_root: str, new_root: str, where: str) -> str:
    prefix = old_root.rstrip("/") + "/"
    inside = path[len(prefix):] if isinstance(path, str) and path.startswith(prefix) else None
    parts = inside.split("/") if inside else []
    if inside is None or not parts or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise KernelCacheError(
            f"{where} names {str(path)[:120]!r}, outside the kernel cache it belongs to: "
            "refused (a kernel set may only point inside itself); rebuild it with `qkan-pack warm`")
    return new_root.rstrip("/") + "/" + inside


def matching_set(artifact: VerifiedArtifact, device_index: int) -> tuple[KernelSet | None, str]:
    """The shipped set for this host, and a sentence for ``predictor.report``."""
    if not artifact.manifest.kernels:
        return None, "artifact ships no kernels (run `qkan-pack warm`); compiled as usual"
    unsupported = unsupported_triton()
    if unsupported is not None:
        return None, unsupported
    key, _ = kernel_key(device_index)
    for kernel_set in artifact.manifest.kernels:
        if kernel_set.key == key:
            return kernel_set, f"using shipped kernels {key}"
    shipped = ", ".join(k.key for k in artifact.manifest.kernels)
    return None, f"no shipped kernels for {key} (artifact has {shipped}); compiled as usual"


@contextlib.contextmanager
def shipped_kernels(artifact: VerifiedArtifact, kernel_set: KernelSet) -> Iterator[KernelUse]:
    """Point Triton at a private copy of the shipped kernels for the duration of a load.

    Yields a ``KernelUse`` filled on exit: how many cache entries were shipped, and the
    kernels Triton compiled while loading (not found in the shipped set), read from new or
    rewritten group indexes. Meanwhile Triton finds libcuda without ``ldconfig`` and, when
    the set's record vouches for this host's Triton, skips hashing itself
    (``_triton_compat``).
    """
    prefix = kernel_set.directory + "/"
    counts = KernelUse()
    with PROCESS_CACHES, tempfile.TemporaryDirectory(prefix="qkan-pack-kernels-") as private:
        root = Path(private)
        for name, data in artifact.files.items():
            if name.startswith(prefix):
                destination = root / name[len(prefix):]
                destination.parent.mkdir(parents=True, exist_ok=True)
                if destination.name.startswith(_GROUP_PREFIX):
                    data = _relocate_group(data, _CACHE_PLACEHOLDER, private, where=name)
                destination.write_bytes(data)
        before = _group_stamps(root)
        counts.shipped = len(before)
        with _triton_cache_dir(private), _libcuda_hint(), \
                vouched_triton_key(_key_record(artifact, kernel_set)):
            try:
                yield counts
            finally:
                after = _group_stamps(root)
                changed = [k for k, v in after.items() if before.get(k) != v]
                counts.compiled = sorted(filter(None, map(kernel_name, changed)))
                counts.files = _shippable(root, changed)


def _shippable(root: Path, group_indexes: Iterable[str]) -> dict[str, bytes]:
    """The cache files of the kernels whose group indexes are named, as a set ships them;
    none where one is not a relocatable index (the load goes on: only warm ships them)."""
    try:
        return collect_kernel_cache(root, (index.split("/")[0] for index in group_indexes))
    except KernelCacheError:
        return {}


@dataclass
class KernelUse:
    """What a load took from a shipped kernel set: ``shipped`` cache entries, and the names
    of the kernels it ``compiled`` because the set lacked them (what a stale set misses),
    with their cache ``files`` as a set ships them: ``warm`` adds what its fresh-process
    probe compiled (a fresh process loading precompiled graphs has compiled a Triton kernel
    the graphs call under a cache key the process that made them never wrote)."""

    shipped: int = 0
    compiled: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)


def kernel_name(group_index: str) -> str | None:
    """``<hash>/__grp__<kernel>.json`` -> ``<kernel>``: the name Triton compiled it under
    (None for a path that is no group index)."""
    if not group_index.rsplit("/", 1)[-1].startswith(_GROUP_PREFIX):
        return None
    name = group_index.rsplit("/", 1)[-1].removeprefix(_GROUP_PREFIX)
    return name.removesuffix(".json")


def _key_record(artifact: VerifiedArtifact, kernel_set: KernelSet) -> dict[str, Any] | None:
    """The set's record of Triton's installation key (``warm`` writes it), if any."""
    data = artifact.files.get(kernel_set.details.get("triton_key", ""))
    if data is None:
        return None
    try:
        record = loads_strict(data)
    except ManifestError:
        return None  # unreadable: Triton hashes itself as usual
    return record if isinstance(record, dict) else None


def _group_stamps(root: Path) -> dict[str, int]:
    """Group index files -> mtime in ns: a compile (re)writes its kernel's index."""
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns
            for p in root.glob(f"*/{_GROUP_PREFIX}*")}


@contextlib.contextmanager
def _triton_cache_dir(directory: str) -> Iterator[None]:
    """Set Triton's cache dir for this process only, and restore what was there."""
    with process_environment({TRITON_CACHE_ENV: directory}), cache_dir_from_environment():
        yield  # the variable rules while we load


@contextlib.contextmanager
def process_environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment while the block runs (a library that
    reads its settings from there: Triton's and inductor's cache directories), then what was
    there before restored, unset where nothing was (a load holds ``PROCESS_CACHES`` around
    it; serve sets Ray's settings with it before Ray starts)."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _libcuda_hint() -> Iterator[None]:
    """Name libcuda's directory for Triton while loading, when the user has not: the
    driver library this process already mapped at CUDA init, so Triton skips its ldconfig
    subprocess. Triton memoises the answer; the variable itself is restored afterwards."""
    if os.environ.get(LIBCUDA_ENV) is not None:
        yield
        return
    directory = mapped_libcuda_dir()
    if directory is None:
        yield
        return
    os.environ[LIBCUDA_ENV] = directory
    try:
        yield
    finally:
        if os.environ.get(LIBCUDA_ENV) == directory:
            del os.environ[LIBCUDA_ENV]


def mapped_libcuda_dir(maps: str = "/proc/self/maps") -> str | None:
    """The directory of the ``libcuda.so*`` mapped into this process, if it holds the
    ``libcuda.so.1`` Triton links against (None elsewhere: no CUDA yet, not Linux)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5]).startswith("libcuda.so"):
            directory = os.path.dirname(fields[5])
            if os.path.exists(os.path.join(directory, "libcuda.so.1")):
                return directory
    return None

