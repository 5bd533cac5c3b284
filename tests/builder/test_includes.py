"""Modules imported from beside the model file must be packed (``--include``): a build that
found one only because the model's folder was on ``sys.path`` would make an artifact no load
can import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.errors import ModelSourceError


def _model_beside_helper(folder: Path, helper: str) -> Path:
    (folder / f"{helper}.py").write_text("SCALE = 3.0\n")
    model = folder / "model.py"
    model.write_text(
        f"import torch\nimport {helper}\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        f"    bound = {helper}.SCALE\n"
        "    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Hardtanh(-bound, bound))\n")
    return model


def test_a_neighbour_found_on_sys_path_is_refused_naming_the_include(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model_beside_helper(tmp_path, "neighbour_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelSourceError, match=r"build with --include neighbour_a\.py"):
        build(model, "1x2", output=tmp_path / "art", progress=False)
    assert not (tmp_path / "art").exists()
    sys.modules.pop("neighbour_a", None)


def test_the_same_model_builds_with_the_include(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model_beside_helper(tmp_path, "neighbour_b")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = build(model, "1x2", output=tmp_path / "art", includes=["neighbour_b.py"],
                   progress=False)
    assert "source/neighbour_b.py" in result.manifest.files
    sys.modules.pop("neighbour_b", None)


def test_python_m_from_the_models_folder_is_refused_too(tmp_path: Path) -> None:
    """``python -m`` puts the working directory on ``sys.path``: the neighbour imports at
    build, and the artifact would lack it."""
    _model_beside_helper(tmp_path, "neighbour_c")
    done = subprocess.run([sys.executable, "-m", "qkan_pack", "build", "model.py", "--shapes",
                           "1x2", "-o", "art"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert "--include neighbour_c.py" in done.stderr
    assert not (tmp_path / "art").exists()
