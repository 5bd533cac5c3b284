"""Crash safety of the artifact writer: SIGKILL at every step of a build, and a full disk.

Each run forks a child from this (already imported) process, arms a hook that SIGKILLs the
child at the Nth filesystem step of ``write_artifact`` (before/after each file write, in
the middle of a write, before/after each fsync, rename, exchange and cleanup), and lets
it build. Afterwards the target must be either absent, the old artifact byte for byte, or
the complete new one; a partial artifact must never load.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import qkan_pack.builder._writer as artifact_module
from qkan_pack import ArtifactError, Predictor, build, read_artifact

from ..conftest import EXAMPLES

pytestmark = pytest.mark.slow

MODEL = EXAMPLES / "qkan_mlp.py"
SHAPES = "1x2,4x2"
OLD_SEED, NEW_SEED = 0, 1  # different reference inputs: old and new artifacts differ


class Hook:
    """Counts filesystem steps; ``hit`` is true at the step where the child must die."""

    def __init__(self, kill_at: int) -> None:
        self.kill_at = kill_at
        self.steps: list[str] = []

    def hit(self, label: str) -> bool:
        self.steps.append(label)
        return len(self.steps) == self.kill_at


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(hook: Hook, patch: Callable[[Any, str, Any], None], *, exchange: bool = True) -> None:
    """Wrap write_artifact's filesystem steps with kill points (``patch`` sets attributes)."""
    real_write, real_fsync = artifact_module._write_file, os.fsync
    real_rename, real_rmtree, real_exchange = os.rename, shutil.rmtree, artifact_module._exchange

    def write(path: Path, data: bytes) -> None:
        if hook.hit(f"write {path.name}"):
            die()
        if hook.hit(f"torn write {path.name}"):  # half the bytes on disk, then death
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data[: len(data) // 2])
                handle.flush()
                real_fsync(handle.fileno())
            die()
        real_write(path, data)
        if hook.hit(f"wrote {path.name}"):
            die()

    def wrap(real: Callable[..., Any], label: str) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if hook.hit(f"{label} before"):
                die()
            result = real(*args, **kwargs)
            if hook.hit(f"{label} after"):
                die()
            return result
        return step

    patch(artifact_module, "_write_file", write)
    patch(os, "fsync", wrap(real_fsync, "fsync"))
    patch(os, "rename", wrap(real_rename, "rename"))
    patch(shutil, "rmtree", wrap(real_rmtree, "rmtree"))
    patch(artifact_module, "_exchange",
          wrap(real_exchange if exchange else (lambda a, b: False), "exchange"))


def build_new(target: Path, *, force: bool) -> None:
    build(MODEL, SHAPES, output=target, seed=NEW_SEED, force=force, progress=False)


def child(kill_at: int, target: Path, force: bool, exchange: bool) -> None:
    import torch

    torch.set_num_threads(1)  # no OpenMP pool after fork
    install(Hook(kill_at), setattr, exchange=exchange)
    build_new(target, force=force)


def run_killed(kill_at: int, target: Path, *, force: bool, exchange: bool = True) -> int:
    process = multiprocessing.get_context("fork").Process(
        target=child, args=(kill_at, target, force, exchange))
    process.start()
    process.join(60)
    if process.is_alive():
        process.kill()
        pytest.fail(f"build child hung at kill point {kill_at}")
    return process.exitcode


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def steps_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, force: bool,
             exchange: bool = True) -> tuple[list[str], dict[str, bytes]]:
    """Dry run in this process: the step sequence, and the complete new artifact's files."""
    hook = Hook(kill_at=0)
    target = tmp_path / "dry" / "art"
    if force:
        build(MODEL, SHAPES, output=target, seed=OLD_SEED)
    with monkeypatch.context() as patched:
        install(hook, patched.setattr, exchange=exchange)
        build_new(target, force=force)
    new = snapshot(target)
    new.pop("manifest.json")  # holds the creation time; every other byte is deterministic
    return hook.steps, new


