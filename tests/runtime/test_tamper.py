"""The tamper matrix: every corruption is refused with a specific QkanPackError, nothing
crashes, and no code from the artifact runs before the refusal.

The artifact's model source (tests/models/sentinel_model.py) appends to the file named by
``QKAN_PACK_SENTINEL`` when it is imported, when its factory runs and on every forward; a
positive control proves the trace appears when a sound artifact loads.

Corruptions that break the digest chain or the manifest's own consistency are refused
before import. A few edits keep the manifest self-consistent ("re-signed": the attacker
rewrote the digests too); those can only be caught after import (strict weights, the
self-test), and pinning the artifact digest refuses all of them before anything runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import qkan_pack
from qkan_pack import (
    ArtifactError,
    DigestMismatchError,
    IncompatibleArtifactError,
    ManifestError,
    ModelSourceError,
    Predictor,
    QkanPackError,
    SelfTestError,
    WeightsMismatchError,
    build,
    read_artifact,
)
from qkan_pack.format import FORMAT_VERSION, MAX_MANIFEST_BYTES

from ..conftest import MODELS

SOURCE = "source/sentinel_model.py"
WEIGHTS = "weights.safetensors"
REF0 = "references/shape-000.safetensors"
REF1 = "references/shape-001.safetensors"


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> qkan_pack.BuildResult:
    saved = os.environ.pop("QKAN_PACK_SENTINEL", None)
    try:
        return build(MODELS / "sentinel_model.py", "1x2,4x2",
                     output=tmp_path_factory.mktemp("golden") / "art")
    finally:
        if saved is not None:
            os.environ["QKAN_PACK_SENTINEL"] = saved


def copy_of(golden: qkan_pack.BuildResult, tmp_path: Path) -> Path:
    target = tmp_path / "art"
    shutil.copytree(golden.path, target, symlinks=True)
    return target


# ---------------------------------------------------------------------------
# Editing helpers
# ---------------------------------------------------------------------------


def manifest_of(root: Path) -> dict[str, Any]:
    return json.loads((root / "manifest.json").read_text())


def write_manifest(root: Path, raw: dict[str, Any]) -> None:
    (root / "manifest.json").write_text(json.dumps(raw, indent=2))


def edit_manifest(fn: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        raw = manifest_of(root)
        fn(raw)
        write_manifest(root, raw)
    return apply


def resign(root: Path, *names: str) -> None:
    """Rewrite the manifest's size and sha256 of ``names`` to match the files on disk."""
    raw = manifest_of(root)
    for name in names:
        data = (root / name).read_bytes()
        raw["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_manifest(root, raw)


def edit_file(name: str, fn: Callable[[bytes], bytes], *, sign: bool = False) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / name
        path.write_bytes(fn(path.read_bytes()))
        if sign:
            resign(root, name)
    return apply


def flip(offset_fraction: float) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        index = int(len(data) * offset_fraction)
        return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1:]
    return apply


