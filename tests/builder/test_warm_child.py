"""warm's child load without a GPU (slow: inductor's CPU backend compiles C++): what the child
is told on its command line reaches compiled mode as ``PrecompiledExport``, and what it writes
there is what warm reads back to ship."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.builder import _warm
from qkan_pack.runtime import PLAN_FILE, PrecompiledExport

from ..conftest import MODELS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("warm-child") / "plain"
    return build(MODELS / "plain_mlp.py", "1x2,8x2", output=out).path


def test_the_child_writes_its_precompiled_graphs_where_warm_told_it(plain: Path,
                                                                     tmp_path: Path) -> None:
    export = PrecompiledExport(tmp_path / "precompiled")
    _warm._compile_in_child(plain, "cpu", tmp_path, {}, True, export)
    forms, refused = export.read()
    assert refused is None and {PLAN_FILE, "0.bin", "1.bin"} <= set(forms), sorted(forms)


def test_a_child_told_to_make_none_makes_none_and_still_compiles(plain: Path,
                                                                  tmp_path: Path) -> None:
    """warm's fallback after its probe refused the forms: torch.compile's route instead."""
    _warm._compile_in_child(plain, "cpu", tmp_path, {}, True, PrecompiledExport(None))
    assert not (tmp_path / "precompiled").exists()
    assert (tmp_path / "inductor.bin").stat().st_size > 0  # torch.compile's cache artifacts
