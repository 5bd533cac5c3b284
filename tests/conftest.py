"""Shared fixtures: artifacts built into tmp dirs, and the GPU marker policy.

GPU tests are skipped where CUDA is absent, and fail instead of skipping when
QKAN_PACK_REQUIRE_GPU=1 (set on the GPU host so a run cannot pass by skipping).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "gpu" not in item.keywords:
        return
    import torch

    if torch.cuda.is_available():
        return
    if os.environ.get("QKAN_PACK_REQUIRE_GPU") == "1":
        pytest.fail("QKAN_PACK_REQUIRE_GPU=1 but CUDA is not available", pytrace=False)
    pytest.skip("needs CUDA (QKAN_PACK_REQUIRE_GPU=1 turns this skip into a failure)")


@pytest.fixture(scope="session")
def mlp_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/qkan_mlp.py built for 1x2 and 64x2."""
    from qkan_pack import build

    out = tmp_path_factory.mktemp("mlp") / "qkan_mlp"
    build(EXAMPLES / "qkan_mlp.py", "1x2,64x2", output=out)
    return out


@pytest.fixture(scope="session")
def gpt_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small examples/hqkan_gpt.py (tied LM head, int64 tokens) for 1x16 and 4x16."""
    from qkan_pack import build

    out = tmp_path_factory.mktemp("gpt") / "hqkan_gpt"
    build(EXAMPLES / "hqkan_gpt.py", "1x16,4x16", output=out, dtype="int64",
          config={"block_size": 16, "n_embd": 32, "hidden": 16})
    return out


def forget_imports(path: Path) -> None:
    """Drop qkan-pack's cached import of an artifact's sources, so that the next load imports
    them again (as if another process had built the artifact)."""
    import sys

    from qkan_pack.runtime import content_name, read_artifact

    artifact = read_artifact(path)
    info = artifact.manifest.model
    name = content_name({p: artifact.files[p] for p in (info.source, *info.includes)})
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
