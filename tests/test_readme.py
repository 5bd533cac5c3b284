"""Every code block of README.md and of each page of docs/ runs, in order, as a reader would
run them: each file's blocks in a workspace of its own (a copy of examples/).

Fences say how: ``python`` and ``bash`` run here (CPU CI), ``python gpu`` and ``bash gpu``
run on a GPU host (``pytest -m gpu``), ``python sign`` and ``bash sign`` need the ``[sign]``
extra, ``python ray`` and ``bash ray`` the ``[serve]`` extra (CI installs both; a GPU host
without them skips those blocks), ``console`` blocks are set-up commands, long-running
servers or cluster commands that CI runs by other means (``make test`` is CI itself),
``text`` is output, trees and diagrams, and ``yaml`` a manifest (Kubernetes). A fence with
no tag fails: every block must say what it is. A python block opening with
``# examples/NAME.py (excerpt)`` shows that file: it must be a verbatim part of it, and is
not run on its own (the blocks that build the file run it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import NamedTuple

import pytest

from .conftest import ROOT

RUNS_HERE = {"python", "bash"}
RUNS_ON_GPU = {"python gpu", "bash gpu"}
NEEDS_EXTRA = {"python sign": "model_signing", "bash sign": "model_signing",
               "python ray": "ray", "bash ray": "ray"}
NOT_RUN = {"console", "text", "yaml"}
KNOWN = RUNS_HERE | RUNS_ON_GPU | set(NEEDS_EXTRA) | NOT_RUN
FENCE = re.compile(r"^(?P<indent> *)```(?P<tag>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```",
                   re.MULTILINE | re.DOTALL)
EXCERPT = re.compile(r"# (?P<path>examples/[\w./-]+\.py) \(excerpt\)\n")
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


class Block(NamedTuple):
    tag: str
    body: str
    line: int


def blocks(document: Path) -> list[Block]:
    text = document.read_text()
    found = []
    for match in FENCE.finditer(text):
        indent = len(match.group("indent"))
        body = "\n".join(line[indent:] for line in match.group("body").splitlines())
        found.append(Block(match.group("tag").strip(), body, text[:match.start()].count("\n") + 1))
    return found


def _shows_a_file(block: Block) -> bool:
    return block.tag.startswith("python") and EXCERPT.match(block.body) is not None


def _name(document: Path) -> str:
    return str(document.relative_to(ROOT))


def _documents_with(tags: set[str]) -> list:
    """The documents holding a block of one of ``tags``, marked ``serve`` where one starts Ray."""
    chosen = []
    for document in DOCUMENTS:
        found = {block.tag for block in blocks(document)}
        if found & tags:
            marks = [pytest.mark.serve] if any(tag.endswith(" ray") for tag in found) else []
            chosen.append(pytest.param(document, marks=marks, id=_name(document)))
    return chosen


@pytest.mark.parametrize("document", DOCUMENTS, ids=_name)
def test_every_block_says_what_it_is(document: Path) -> None:
    unknown = [(block.tag, block.line) for block in blocks(document) if block.tag not in KNOWN]
    assert unknown == [], f"untagged or unknown fences in {_name(document)} (tag, line)"


def test_the_readme_quick_starts_run_on_the_cpu() -> None:
    assert sum(block.tag in RUNS_HERE for block in blocks(ROOT / "README.md")) >= 5


@pytest.mark.parametrize("document", DOCUMENTS, ids=_name)
def test_a_shown_example_file_is_the_real_file(document: Path) -> None:
    for block in filter(_shows_a_file, blocks(document)):
        match = EXCERPT.match(block.body)
        if match:
            shown = block.body[match.end():].strip("\n")
            real = (ROOT / match.group("path")).read_text()
            assert shown in real, f"{_name(document)}:{block.line} is not {match.group('path')}"


def _workspace(tmp_path: Path) -> Path:
    """A reader's checkout: the examples at hand, artifacts written beside them, and
    ``qkan-pack`` and ``python`` on the PATH as this interpreter (a GPU host has no console
    script; exec, so that ``$!`` of a server started in the background is the server)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    tools = tmp_path / ".bin"
    tools.mkdir()
    for name, command in (("qkan-pack", f'"{sys.executable}" -m qkan_pack'),
                          ("python", f'"{sys.executable}"')):
        (tools / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (tools / name).chmod(0o755)
    return tmp_path


def _run(document: Path, block: Block, cwd: Path, env: dict[str, str] | None = None,
         python: str = sys.executable) -> None:
    """Run ``block`` in ``cwd`` (``env``: the whole environment, instead of this checkout's
    sources and ``cwd/.bin`` ahead of the caller's)."""
    if block.tag.startswith("python"):
        command = [python, "-c", block.body]
    else:
        command = ["bash", "-c", "set -euo pipefail\n" + block.body]
    if env is None:
        env = {**os.environ, "QKAN_PACK_PROGRESS": "0",
               "PATH": os.pathsep.join((str(cwd / ".bin"), os.environ.get("PATH", ""))),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                             if p)}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    finally:
        _stop_what_it_left(process.pid)
    assert process.returncode == 0, \
        f"{_name(document)}:{block.line} ({block.tag}) failed:\n{out}\n{err}"


def _stop_what_it_left(group: int, timeout_s: float = 60.0) -> None:
    """A block that failed half-way may leave a server it started in the background: stop
    its process group as Ctrl-C would (a serve drains and stops its Ray), then kill."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(-group, os.WNOHANG)
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("document", _documents_with(RUNS_HERE | set(NEEDS_EXTRA)))
def test_cpu_blocks_run_in_order(document: Path, tmp_path: Path) -> None:
    cwd = _workspace(tmp_path)
    for block in blocks(document):
        if block.tag in RUNS_HERE | set(NEEDS_EXTRA) and not _shows_a_file(block):
            _run(document, block, cwd)


@pytest.mark.gpu
@pytest.mark.parametrize("document", _documents_with(RUNS_ON_GPU))
def test_gpu_blocks_run_after_the_cpu_ones(document: Path, tmp_path: Path) -> None:
    cwd = _workspace(tmp_path)
    runs = RUNS_HERE | RUNS_ON_GPU | {tag for tag, module in NEEDS_EXTRA.items() if find_spec(module)}
    for block in blocks(document):
        if block.tag in runs and not _shows_a_file(block):
            _run(document, block, cwd)
