"""The writer installs only a manifest the reader takes back as written: anything else is
refused before the target changes (a build never replaces an artifact with one that
``inspect``, ``verify`` and loads refuse)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from qkan_pack import ManifestError, build, read_artifact
from qkan_pack.builder import _writer, write_artifact

from ..conftest import MODELS


@pytest.fixture()
def good(tmp_path: Path) -> tuple[Path, str]:
    result = build(MODELS / "plain_mlp.py", "2x2", output=tmp_path / "art", progress=False)
    return result.path, result.digest


def _intact(path: Path, digest: str) -> None:
    assert read_artifact(path).digest == digest
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_manifest_the_reader_refuses_is_never_installed(good: tuple[Path, str]) -> None:
    path, digest = good
    artifact = read_artifact(path)
    model = dataclasses.replace(artifact.manifest.model, config={"tag": "caf\udce9"})
    refused = dataclasses.replace(artifact.manifest, model=model)
    with pytest.raises(ManifestError, match=r"would be refused by every reader: .*lone surrogate"):
        write_artifact(path, refused, dict(artifact.files), force=True)
    _intact(path, digest)


def test_a_manifest_over_the_readers_limit_is_never_installed(
        good: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    path, digest = good
    artifact = read_artifact(path)
    monkeypatch.setattr(_writer, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(ManifestError, match=r"would be \d+ bytes, more than the 1000 bytes"):
        write_artifact(path, artifact.manifest, dict(artifact.files), force=True)
    _intact(path, digest)


def test_a_manifest_that_reads_back_differently_is_never_installed(
        good: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A field the reader dropped or changed would give the artifact another meaning than
    the one built: refused as a bug, before anything is written."""
    path, digest = good
    artifact = read_artifact(path)
    real = _writer.parse_manifest
    monkeypatch.setattr(_writer, "parse_manifest", lambda data: dataclasses.replace(
        real(data), reference_device="cuda"))
    with pytest.raises(ManifestError, match="reads back differently"):
        write_artifact(path, artifact.manifest, dict(artifact.files), force=True)
    _intact(path, digest)