@pytest.fixture(scope="module")
def old_artifact(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    path = tmp_path_factory.mktemp("old") / "art"
    build(MODEL, SHAPES, output=path, seed=OLD_SEED)
    return path, snapshot(path)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def assert_complete_new(target: Path, new_files: dict[str, bytes]) -> None:
    files = snapshot(target)
    files.pop("manifest.json")
    assert files == new_files
    read_artifact(target)
    with Predictor.load(target) as predictor:
        assert predictor.manifest.shapes[0].inputs == (("x", (1, 2)),)


def outcome_after_kill(target: Path, old: dict[str, bytes] | None,
                       new_files: dict[str, bytes]) -> str:
    """Classify what a killed build left at the target; fail on anything partial."""
    if not target.exists():
        assert old is None, "the existing artifact disappeared"
        with pytest.raises(ArtifactError):
            read_artifact(target)
        return "absent"
    if old is not None and snapshot(target) == old:
        with Predictor.load(target):
            pass
        return "old intact"
    assert_complete_new(target, new_files)
    return "new complete"


def test_kill_points_fresh_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps, new_files = steps_of(tmp_path, monkeypatch, force=False)
    assert len(steps) >= 20, steps
    outcomes = []
    for kill_at in range(1, len(steps) + 1):
        target = tmp_path / f"k{kill_at}" / "art"
        target.parent.mkdir()
        assert run_killed(kill_at, target, force=False) == -signal.SIGKILL, steps[kill_at - 1]
        outcomes.append(outcome_after_kill(target, None, new_files))
        build_new(target, force=target.exists())  # the next build sweeps what the dead one left
        assert_complete_new(target, new_files)
        assert leftovers(target.parent) == []
    print(f"fresh target: {len(steps)} kill points survived: {sorted(set(outcomes))}")
    assert outcomes.count("absent") >= len(steps) - 3 and outcomes[-1] == "new complete"


def test_kill_points_force_over_existing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         old_artifact: tuple[Path, dict[str, bytes]]) -> None:
    old_path, old = old_artifact
    steps, new_files = steps_of(tmp_path, monkeypatch, force=True)
    assert any(s.startswith("exchange") for s in steps) and len(steps) >= 20, steps
    outcomes = []
    for kill_at in range(1, len(steps) + 1):
        target = tmp_path / f"k{kill_at}" / "art"
        shutil.copytree(old_path, target)
        assert run_killed(kill_at, target, force=True) == -signal.SIGKILL, steps[kill_at - 1]
        outcomes.append(outcome_after_kill(target, old, new_files))
        build_new(target, force=True)
        assert_complete_new(target, new_files)
        assert leftovers(target.parent) == []
    print(f"--force over existing: {len(steps)} kill points survived: {sorted(set(outcomes))}")
    assert "old intact" in outcomes and "new complete" in outcomes


def test_kill_points_force_without_rename_exchange(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        old_artifact: tuple[Path, dict[str, bytes]]) -> None:
    """Where renameat2(RENAME_EXCHANGE) is missing the swap takes two renames. A kill between
    them leaves the old artifact moved aside; the next build puts it back, byte for byte."""
    old_path, old = old_artifact
    steps, new_files = steps_of(tmp_path, monkeypatch, force=True, exchange=False)
    outcomes = []
    for kill_at in range(1, len(steps) + 1):
        target = tmp_path / f"k{kill_at}" / "art"
        shutil.copytree(old_path, target)
        assert run_killed(kill_at, target, force=True, exchange=False) == -signal.SIGKILL
        if not target.exists():
            backups = [p for p in target.parent.iterdir() if ".old-" in p.name]
            assert len(backups) == 1 and snapshot(backups[0]) == old
            with pytest.raises(ArtifactError, match="already exists"):
                build_new(target, force=False)  # sweeping restores it, so no --force: refused
            outcomes.append("moved aside, restored")
            assert snapshot(target) == old
        else:
            outcomes.append(outcome_after_kill(target, old, new_files))
        build_new(target, force=True)
        assert_complete_new(target, new_files)
        assert leftovers(target.parent) == []
    print(f"fallback swap: {len(steps)} kill points survived: {sorted(set(outcomes))}")
    assert "moved aside, restored" in outcomes


# ---------------------------------------------------------------------------
# A full disk
# ---------------------------------------------------------------------------


def no_space_at(call: int, *, torn: bool) -> Callable[[Path, bytes], None]:
    real = artifact_module._write_file
    calls = [0]

    def write(path: Path, data: bytes) -> None:
        calls[0] += 1
        if calls[0] == call:
            if torn:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[: len(data) // 3])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data)

    return write


@pytest.mark.parametrize("existing", [False, True])
@pytest.mark.parametrize("call", [1, 2, 3, 4, 5])
def test_disk_full_mid_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             old_artifact: tuple[Path, dict[str, bytes]], call: int,
                             existing: bool) -> None:
    old_path, old = old_artifact
    target = tmp_path / "out" / "art"
    target.parent.mkdir()
    if existing:
        shutil.copytree(old_path, target)
    monkeypatch.setattr(artifact_module, "_write_file", no_space_at(call, torn=call % 2 == 1))
    with pytest.raises(ArtifactError, match="No space left on device") as info:
        build_new(target, force=existing)
    assert isinstance(info.value, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert leftovers(target.parent) == []  # the staging directory is gone
    if existing:
        assert snapshot(target) == old
        with Predictor.load(target):
            pass
    else:
        assert not target.exists()


def test_disk_full_at_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            old_artifact: tuple[Path, dict[str, bytes]]) -> None:
    old_path, old = old_artifact
    target = tmp_path / "art"
    shutil.copytree(old_path, target)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ArtifactError, match="No space left on device"):
        build_new(target, force=True)
    monkeypatch.undo()
    assert snapshot(target) == old and leftovers(tmp_path) == []


def test_disk_full_is_one_line_on_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from qkan_pack.cli import cli

    monkeypatch.delenv("QKAN_PACK_DEBUG", raising=False)
    monkeypatch.setattr(artifact_module, "_write_file", no_space_at(2, torn=True))
    result = CliRunner().invoke(cli, ["build", str(MODEL), "--shapes", SHAPES, "-o",
                                      str(tmp_path / "art")])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: cannot write artifact {tmp_path / 'art'}: No space left on device; free space "
        "and build again"]
    assert not (tmp_path / "art").exists() and leftovers(tmp_path) == []
