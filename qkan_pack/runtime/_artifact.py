"""Read an artifact back verified, without torch and without ever importing user code.

The manifest is size-capped and strictly parsed, the tree is checked for
symlinks, unlisted and missing files, then every file's size and sha256 is checked, then
(still without torch or user code) every safetensors header is parsed and the reference
files must hold exactly the inputs and outputs the manifest declares. The verified bytes
are returned so callers parse exactly what was hashed (no re-read races).
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, DigestMismatchError, FileReadError, ManifestError
from ..format import (
    DIGEST_PREFIX,
    DTYPES,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MAX_SIGNATURE_BYTES,
    SIGNATURE_NAME,
    WEIGHTS_NAME,
    FileEntry,
    Manifest,
    loads_strict,
    parse_manifest,
)
from ._files import read_regular_file
from ._options import normalise_digest
from ._source import SourceLines, check_entry_named

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = ["VerifiedArtifact", "artifact_digest", "read_artifact", "safetensors_header", "sha256_hex"]


MAX_HEADER_BYTES = 16 * 1024 * 1024  # safetensors JSON header (weights and references)


@dataclass(frozen=True)
class VerifiedArtifact:
    """An artifact whose every byte matched its manifest when read.

    ``signed_by``: who signed it, when trusted keys were given and the signature verified
    (None otherwise: a signature file that was not verified is never trusted, nor read).
    ``manifest_bytes``: the manifest as read (its sha256 is ``digest``).
    """

    path: Path
    manifest: Manifest
    digest: str
    files: Mapping[str, bytes]
    signed_by: str | None = None
    manifest_bytes: bytes = b""
    #: The model source's lines in ``linecache`` while it is imported and rebuilt from this
    #: artifact; a ``Predictor`` takes it over and releases it at close.
    source_lines: SourceLines = field(default_factory=SourceLines, compare=False, repr=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_digest(manifest_bytes: bytes) -> str:
    """The whole-artifact digest: sha256 of manifest.json, which pins every file's sha256."""
    return DIGEST_PREFIX + sha256_hex(manifest_bytes)


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def read_artifact(path: str | os.PathLike[str], *, expected_digest: str | None = None,
                  trusted_keys: Sequence[str | os.PathLike[str]] = ()) -> VerifiedArtifact:
    """Audit an artifact directory and return its verified bytes.

    Order: trusted keys parsed -> manifest size -> pinned digest -> signature (when keys are
    given: it must verify with one of them and cover exactly this manifest) -> format/version
    -> signed digests = the manifest's -> layout (symlinks, missing, extra files) -> each
    file's size -> each file's sha256 -> safetensors headers and references against the
    manifest -> the entry named in the source. Runs no user code.
    """
    trust = _trust(trusted_keys)
    root = _artifact_root(path)
    manifest_bytes = _read_regular(root, MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
    digest = artifact_digest(manifest_bytes)
    if expected_digest is not None and normalise_digest(expected_digest) != digest:
        raise DigestMismatchError(path=str(root), actual=digest, expected=expected_digest)
    signed, signer = _signature(root, manifest_bytes, trust)
    manifest = parse_manifest(manifest_bytes)
    if signed is not None:
        _check_signed(root, signed, manifest, manifest_bytes)
    _check_layout(root, manifest)
    files = {name: _read_checked(root, name, entry)
             for name, entry in sorted(manifest.files.items())}
    _check_contents(manifest, files)
    return VerifiedArtifact(path=root, manifest=manifest, digest=digest, files=files,
                            signed_by=signer, manifest_bytes=manifest_bytes)


def _trust(trusted_keys: Sequence[str | os.PathLike[str]]) -> Any:
    if not trusted_keys:
        return None
    from ._signature import load_trust  # only with keys: model_signing costs ~0.5 s to import

    return load_trust([Path(key) for key in trusted_keys])


def _signature(root: Path, manifest_bytes: bytes, trust: Any
               ) -> tuple[Mapping[str, str] | None, str | None]:
    """With trusted keys: verify the signature file against them (before the manifest is
    even parsed); without: leave it unread."""
    if trust is None:
        return None, None
    from ._signature import verify_signature

    present = (root / SIGNATURE_NAME).exists() or (root / SIGNATURE_NAME).is_symlink()
    data = _read_regular(root, SIGNATURE_NAME, limit=MAX_SIGNATURE_BYTES) if present else None
    return verify_signature(root, data, manifest_bytes, trust)


def _check_signed(root: Path, signed: Mapping[str, str], manifest: Manifest,
                  manifest_bytes: bytes) -> None:
    """What was signed is exactly what the (authentic) manifest lists; each file's bytes are
    then checked against the manifest as they are read."""
    from ._signature import check_signed_files

    listed = {name: entry.sha256 for name, entry in manifest.files.items()}
    listed[MANIFEST_NAME] = sha256_hex(manifest_bytes)
    check_signed_files(root, signed, listed)


def _artifact_root(path: str | os.PathLike[str]) -> Path:
    root = Path(path)
    try:
        info = root.lstat()
    except FileNotFoundError:
        raise ArtifactError(f"no artifact at {root}: the directory does not exist",
                            path=str(root)) from None
    except OSError as exc:
        raise ArtifactError(f"cannot read artifact {root}: {exc.strerror}", path=str(root)) from None
    if stat.S_ISLNK(info.st_mode):
        raise ArtifactError(f"artifact path {root} is a symlink; pass the real directory",
                            path=str(root))
    if not stat.S_ISDIR(info.st_mode):
        raise ArtifactError(f"artifact path {root} is not a directory", path=str(root))
    if not (root / MANIFEST_NAME).exists() and not (root / MANIFEST_NAME).is_symlink():
        raise ArtifactError(
            f"{root} has no {MANIFEST_NAME}: not an artifact, or a build that did not finish",
            path=str(root))
    return root


def _check_layout(root: Path, manifest: Manifest) -> None:
    listed = set(manifest.files) | {MANIFEST_NAME}
    found = set(_walk(root)) - {SIGNATURE_NAME}  # optional, verified only with trusted keys
    extra = sorted(found - listed)
    missing = sorted(listed - found)
    if missing:
        raise ArtifactError(f"artifact {root} is missing listed files: {', '.join(missing)}",
                            path=str(root))
    if extra:
        raise ArtifactError(
            f"artifact {root} holds files its manifest does not list: {', '.join(extra)}; "
            "an artifact is never edited by hand: rebuild it", path=str(root))


def _walk(root: Path) -> Iterator[str]:
    """Yield every regular file as a POSIX path relative to root; refuse anything else."""
    stack = [root]
    while stack:
        folder = stack.pop()
        for entry in _entries(folder):
            relative = Path(entry.path).relative_to(root).as_posix()
            if entry.is_symlink():
                raise ArtifactError(
                    f"artifact {root} contains a symlink at {relative}; symlinks are refused "
                    "because they can point outside the artifact", path=entry.path)
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield relative
            else:
                raise ArtifactError(f"artifact {root} contains a special file at {relative}",
                                    path=entry.path)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError as exc:
        raise ArtifactError(f"cannot list {folder}: {exc.strerror}", path=str(folder)) from None


def _read_regular(root: Path, name: str, *, limit: int, exact: int | None = None) -> bytes:
    """Read ``root/name`` through one descriptor (``read_regular_file``): never a symlink,
    never waiting on a FIFO or device, never more than ``limit`` bytes (``exact``: the size
    the manifest declares, checked on the same descriptor)."""
    path = root / name

    def declared_size(info: os.stat_result) -> str | None:
        if exact is None or info.st_size == exact:
            return None
        return (f"is {info.st_size} bytes but the manifest says {exact}: the file was "
                "truncated, extended or replaced; rebuild the artifact")

    try:
        return read_regular_file(path, limit=limit, follow_symlinks=False, vet=declared_size)
    except FileReadError as exc:
        if exc.reason == "too large":
            raise ManifestError(f"{path} {exc.problem}: corrupt or hostile") from None
        raise ArtifactError(str(exc), path=str(path)) from None


def _read_checked(root: Path, name: str, entry: FileEntry) -> bytes:
    data = _read_regular(root, name, limit=entry.size, exact=entry.size)
    if len(data) != entry.size:
        raise ArtifactError(f"{name} in {root} changed size while being read", path=str(root / name))
    actual = sha256_hex(data)
    if actual != entry.sha256:
        raise ArtifactError(
            f"{name} in {root} has sha256 {actual[:16]}…, the manifest says "
            f"{entry.sha256[:16]}…: the file was modified; rebuild the artifact", path=str(root / name)
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
            if found[key] != (shape, DTYPES[dtype].safetensors):
                raise ArtifactError(
                    f"{entry.reference} holds {key} as {found[key][0]} {found[key][1]}, the "
                    f"manifest declares {shape} {dtype} for shape {entry.label}: the manifest or "
                    "the file was edited; rebuild the artifact"
                )
    info = manifest.model
    check_entry_named(info.entry, {p: files[p] for p in (info.source, *info.includes)},
                      info.source)


def safetensors_header(data: bytes, where: str) -> dict[str, dict[str, Any]]:
    """Audit safetensors bytes without torch: ``{tensor name: {"dtype", "shape", "nbytes"}}``.

    safetensors' own parser (``safetensors.deserialize``, in Rust) checks the header, the
    dtypes and that the data offsets tile the payload exactly. Two checks stay here: a size
    cap on the header before anything parses it, and duplicate JSON keys, which that parser
    accepts (the last one wins), so that what we audit is what every reader sees.
    """
    if len(data) < 8:
        raise ArtifactError(f"{where} is {len(data)} bytes: not a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    if length > MAX_HEADER_BYTES or length > len(data) - 8:
        raise ArtifactError(
            f"{where} declares a {length}-byte header (file is {len(data)} bytes, limit "
            f"{MAX_HEADER_BYTES}): corrupt or hostile"
        )
    try:
        loads_strict(data[8:8 + length])
    except ManifestError as exc:
        raise ArtifactError(f"{where} has an invalid safetensors header: {exc}") from None
    import safetensors  # here: `--help` does not load it; inspect does (Rust, no torch)

    try:
        # safetensors' stub leaves deserialize unannotated
        tensors = safetensors.deserialize(data)  # type: ignore[no-untyped-call]
    except (safetensors.SafetensorError, ValueError, OverflowError) as exc:
        raise ArtifactError(f"{where} is not a valid safetensors file: {exc}") from None
    return {name: {"dtype": info["dtype"], "shape": list(info["shape"]), "nbytes": len(info["data"])}
            for name, info in tensors}
