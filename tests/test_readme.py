"""Every code block of README.md runs, in order, as a reader would run them.

Fences say how: ``python`` and ``bash`` run here (CPU CI), ``python gpu`` and ``bash gpu``
run on a GPU host (``pytest -m gpu``), ``python sign`` and ``bash sign`` need the ``[sign]``
extra, ``bash ray`` the ``[serve]`` extra (CI installs both; a GPU host without them skips
those blocks), ``python serve`` needs Ray Serve running (the serve
tests cover it), ``console`` blocks are set-up commands or long-running servers that CI runs
by other means (``make test`` is CI itself), and ``text`` is output, trees and diagrams.
A fence with no tag fails: every block must say what it is.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from .conftest import ROOT

RUNS_HERE = {"python", "bash"}
RUNS_ON_GPU = {"python gpu", "bash gpu"}
NEEDS_EXTRA = {"python sign": "model_signing", "bash sign": "model_signing", "bash ray": "ray"}
NOT_RUN = {"console", "text", "python serve"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<tag>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```",
                   re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str, int]]:
    text = (ROOT / "README.md").read_text()
    found = []
    for match in FENCE.finditer(text):
        indent = len(match.group("indent"))
        body = "\n".join(line[indent:] for line in match.group("body").splitlines())
        found.append((match.group("tag").strip(), body, text[:match.start()].count("\n") + 1))
    return found


def test_every_block_says_what_it_is() -> None:
    tags = [(tag, line) for tag, _, line in blocks()]
    known = RUNS_HERE | RUNS_ON_GPU | set(NEEDS_EXTRA) | NOT_RUN
    unknown = [(tag, line) for tag, line in tags if tag not in known]
    assert unknown == [], "untagged or unknown README fences (tag, line)"
    assert sum(tag in RUNS_HERE for tag, _ in tags) >= 5


def _workspace(tmp_path: Path) -> Path:
    """A reader's checkout: the examples at hand, artifacts written beside them."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


def _run(tag: str, body: str, line: int, cwd: Path) -> None:
    if tag.startswith("python"):
        command = [sys.executable, "-c", body]
    else:  # no console script on a GPU host: the module is the same CLI
        prelude = f'qkan-pack() {{ "{sys.executable}" -m qkan_pack "$@"; }}\nset -euo pipefail\n'
        command = ["bash", "-c", prelude + body]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**_environment(), "QKAN_PACK_PROGRESS": "0"})
    assert done.returncode == 0, f"README.md:{line} ({tag}) failed:\n{done.stdout}\n{done.stderr}"


def _environment() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.mark.slow
def test_cpu_blocks_run_in_order(tmp_path: Path) -> None:
    cwd = _workspace(tmp_path)
    for tag, body, line in blocks():
        if tag in RUNS_HERE | set(NEEDS_EXTRA):
            _run(tag, body, line, cwd)


@pytest.mark.gpu
def test_gpu_blocks_run_after_the_cpu_ones(tmp_path: Path) -> None:
    cwd = _workspace(tmp_path)
    runs = RUNS_HERE | RUNS_ON_GPU | {tag for tag, module in NEEDS_EXTRA.items() if find_spec(module)}
    for tag, body, line in blocks():
        if tag in runs:
            _run(tag, body, line, cwd)


def test_the_error_tree_names_every_error_and_its_parent() -> None:
    """README's error tree is the documentation of errors.py: each class appears, under its
    own parent (indentation says which)."""
    import inspect

    from qkan_pack import errors

    text = (ROOT / "README.md").read_text()
    tree = text[text.index("QkanPackError\n"):text.index("```", text.index("QkanPackError\n"))]
    depth: dict[str, str | None] = {}
    parents: list[str] = []
    for line in tree.splitlines():
        match = re.match(r"^([│├└─ ]*)(\w+Error)\b", line)
        if match:
            level = len(match.group(1)) // 4
            parents = [*parents[:level], match.group(2)]
            depth[match.group(2)] = parents[-2] if level else None
    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, errors.QkanPackError)}
    assert set(depth) == set(classes)
    for name, cls in classes.items():
        parent = next((b.__name__ for b in cls.__bases__ if issubclass(b, errors.QkanPackError)),
                      None)
        assert depth[name] == parent, name