def header_edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    """Rewrite a safetensors JSON header, keeping the tensor bytes as they are."""
    def apply(data: bytes) -> bytes:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        fn(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + data[8 + length:]
    return apply


def first_f32(header: dict[str, Any]) -> str:
    return next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")


def set_dtype(dtype: str, key: str | None = None) -> Callable[[dict[str, Any]], None]:
    def apply(header: dict[str, Any]) -> None:
        header[key or first_f32(header)]["dtype"] = dtype
    return apply


def duplicate_header_key(data: bytes) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    text = data[8:8 + length].replace(b"{", b'{"__metadata__":{"format":"pt"},', 1)
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data[8 + length:]


def swap(a: str, b: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        first, second = (root / a).read_bytes(), (root / b).read_bytes()
        (root / a).write_bytes(second)
        (root / b).write_bytes(first)
    return apply


def symlink_source(root: Path) -> None:
    outside = root.parent / "outside_copy.py"
    outside.write_bytes((root / SOURCE).read_bytes())
    (root / SOURCE).unlink()
    (root / SOURCE).symlink_to(outside)


def symlink_manifest(root: Path) -> None:
    outside = root.parent / "outside_manifest.json"
    outside.write_bytes((root / "manifest.json").read_bytes())
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to(outside)


def symlink_root(root: Path) -> Path:
    real = root.parent / "real"
    root.rename(real)
    root.symlink_to(real, target_is_directory=True)
    return root


def escape_directory(root: Path) -> None:
    """Point the model source at a file beside the artifact, with a correct digest."""
    outside = root.parent / "outside.py"
    outside.write_bytes((root / SOURCE).read_bytes())
    (root / SOURCE).unlink()
    raw = manifest_of(root)
    raw["files"]["../outside.py"] = raw["files"].pop(SOURCE)
    raw["model"]["source"] = "../outside.py"
    write_manifest(root, raw)


def absolute_source(root: Path) -> None:
    raw = manifest_of(root)
    raw["files"][str(root / SOURCE)] = raw["files"].pop(SOURCE)
    raw["model"]["source"] = str(root / SOURCE)
    write_manifest(root, raw)


def duplicate_manifest_key(root: Path) -> None:
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(
        text.replace('"entry": "build_model"', '"entry": "build_model", "entry": "evil"', 1))


def oversize_manifest(root: Path) -> None:
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(text[:-1] + " " * MAX_MANIFEST_BYTES + text[-1:])


def nan_in_manifest(root: Path) -> None:
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(text.replace('"parameters": ', '"parameters": NaN, "x": ', 1))


def add_file(name: str, data: bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return apply


def delete(name: str) -> Callable[[Path], None]:
    return lambda root: (root / name).unlink()


def rename(a: str, b: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / a).rename(root / b)
    return apply


def fifo_inside(root: Path) -> None:
    os.mkfifo(root / "source" / "pipe")


def directory_to_file(root: Path) -> None:
    shutil.rmtree(root / "references")
    (root / "references").write_bytes(b"")


def drop_weights_entry(root: Path) -> None:
    (root / WEIGHTS).unlink()
    raw = manifest_of(root)
    del raw["files"][WEIGHTS]
    write_manifest(root, raw)


def set_path(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


def perturb_reference_output(root: Path) -> None:
    """Re-signed wrong reference numbers: caught by the self-test, never served."""
    data = bytearray((root / REF0).read_bytes())
    data[-1] ^= 0x40  # last byte of output.0 (float32, little-endian high byte)
    (root / REF0).write_bytes(bytes(data))
    resign(root, REF0)


def extra_weight(root: Path) -> None:
    from safetensors.torch import load, save

    tensors = load((root / WEIGHTS).read_bytes())
    tensors["smuggled"] = tensors[next(iter(tensors))].clone()
    (root / WEIGHTS).write_bytes(save(tensors, metadata={"format": "pt"}))
    resign(root, WEIGHTS)


def malicious_source(root: Path) -> None:
    """A complete re-signed swap of the model source: only a pinned digest can refuse it."""
    (root / SOURCE).write_bytes((root / SOURCE).read_bytes() + b"\n_trace('payload')\n")
    resign(root, SOURCE)


@dataclass(frozen=True)
class Case:
    corrupt: Callable[[Path], Path | None]
    error: type[QkanPackError]
    match: str
    before_import: bool = True


CASES: dict[str, Case] = {
    # --- bytes of each file kind ---------------------------------------------------
    "weights truncated": Case(edit_file(WEIGHTS, lambda d: d[:-7]), ArtifactError, "truncated"),
    "weights extended": Case(edit_file(WEIGHTS, lambda d: d + b"\0" * 8), ArtifactError, "bytes but"),
    "weights byte flipped": Case(edit_file(WEIGHTS, flip(0.7)), ArtifactError, "sha256"),
    "source truncated": Case(edit_file(SOURCE, lambda d: d[:40]), ArtifactError, SOURCE),
    "source extended with code": Case(
        edit_file(SOURCE, lambda d: d + b"\n_trace('appended')\n"), ArtifactError, SOURCE),
    "source byte flipped": Case(edit_file(SOURCE, flip(0.5)), ArtifactError, "sha256"),
    "reference truncated": Case(edit_file(REF0, lambda d: d[:-4]), ArtifactError, REF0),
    "reference byte flipped": Case(edit_file(REF1, flip(0.9)), ArtifactError, "sha256"),
    "manifest byte flipped": Case(
        edit_file("manifest.json", lambda d: d.replace(b'"qkan-pack"', b'"pkan-pack"', 1)),
        ManifestError, "not a qkan-pack manifest"),
    "manifest truncated": Case(edit_file("manifest.json", lambda d: d[: len(d) // 2]),
                               ManifestError, "invalid JSON"),
    "manifest extended": Case(edit_file("manifest.json", lambda d: d + b"{}"),
                              ManifestError, "invalid JSON"),
    # --- files deleted, added, renamed, swapped --------------------------------------
    "weights deleted": Case(delete(WEIGHTS), ArtifactError, "missing listed files"),
    "source deleted": Case(delete(SOURCE), ArtifactError, "missing listed files"),
    "manifest deleted": Case(delete("manifest.json"), ArtifactError, "no manifest.json"),
    "unlisted module added": Case(add_file("source/sitecustomize.py", b"_trace('x')\n"),
                                  ArtifactError, "does not list"),
    "unlisted .pth added": Case(add_file("evil.pth", b"import os\n"), ArtifactError, "does not list"),
    "reference renamed": Case(rename(REF0, "references/shape-009.safetensors"),
                              ArtifactError, "missing listed files"),
    "weights swapped with reference": Case(swap(WEIGHTS, REF0), ArtifactError, "bytes but"),
    "references swapped": Case(swap(REF0, REF1), ArtifactError, "bytes but"),
    "special file inside": Case(fifo_inside, ArtifactError, "special file"),
    "directory replaced by file": Case(directory_to_file, ArtifactError, "missing listed files"),
    "weights unlisted and deleted": Case(drop_weights_entry, ManifestError, "weights.safetensors"),
    # --- manifest fields ---------------------------------------------------------------
    "shape edited": Case(edit_manifest(set_path("shapes", 0, "inputs", "x", value=[1, 3])),
                         ArtifactError, "holds input.x as"),
    "input dtype edited": Case(edit_manifest(set_path("inputs", 0, "dtype", value="float64")),
                               ArtifactError, "the manifest declares"),
    "output spec edited": Case(
        edit_manifest(set_path("shapes", 1, "outputs", "tensor", "shape", value=[4, 3])),
        ArtifactError, "holds output.0 as"),
    "digest edited": Case(edit_manifest(set_path("files", WEIGHTS, "sha256", value="0" * 64)),
                          ArtifactError, "sha256"),
    "size edited": Case(edit_manifest(set_path("files", SOURCE, "size", value=1)),
                        ArtifactError, "bytes but"),
    "format version newer": Case(edit_manifest(set_path("format_version", value=FORMAT_VERSION + 1)),
                                 IncompatibleArtifactError, "upgrade qkan-pack"),
    "format name edited": Case(edit_manifest(set_path("format", value="other")),
                               ManifestError, "not a qkan-pack manifest"),
    "entry point edited": Case(edit_manifest(set_path("model", "entry", value="run_payload")),
                               ModelSourceError, "never mentions the entry run_payload"),
    "capture policy edited": Case(edit_manifest(set_path("capture", "policy", value="yolo")),
                                  ManifestError, "capture.policy"),
    "duplicate JSON keys": Case(duplicate_manifest_key, ManifestError, "duplicate JSON key 'entry'"),
    "oversized manifest": Case(oversize_manifest, ManifestError, "limit"),
    "NaN in manifest": Case(nan_in_manifest, ManifestError, "NaN"),
    # --- safetensors headers, re-signed ---------------------------------------------
    "reference dtype edited in header (re-signed)": Case(
        edit_file(REF0, header_edit(set_dtype("I32", "input.x")), sign=True),
        ArtifactError, "holds input.x as"),
    "weights dtype resized in header (re-signed)": Case(
        edit_file(WEIGHTS, header_edit(set_dtype("F16")), sign=True),
        ArtifactError, "not a valid safetensors file"),
    "unknown dtype code in weights header (re-signed)": Case(
        edit_file(WEIGHTS, header_edit(set_dtype("Q9")), sign=True),
        ArtifactError, "not a valid safetensors file"),
    "negative dimension in a reference header (re-signed)": Case(
        edit_file(REF0, header_edit(set_path("input.x", "shape", value=[1, -2])), sign=True),
        ArtifactError, "not a valid safetensors file"),
    "oversized safetensors header (re-signed)": Case(
        edit_file(WEIGHTS, lambda d: struct.pack("<Q", 2**40) + d[8:], sign=True),
        ArtifactError, "-byte header"),
    "duplicate key in safetensors header (re-signed)": Case(
        edit_file(WEIGHTS, duplicate_header_key, sign=True), ArtifactError, "duplicate JSON key"),
    # --- links and paths ------------------------------------------------------------
    "source is a symlink": Case(symlink_source, ArtifactError, "symlink"),
    "manifest is a symlink": Case(symlink_manifest, ArtifactError, "symlink"),
    "artifact root is a symlink": Case(symlink_root, ArtifactError, "symlink"),
    "path escaping the directory": Case(escape_directory, ManifestError, "stay inside"),
    "absolute path": Case(absolute_source, ManifestError, "stay inside"),
    # --- self-consistent (re-signed) edits: refused after import ----------------------
    "weights dtype edited in header, same size (re-signed)": Case(
        edit_file(WEIGHTS, header_edit(set_dtype("I32")), sign=True),
        WeightsMismatchError, "dtype of", before_import=False),
    "extra tensor in weights (re-signed)": Case(
        extra_weight, WeightsMismatchError, "unexpected: smuggled", before_import=False),
    "factory config edited": Case(edit_manifest(set_path("model", "config", value={"width": 3})),
                                  ModelSourceError, "build_model", before_import=False),
    "reference numbers edited (re-signed)": Case(
        perturb_reference_output, SelfTestError, "self-test failed", before_import=False),
}


def apply(case: Case, root: Path) -> Path:
    replaced = case.corrupt(root)
    return replaced if isinstance(replaced, Path) else root


def test_matrix_is_large_enough() -> None:
    assert len(CASES) >= 15
    assert sum(c.before_import for c in CASES.values()) >= 15


def test_sentinel_fires_for_a_sound_artifact(golden: qkan_pack.BuildResult, tmp_path: Path,
                                             sentinel: Path) -> None:
    """Positive control: without it, 'the sentinel never fired' would prove nothing."""
    with Predictor.load(copy_of(golden, tmp_path)) as predictor:
        assert predictor.digest == golden.digest
    assert sentinel.read_text().split() == ["import", "build_model", "forward", "forward"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_tampered_artifact_is_refused(golden: qkan_pack.BuildResult, tmp_path: Path,
                                      sentinel: Path, name: str) -> None:
    case = CASES[name]
    root = apply(case, copy_of(golden, tmp_path))
    with pytest.raises(case.error, match=case.match):
        Predictor.load(root)
    if case.before_import:
        assert not sentinel.exists(), f"{name}: artifact code ran: {sentinel.read_text()!r}"
        with pytest.raises(case.error, match=case.match):
            read_artifact(root)  # what `inspect` and `verify` see, without importing anything
    else:
        assert sentinel.exists()  # documents that these need the model to be detected


@pytest.mark.parametrize("name", sorted([*CASES, "malicious source (re-signed)"]))
def test_pinned_digest_refuses_before_anything_runs(golden: qkan_pack.BuildResult,
                                                    tmp_path: Path, sentinel: Path,
                                                    name: str) -> None:
    case = CASES.get(name, Case(malicious_source, DigestMismatchError, "pinned"))
    root = apply(case, copy_of(golden, tmp_path))
    manifest = root / "manifest.json"
    readable = manifest.is_file() and not manifest.is_symlink() and not root.is_symlink() \
        and manifest.stat().st_size <= MAX_MANIFEST_BYTES
    changed = readable and manifest.read_bytes() != (golden.path / "manifest.json").read_bytes()
    with pytest.raises(QkanPackError) as info:
        Predictor.load(root, expected_digest=golden.digest)
    if changed:
        assert isinstance(info.value, DigestMismatchError), info.value
    assert not sentinel.exists(), f"{name}: artifact code ran: {sentinel.read_text()!r}"


def test_malicious_resigned_source_is_what_pinning_is_for(golden: qkan_pack.BuildResult,
                                                          tmp_path: Path, sentinel: Path) -> None:
    """A re-signed artifact is a different artifact: unpinned, its code runs (trust model)."""
    root = copy_of(golden, tmp_path)
    malicious_source(root)
    with Predictor.load(root) as predictor:
        assert predictor.digest != golden.digest
    assert "payload" in sentinel.read_text().split()


# ---------------------------------------------------------------------------
# Digest pinning and "never unpickle"
# ---------------------------------------------------------------------------


def test_expected_digest_accepts_the_right_one_in_any_spelling(golden: qkan_pack.BuildResult,
                                                               tmp_path: Path) -> None:
    root = copy_of(golden, tmp_path)
    assert golden.digest == "sha256:" + hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    for spelling in (golden.digest, golden.digest.upper().replace("SHA256:", "sha256:"),
                     golden.digest.removeprefix("sha256:"), f"  {golden.digest}\n"):
        with Predictor.load(root, expected_digest=spelling) as predictor:
            assert predictor.digest == golden.digest


def test_expected_digest_mismatch(golden: qkan_pack.BuildResult, tmp_path: Path) -> None:
    root = copy_of(golden, tmp_path)
    wrong = "sha256:" + "f" * 64
    with pytest.raises(DigestMismatchError) as info:
        Predictor.load(root, expected_digest=wrong)
    assert golden.digest in str(info.value) and wrong in str(info.value)
    assert isinstance(info.value, ArtifactError) and isinstance(info.value, OSError)


def test_inspect_prints_the_pinnable_digest(golden: qkan_pack.BuildResult) -> None:
    from click.testing import CliRunner

    from qkan_pack.cli import cli

    result = CliRunner().invoke(cli, ["inspect", str(golden.path)])
    assert result.exit_code == 0, result.output
    assert f"digest     {golden.digest}" in result.stdout


def test_load_never_unpickles(golden: qkan_pack.BuildResult, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unpickling during load")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    with Predictor.load(copy_of(golden, tmp_path)) as predictor:
        assert predictor(torch.zeros(1, 2)).shape == (1, 2)


# ---------------------------------------------------------------------------
# Non-regular files at listed paths: refused through the opened descriptor, never waited on
# ---------------------------------------------------------------------------


def _call_with_deadline(fn: Callable[[], Any], fifo: Path, seconds: float = 20.0) -> BaseException:
    """Run ``fn`` in a thread; if it is still blocked after ``seconds`` (a reader waiting on
    the FIFO), open the FIFO for writing to release it and fail: a refusal must not hang."""
    import threading

    outcome: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # handed back to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(5)
        pytest.fail(f"reading an artifact with a FIFO at {fifo.name} blocked for {seconds} s")
    assert outcome, "a FIFO in place of a listed file was accepted"
    return outcome[0]


def _fifo_at(root: Path, name: str) -> Path:
    (root / name).unlink()
    os.mkfifo(root / name)
    return root / name


@pytest.mark.parametrize("reader", ["read_artifact", "Predictor.load", "cli inspect", "cli verify"])
def test_fifo_manifest_is_refused_without_waiting(golden: qkan_pack.BuildResult, tmp_path: Path,
                                                  reader: str) -> None:
    """Finding 1 (round 2): a FIFO at manifest.json made inspect, verify and load hang."""
    from click.testing import CliRunner

    from qkan_pack.cli import cli

    root = copy_of(golden, tmp_path)
    fifo = _fifo_at(root, "manifest.json")
    calls = {
        "read_artifact": lambda: read_artifact(root),
        "Predictor.load": lambda: Predictor.load(root),
        "cli inspect": lambda: _raise_cli(CliRunner().invoke(cli, ["inspect", str(root)])),
        "cli verify": lambda: _raise_cli(CliRunner().invoke(cli, ["verify", str(root)])),
    }
    error = _call_with_deadline(calls[reader], fifo)
    assert "not a regular file" in str(error), error


def _raise_cli(result: Any) -> None:
    if result.exit_code != 0:
        raise ArtifactError(result.output)


def test_fifo_swapped_in_after_the_layout_walk_is_refused(golden: qkan_pack.BuildResult,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A listed file replaced by a FIFO between the layout check and the read (a race the
    walk cannot see): the descriptor is checked before any byte is read."""
    from qkan_pack.runtime import _artifact

    root = copy_of(golden, tmp_path)
    walk = _artifact._check_layout

    def walk_then_swap(where: Path, manifest: Any) -> None:
        walk(where, manifest)
        _fifo_at(root, WEIGHTS)

    monkeypatch.setattr(_artifact, "_check_layout", walk_then_swap)
    error = _call_with_deadline(lambda: read_artifact(root), root / WEIGHTS)
    assert isinstance(error, ArtifactError) and "not a regular file" in str(error), error


def test_reads_are_bounded_by_the_declared_size(golden: qkan_pack.BuildResult, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that grows after its size was checked is never read past the declared size."""
    from qkan_pack.runtime import _artifact

    root = copy_of(golden, tmp_path)
    declared = (root / WEIGHTS).stat().st_size
    sizes: list[int] = []
    real_read = os.read

    def recording_read(fd: int, count: int) -> bytes:
        sizes.append(count)
        return real_read(fd, count)

    monkeypatch.setattr(_artifact.os, "read", recording_read)
    read_artifact(root)
    assert sizes and max(sizes) <= max(declared + 1, MAX_MANIFEST_BYTES + 1)


# ---------------------------------------------------------------------------
# A manifest missing any field, or holding any other type there: a QkanPackError, never
# KeyError/TypeError/... (round 2, finding 9)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two inputs, a nested dict/tuple/list output, an include and a (fake) kernel set: every
    optional manifest section is present, so every field can be taken away."""
    import dataclasses

    from qkan_pack.builder import write_artifact
    from qkan_pack.format import KernelSet

    out = tmp_path_factory.mktemp("rich")
    built = build(MODELS / "multi_io.py", [{"a": (2, 3), "b": (2, 4)}, {"a": (8, 3), "b": (8, 4)}],
                  output=out / "plain", dtype={"b": "int64"})
    artifact = read_artifact(built.path)
    files = {**artifact.files, "kernels/k/abc/k.bin": b"kernel"}
    manifest = dataclasses.replace(artifact.manifest, kernels=(
        KernelSet(key="k", directory="kernels/k", details={"arch": "sm_90"}),))
    write_artifact(out / "rich", manifest, files)
    return out / "rich"


def json_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += json_paths(item, (*prefix, index))
    return found


def test_every_missing_or_mistyped_field_is_a_qkan_pack_error(rich: Path, tmp_path: Path) -> None:
    import copy

    base = manifest_of(rich)
    work = tmp_path / "work"
    shutil.copytree(rich, work)
    tried = 0
    for path in json_paths(base):
        for replacement in ("<delete>", None, [], {}, "x", 0, -1, True):
            raw = copy.deepcopy(base)
            parent = raw
            for key in path[:-1]:
                parent = parent[key]
            if replacement == "<delete>":
                del parent[path[-1]]
            else:
                parent[path[-1]] = replacement
            write_manifest(work, raw)
            with contextlib.suppress(QkanPackError):
                read_artifact(work)
            tried += 1
    assert tried > 1000  # every field of every section, eight ways each


def test_unlistable_artifact_folder_is_an_artifact_error(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading: a folder that cannot be listed (permissions) raised a bare PermissionError."""
    import errno

    from qkan_pack.runtime import _artifact

    art = build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "art").path
    real = os.scandir

    def denied(path: object) -> object:
        if str(path).endswith("source"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path)

    monkeypatch.setattr(_artifact.os, "scandir", denied)
    with pytest.raises(ArtifactError, match=r"cannot list .*source: Permission denied"):
        read_artifact(art)
