"""Where a build may write: never into or over the artifact or model folder it would break,
glob characters in names, and read-only or permission failures as one line naming the path
(round 2, findings 2, 7 and the sweep part of 9)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import qkan_pack.builder._writer as writer
from qkan_pack import ArtifactError, build, read_artifact
from qkan_pack.cli import cli

from ..conftest import MODELS


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root (files with their bytes, folders as None)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """tmp/model/plain_mlp.py and tmp/art (an artifact built from it)."""
    (tmp_path / "model").mkdir()
    shutil.copy(MODELS / "plain_mlp.py", tmp_path / "model" / "plain_mlp.py")
    build(tmp_path / "model" / "plain_mlp.py", "1x2", output=tmp_path / "art")
    return tmp_path


def run_build(model: Path, output: str, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["build", str(model), "--shapes", "1x2", "-o", output,
                                      *extra])
    return result.exit_code, result.stderr.strip()


# (cwd relative to the workspace, -o, --force?, what the message says)
REFUSED = {
    "-o . --force inside the artifact": ("art", ".", True, "working directory"),
    "-o . inside the artifact": ("art", ".", False, "working directory"),
    "-o .. from the artifact's source folder": ("art/source", "..", True, "working directory"),
    "-o <artifact>/sub": (".", "art/sub", False, "lies inside the artifact"),
    "-o <artifact>/source/deeper --force": (".", "art/source/deeper", True,
                                            "lies inside the artifact"),
    "-o <model folder> --force": (".", "model", True, "model's folder"),
    "-o <folder above the model> --force": ("art", "..", True, "working directory"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsafe_outputs_are_refused_and_nothing_changes(workspace: Path, case: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a .lock file or a nested directory left inside the artifact, which then no
    longer verified (or the model's folder replaced)."""
    cwd, output, force, says = REFUSED[case]
    before = snapshot(workspace)
    monkeypatch.chdir(workspace / cwd)
    code, message = run_build(workspace / "model" / "plain_mlp.py", output,
                              *(["--force"] if force else []))
    assert code == 1, message
    assert says in message and len(message.splitlines()) == 1, message
    assert snapshot(workspace) == before
    read_artifact(workspace / "art")


def test_the_model_folder_is_protected_through_the_python_api(workspace: Path) -> None:
    before = snapshot(workspace)
    for output in (workspace / "model", workspace):
        with pytest.raises(ArtifactError, match="model's folder"):
            build(workspace / "model" / "plain_mlp.py", "1x2", output=output, force=True)
    assert snapshot(workspace) == before


def test_default_output_inside_the_model_folder_still_works(workspace: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace / "model")
    result = CliRunner().invoke(cli, ["build", "plain_mlp.py", "--shapes", "1x2"])
    assert result.exit_code == 0, result.output
    read_artifact(workspace / "model" / "artifacts" / "plain_mlp")


def test_replacing_an_artifact_from_outside_it_still_works(workspace: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    old = read_artifact(workspace / "art").digest
    code, message = run_build(workspace / "model" / "plain_mlp.py", "art", "--force", "--seed", "3")
    assert code == 0, message
    assert read_artifact(workspace / "art").digest != old


# ---------------------------------------------------------------------------
# Glob characters in output names and the sweep of stale partial builds
# ---------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


@pytest.mark.parametrize("name", ["a[1]", "x*", "q?", "[!b]"])
def test_stale_partials_are_swept_whatever_the_name(tmp_path: Path, name: str) -> None:
    """Before: the sweep globbed `.<name>.partial-*`, so `a[1]` never matched its own
    leftovers."""
    leftover = tmp_path / f".{name}.partial-{dead_pid()}-abc"
    leftover.mkdir()
    (leftover / "weights.safetensors").write_bytes(b"half")
    build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / name)
    assert not leftover.exists()
    read_artifact(tmp_path / name)


def test_a_glob_name_never_takes_another_outputs_backup(tmp_path: Path) -> None:
    """Before: building to `mo*el` globbed `.mo*el.old-*`, matched `.model.old-<pid>` (another
    target's backup from a killed swap) and renamed it to `mo*el`; its partials were swept."""
    backup = tmp_path / f".model.old-{dead_pid()}"
    backup.mkdir()
    (backup / "manifest.json").write_text("{}")
    others = tmp_path / f".model.partial-{dead_pid()}-xyz"
    others.mkdir()
    build(MODELS / "plain_mlp.py", "1x2", output=tmp_path / "mo*el")
    assert backup.exists() and others.exists()
    assert (tmp_path / "mo*el" / "weights.safetensors").exists()


# ---------------------------------------------------------------------------
# Read-only file systems and permissions: one line naming the path
# ---------------------------------------------------------------------------


def read_only(path_of_failure: Path):
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path_of_failure))
    return fail


@pytest.mark.parametrize("step", ["mkdir", "lock", "staging"])
def test_read_only_output_is_one_line_naming_the_path(tmp_path: Path, step: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the parent mkdir, the lock file and the staging directory were outside the
    writer's error mapping: a raw OSError from build(), 'unexpected OSError' on the CLI."""
    target = tmp_path / "ro" / "art"
    failing = {"mkdir": (Path, "mkdir"), "lock": (writer, "open"),
               "staging": (writer.tempfile, "mkdtemp")}[step]
    monkeypatch.setattr(*failing, read_only(target.parent), raising=False)
    with pytest.raises(ArtifactError) as info:
        build(MODELS / "plain_mlp.py", "1x2", output=target)
    assert "Read-only file system" in str(info.value) and str(target) in str(info.value)
    monkeypatch.delenv("QKAN_PACK_DEBUG", raising=False)
    code, message = run_build(MODELS / "plain_mlp.py", str(target))
    assert code == 1 and message.splitlines() == [message], message
    assert "Read-only file system" in message and "unexpected" not in message


def test_other_os_errors_are_one_line_on_the_cli(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A permission error anywhere else (here: reading the model file) names the path."""
    monkeypatch.delenv("QKAN_PACK_DEBUG", raising=False)
    model = tmp_path / "m.py"
    model.write_text("def build_model(): pass\n")
    monkeypatch.setattr(Path, "read_bytes", read_only(model))
    code, message = run_build(model, str(tmp_path / "out"))
    assert code == 1 and message == f"Error: cannot access {model}: Read-only file system"
