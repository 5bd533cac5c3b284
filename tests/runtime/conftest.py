"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Arm the sentinel model's trace (``tests/models/sentinel_model.py``), and forget cached
    imports so a load would execute the source again: a refused artifact leaves no file."""
    path = tmp_path / "sentinel.log"
    monkeypatch.setenv("QKAN_PACK_SENTINEL", str(path))
    for name in [n for n in sys.modules if n.startswith("qkan_pack_model_")]:
        monkeypatch.delitem(sys.modules, name)
    return path
