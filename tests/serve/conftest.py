"""The serve tests' artifact: examples/qkan_mlp.py at shapes 1x2,8x2 (single rows batch into
the 8x2 graph), built once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import EXAMPLES


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from qkan_pack import build

    out = tmp_path_factory.mktemp("serve") / "qkan_mlp"
    build(EXAMPLES / "qkan_mlp.py", "1x2,8x2", output=out)
    return out
