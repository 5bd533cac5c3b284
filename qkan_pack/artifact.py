"""Write artifacts atomically and read them back verified, without ever importing user code.

Writing: every file goes into a temp directory beside the target (same filesystem), is
fsynced, the manifest is written last, then the directory is renamed into place (or
atomically exchanged with an existing artifact under ``force``). A killed build leaves at
most a ``.<name>.partial-*`` directory, never at the target and swept by the next build
(where renameat2 is missing, the two-rename swap may also leave the old artifact moved
aside as ``.<name>.old-<pid>``: the next build puts it back). Write failures (a full
disk) raise ``ArtifactError`` and leave the target as it was.

Reading: the manifest is size-capped and strictly parsed, the tree is checked for
symlinks, unlisted and missing files, then every file's size and sha256 is checked, then
(still without torch or user code) every safetensors header is parsed and the reference
files must hold exactly the inputs and outputs the manifest declares. The verified bytes
are returned so callers parse exactly what was hashed (no re-read races).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import fcntl
import hashlib
import math
import os
import shutil
import stat
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ArtifactError, DigestMismatchError, ManifestError
from .source import check_entry_named
from .spec import (
    MANIFEST_NAME,
    MAX_HEADER_BYTES,
    MAX_MANIFEST_BYTES,
    WEIGHTS_NAME,
    FileEntry,
    Manifest,
    dumps_manifest,
    loads_strict,
    parse_manifest,
)

DIGEST_PREFIX = "sha256:"
_PARTIAL_MARK = ".partial-"
_BACKUP_MARK = ".old-"
_RENAME_EXCHANGE = 2
#: safetensors dtype code -> bytes per element (codes not listed skip the size check).
_ST_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
                "C64": 8}
#: manifest dtype name -> safetensors dtype code.
_ST_CODES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
             "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
             "bool": "BOOL"}


@dataclass(frozen=True)
class VerifiedArtifact:
    """An artifact whose every byte matched its manifest when read."""

    path: Path
    manifest: Manifest
    digest: str
    files: Mapping[str, bytes]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_digest(manifest_bytes: bytes) -> str:
    """The whole-artifact digest: sha256 of manifest.json, which pins every file's sha256."""
    return DIGEST_PREFIX + sha256_hex(manifest_bytes)


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def read_artifact(path: str | os.PathLike[str], *, expected_digest: str | None = None,
                  include_kernels: bool = True) -> VerifiedArtifact:
    """Audit an artifact directory and return its verified bytes.

    Order: manifest size -> pinned digest -> format/version -> layout (symlinks, missing,
    extra files) -> each file's size -> each file's sha256 -> safetensors headers and
    references against the manifest -> the entry named in the source. Runs no user code.
    """
    root = _artifact_root(path)
    manifest_bytes = _read_regular(root, MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    digest = artifact_digest(manifest_bytes)
    if expected_digest is not None and _normalise_digest(expected_digest) != digest:
        raise DigestMismatchError(
            f"artifact {root} has digest {digest}, but {expected_digest} was pinned: "
            "the artifact changed since the digest was taken; refusing to load it"
        )
    manifest = parse_manifest(manifest_bytes)
    _check_layout(root, manifest)
    wanted = {name: entry for name, entry in manifest.files.items()
              if include_kernels or not _is_kernel_file(manifest, name)}
    files = {name: _read_checked(root, name, entry) for name, entry in sorted(wanted.items())}
    _check_contents(manifest, files)
    return VerifiedArtifact(path=root, manifest=manifest, digest=digest, files=files)


def _is_kernel_file(manifest: Manifest, name: str) -> bool:
    return any(name.startswith(k.directory + "/") for k in manifest.kernels)


def _normalise_digest(text: str) -> str:
    if not isinstance(text, str):
        raise DigestMismatchError(f"expected_digest must be text like 'sha256:…', got {text!r:.40}")
    text = text.strip().lower()
    return text if text.startswith(DIGEST_PREFIX) else DIGEST_PREFIX + text


def _artifact_root(path: str | os.PathLike[str]) -> Path:
    root = Path(path)
    try:
        info = root.lstat()
    except FileNotFoundError:
        raise ArtifactError(f"no artifact at {root}: the directory does not exist") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read artifact {root}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise ArtifactError(f"artifact path {root} is a symlink; pass the real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise ArtifactError(f"artifact path {root} is not a directory")
    if not (root / MANIFEST_NAME).exists() and not (root / MANIFEST_NAME).is_symlink():
        raise ArtifactError(
            f"{root} has no {MANIFEST_NAME}: not an artifact, or a build that did not finish"
        )
    return root


def _check_layout(root: Path, manifest: Manifest) -> None:
    listed = set(manifest.files) | {MANIFEST_NAME}
    found = set(_walk(root))
    extra = sorted(found - listed)
    missing = sorted(listed - found)
    if missing:
        raise ArtifactError(f"artifact {root} is missing listed files: {', '.join(missing)}")
    if extra:
        raise ArtifactError(
            f"artifact {root} holds files its manifest does not list: {', '.join(extra)}; "
            "an artifact is never edited by hand: rebuild it"
        )


def _walk(root: Path) -> Iterator[str]:
    """Yield every regular file as a POSIX path relative to root; refuse anything else."""
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                relative = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    raise ArtifactError(
                        f"artifact {root} contains a symlink at {relative}; symlinks are refused "
                        "because they can point outside the artifact"
                    )
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    yield relative
                else:
                    raise ArtifactError(f"artifact {root} contains a special file at {relative}")


def _read_regular(root: Path, name: str, *, limit: int) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(root / name, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArtifactError(f"{root / name} is a symlink; refused") from None
        raise ArtifactError(f"cannot open {root / name}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{root / name} is not a regular file")
        if info.st_size > limit:
            raise ManifestError(
                f"{root / name} is {info.st_size} bytes; the limit is {limit}: corrupt or hostile"
            )
        return handle.read(limit + 1)


def _read_checked(root: Path, name: str, entry: FileEntry) -> bytes:
    try:
        size = (root / name).lstat().st_size
    except OSError as exc:
        raise ArtifactError(f"cannot stat {root / name}: {exc.strerror}") from None
    if size != entry.size:
        raise ArtifactError(
            f"{name} in {root} is {size} bytes but the manifest says {entry.size}: "
            "the file was truncated, extended or replaced; rebuild the artifact"
        )
    data = _read_regular(root, name, limit=entry.size)
    if len(data) != entry.size:
        raise ArtifactError(f"{name} in {root} changed size while being read")
    actual = sha256_hex(data)
    if actual != entry.sha256:
        raise ArtifactError(
            f"{name} in {root} has sha256 {actual[:16]}…, the manifest says "
            f"{entry.sha256[:16]}…: the file was modified; rebuild the artifact"
        )
    return data


def _check_contents(manifest: Manifest, files: Mapping[str, bytes]) -> None:
    """Cross-check verified bytes with the manifest before any of them is run or loaded."""
    safetensors_header(files[WEIGHTS_NAME], WEIGHTS_NAME)
    for entry in manifest.shapes:
        header = safetensors_header(files[entry.reference], entry.reference)
        wanted = {f"input.{name}": (shape, manifest.input_dtype(name)) for name, shape in entry.inputs}
        wanted.update({f"output.{i}": (leaf.shape, leaf.dtype)
                       for i, leaf in enumerate(entry.outputs.leaves())})
        found = {key: (tuple(info["shape"]), info["dtype"]) for key, info in header.items()}
        if set(found) != set(wanted):
            raise ArtifactError(
                f"{entry.reference} holds {sorted(found)}, the manifest declares {sorted(wanted)} "
                f"for shape {entry.label}: the manifest or the file was edited; rebuild the artifact"
            )
        for key, (shape, dtype) in wanted.items():
            if found[key] != (shape, _ST_CODES[dtype]):
                raise ArtifactError(
                    f"{entry.reference} holds {key} as {found[key][0]} {found[key][1]}, the "
                    f"manifest declares {shape} {dtype} for shape {entry.label}: the manifest or "
                    "the file was edited; rebuild the artifact"
                )
    info = manifest.model
    check_entry_named(info.entry, {p: files[p] for p in (info.source, *info.includes)},
                      info.source)


def safetensors_header(data: bytes, where: str) -> dict[str, dict]:
    """Parse and audit a safetensors header without torch: size cap, strict JSON, known
    fields, and data offsets that tile the payload exactly (as the dtypes and shapes say)."""
    if len(data) < 8:
        raise ArtifactError(f"{where} is {len(data)} bytes: not a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    if length > MAX_HEADER_BYTES or length > len(data) - 8:
        raise ArtifactError(
            f"{where} declares a {length}-byte header (file is {len(data)} bytes, limit "
            f"{MAX_HEADER_BYTES}): corrupt or hostile"
        )
    try:
        header = loads_strict(data[8:8 + length])
    except ManifestError as exc:
        raise ArtifactError(f"{where} has an invalid safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{where}: the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ArtifactError(f"{where}: safetensors __metadata__ must map names to text")
    spans = sorted(_tensor_span(name, info, where) for name, info in header.items())
    cursor = 0
    for begin, end in spans:
        if begin != cursor:
            raise ArtifactError(f"{where}: tensor data overlaps or leaves a gap at byte {cursor}")
        cursor = end
    if cursor != len(data) - 8 - length:
        raise ArtifactError(f"{where}: tensors cover {cursor} bytes of a "
                            f"{len(data) - 8 - length}-byte payload")
    return header


def _tensor_span(name: str, info: object, where: str) -> tuple[int, int]:
    fields = {"dtype", "shape", "data_offsets"}
    if not isinstance(info, dict) or set(info) != fields:
        raise ArtifactError(f"{where}: tensor {name!r} must have exactly {sorted(fields)}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or not isinstance(shape, list) or not all(
        type(d) is int and d >= 0 for d in shape
    ):
        raise ArtifactError(f"{where}: tensor {name!r} has an invalid dtype or shape")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise ArtifactError(f"{where}: tensor {name!r} has invalid data_offsets {offsets!r:.60}")
    itemsize = _ST_ITEMSIZE.get(dtype)
    if itemsize is not None and offsets[1] - offsets[0] != math.prod(shape) * itemsize:
        raise ArtifactError(
            f"{where}: tensor {name!r} is {dtype} {shape} but spans "
            f"{offsets[1] - offsets[0]} bytes: the header was edited"
        )
    return offsets[0], offsets[1]


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def file_entries(files: Mapping[str, bytes]) -> dict[str, FileEntry]:
    return {name: FileEntry(size=len(data), sha256=sha256_hex(data)) for name, data in files.items()}


def write_artifact(target: str | os.PathLike[str], manifest: Manifest, files: Mapping[str, bytes],
                   *, force: bool = False) -> tuple[Manifest, str]:
    """Write ``files`` plus a manifest listing them; return the final manifest and digest."""
    target = Path(target)
    final = dataclasses.replace(manifest, files=file_entries(files))
    manifest_bytes = dumps_manifest(final)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _target_lock(target):
        _sweep_partials(target)  # first: it may put back an artifact a killed build moved aside
        _refuse_existing(target, force)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{_PARTIAL_MARK}{os.getpid()}-",
                                        dir=target.parent))
        try:
            os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the artifact from other users
            for name, data in files.items():
                _write_file(staging / name, data)
            _write_file(staging / MANIFEST_NAME, manifest_bytes)
            _fsync_tree(staging)
            _install(staging, target)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError) and not isinstance(exc, ArtifactError):
                raise ArtifactError(
                    f"cannot write artifact {target}: {exc.strerror or exc}; free space or fix "
                    "permissions and build again"
                ) from exc
            raise
    return final, artifact_digest(manifest_bytes)


def replace_in_artifact(root: Path, manifest: Manifest, new_files: Mapping[str, bytes]) -> str:
    """Add files to an existing artifact and swap in a new manifest atomically (for `warm`).

    New files are written and fsynced first; the manifest swap is one rename, so a crash
    leaves either the old manifest (new files then count as unlisted: rebuild or re-warm)
    or the new one.
    """
    for name, data in new_files.items():
        _write_file(root / name, data)
    manifest_bytes = dumps_manifest(manifest)
    temp = root.parent / f".{root.name}.manifest{_PARTIAL_MARK}{os.getpid()}"
    _write_file(temp, manifest_bytes)
    os.replace(temp, root / MANIFEST_NAME)
    _fsync_dir(root)
    return artifact_digest(manifest_bytes)


def _refuse_existing(target: Path, force: bool) -> None:
    if target.is_symlink():
        raise ArtifactError(f"output path {target} is a symlink; choose a real directory")
    if target.exists():
        if not target.is_dir():
            raise ArtifactError(f"output path {target} exists and is not a directory")
        if not force:
            raise ArtifactError(
                f"an artifact already exists at {target}; pass --force (force=True) to replace it"
            )
        if any(target.iterdir()) and not (target / MANIFEST_NAME).exists():
            raise ArtifactError(
                f"{target} is a non-empty directory that is not an artifact; refusing to replace it"
            )


@contextlib.contextmanager
def _target_lock(target: Path) -> Iterator[None]:
    """Serialise concurrent builds to one target (advisory flock beside it)."""
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _sweep_partials(target: Path) -> None:
    """Remove staging directories left by killed builds whose process is gone, and put back
    an old artifact that a build killed inside the non-atomic fallback swap had moved aside."""
    prefix = f".{target.name}{_PARTIAL_MARK}"
    for leftover in target.parent.glob(prefix + "*"):
        pid_text = leftover.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(leftover, ignore_errors=True)
    backup_prefix = f".{target.name}{_BACKUP_MARK}"
    for backup in target.parent.glob(backup_prefix + "*"):
        pid_text = backup.name[len(backup_prefix):]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if target.exists() or target.is_symlink():
                shutil.rmtree(backup, ignore_errors=True)
            else:
                os.rename(backup, target)


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
