"""What users install, tested as they get it: the wheel that ``make test`` builds (``python -m
build``: the sdist, then the wheel from the sdist) installed, not editable, into a fresh venv
with nothing but its own dependencies and the pinned torch, and README's quick start run from
that venv in a directory outside the checkout, with the model file written from README's own
listing. The checkout's sources are on no path there, so a file the wheel lacks or a
dependency it does not declare fails here, not on a user's host.

``make test`` names that venv in ``QKAN_PACK_WHEEL_VENV``; without it the tests are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from .conftest import ROOT
from .test_readme import EXCERPT, RUNS_HERE, _run, _shows_a_file, blocks

VENV_ENV = "QKAN_PACK_WHEEL_VENV"
#: The dependencies a bare ``pip install qkan-pack`` brings (README's minimal install).
CORE = {"torch", "safetensors", "click", "numpy", "tqdm", "pyelftools"}

INSTALLED = """
import json, sys
from importlib import metadata
from pathlib import Path
import qkan_pack
distribution = metadata.distribution("qkan-pack")
print(json.dumps({
    "package": str(Path(qkan_pack.__file__).parent), "version": distribution.version,
    "requires": distribution.requires or [], "direct_url": distribution.read_text("direct_url.json"),
    "path": sys.path}))
"""


@pytest.fixture(scope="module")
def venv() -> Path:
    named = os.environ.get(VENV_ENV)
    if not named:
        pytest.skip(f"{VENV_ENV} is not set: `make test` builds the wheel, installs it into a "
                    "fresh venv and names that venv there")
    python = Path(named) / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"{VENV_ENV}={named} has no bin/python", pytrace=False)
    return Path(named)


def _environment(venv: Path) -> dict[str, str]:
    """A user's shell with the venv activated: its bin first, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "VIRTUAL_ENV": str(venv), "QKAN_PACK_PROGRESS": "0",
            "PATH": os.pathsep.join((str(venv / "bin"), env.get("PATH", "")))}


def test_the_wheel_installs_this_whole_package_not_editable(venv: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", INSTALLED], cwd=tmp_path,
                          env=_environment(venv), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    installed = Path(seen["package"])
    assert installed.is_relative_to(venv), installed
    assert ROOT not in [Path(p).resolve() for p in seen["path"] if p], seen["path"]
    assert "editable" not in json.loads(seen["direct_url"] or "{}").get("dir_info", {})

    def files(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}

    shipped, here = files(installed), files(ROOT / "qkan_pack")
    assert sorted(set(here) - set(shipped)) == [], "files of the package missing from the wheel"
    assert sorted(set(shipped) - set(here)) == [], "files in the wheel that the checkout lacks"
    assert [name for name in here if shipped[name] != here[name]] == [], "a stale wheel"
    assert "py.typed" in shipped and "format/_old/v1.py" in shipped
    declared = [Requirement(text) for text in seen["requires"]]
    assert {r.name for r in declared if r.marker is None} == CORE, seen["requires"]
    checked = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], cwd=tmp_path,
                             env=_environment(venv), capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_readme_quick_start_runs_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    """README's quick start as a new user follows it: the model file from its listing, then
    each command and snippet, in a directory of their own."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    start = text.index("\n## Quick start")
    end = text.index("\n## ", start + 1)
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1
    steps = [block for block in blocks(readme) if first <= block.line <= last]
    listings = [block for block in steps if _shows_a_file(block)]
    assert listings, "the quick start shows no model file"
    for listing in listings:
        match = EXCERPT.match(listing.body)
        assert match is not None
        (tmp_path / match.group("path")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / match.group("path")).write_text(listing.body[match.end():])
    ran = 0
    for block in steps:
        if block.tag in RUNS_HERE and not _shows_a_file(block):
            _run(readme, block, tmp_path, env=_environment(venv),
                 python=str(venv / "bin" / "python"))
            ran += 1
    assert ran >= 2, "the quick start runs nothing here"
