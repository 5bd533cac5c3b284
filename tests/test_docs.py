"""The documentation stays a manual: short README, no commit ids (histories live in
benchmarks/results/), and the pages that document code (the error tree, the command line)
name everything the code has. Its code blocks run in test_readme.py; `make test` builds the
site strictly (broken links and anchors, pages missing from the navigation)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import click
import pytest

from .conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "mkdocs.yml",
         *sorted((ROOT / "docs").rglob("*.md"))]
#: A standalone word of 7 to 40 hex digits with a digit and a letter: a commit id. A digest
#: written as ``sha256:…`` is preceded by a colon, and a full sha256 is 64 digits long.
COMMIT_ID = re.compile(r"(?<![\w:])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?!\w)")


def test_the_commit_id_pattern() -> None:
    found = COMMIT_ID.findall("fixed at d4e2811, see serve-at-51c88ff.txt; sha256:9f2c0a1b3d "
                              "and 07f64ce5e8dc7028bd43ba41c6af50bef0d47bf77808d78f298b09f27d0b069c "
                              "are digests; deadbeef, 2026-12-05, 1e308, 1234567 are not ids")
    assert found == ["d4e2811", "51c88ff"]


def test_the_readme_is_a_guide_not_a_manual() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_names_a_commit(page: Path) -> None:
    found = [(number, match.group()) for number, line in enumerate(page.read_text().splitlines(), 1)
             for match in COMMIT_ID.finditer(line)]
    assert found == [], (f"{page.relative_to(ROOT)} names commits (line, id): {found}; say what "
                         "is true now, and keep histories in benchmarks/results/")


def test_the_error_tree_names_every_error_and_its_parent() -> None:
    """docs/errors.md's tree is the documentation of errors.py: each class appears, under its
    own parent (indentation says which)."""
    from qkan_pack import errors

    text = (ROOT / "docs" / "errors.md").read_text()
    tree = text[text.index("QkanPackError\n"):text.index("```", text.index("QkanPackError\n"))]
    parent_of: dict[str, str | None] = {}
    parents: list[str] = []
    for line in tree.splitlines():
        match = re.match(r"^([│├└─ ]*)(\w+Error)\b", line)
        if match:
            level = len(match.group(1)) // 4
            parents = [*parents[:level], match.group(2)]
            parent_of[match.group(2)] = parents[-2] if level else None
    classes = {name: cls for name, cls in vars(errors).items()
               if inspect.isclass(cls) and issubclass(cls, errors.QkanPackError)}
    assert set(parent_of) == set(classes)
    for name, cls in classes.items():
        parent = next((b.__name__ for b in cls.__bases__ if issubclass(b, errors.QkanPackError)),
                      None)
        assert parent_of[name] == parent, name


def test_the_command_line_page_names_every_command_and_option() -> None:
    from qkan_pack.cli import cli

    text = (ROOT / "docs" / "cli.md").read_text()
    missing = [f"## {name}" for name in cli.commands if f"\n## {name}\n" not in text]
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                option = max(param.opts, key=len)
                if f"`{option}" not in text and f"{option}`" not in text:
                    missing.append(f"{name} {option}")
    assert missing == [], f"docs/cli.md does not document: {missing}"


#: A repository path in a code span (``tests/serve/test_wire.py``, ``qkan_pack/format/_old/``),
#: or a module path inside the package (``runtime/_load.py``, ``qkan_pack/_session``); patterns
#: with ``*``, ``…`` or placeholders are not paths.
REPO_PATH = re.compile(r"`((?:benchmarks|tests|examples|qkan_pack|docs)/[^`\s*…<>{}]+?)(?:::[^`]*)?`")
MODULE_PATH = re.compile(r"`((?:runtime|serve|builder|format|bench|predict)/_[\w/]+\.py)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_file_a_page_names_exists(page: Path) -> None:
    text = page.read_text()
    paths = [*REPO_PATH.findall(text), *(f"qkan_pack/{path}" for path in MODULE_PATH.findall(text))]
    missing = [path for path in paths
               if not any((ROOT / candidate).exists()
                          for candidate in (path.rstrip("/"), path + ".py"))]
    assert missing == [], f"{page.relative_to(ROOT)} names files that do not exist: {missing}"
