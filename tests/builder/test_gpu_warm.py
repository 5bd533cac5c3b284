"""Shipped GPU kernels (``qkan-pack warm``) on a real GPU: used at load, never written back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.builder import warm
from qkan_pack.runtime import read_artifact

from ..conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.gpu

LOAD_IN_FRESH_PROCESS = """
import json, sys, time
started = time.perf_counter()
from qkan_pack import Predictor
import torch
p = Predictor.load(sys.argv[1], device="cuda", kernels=sys.argv[2])
x = torch.randn(1, 64, device="cuda")
p(x); torch.cuda.synchronize()
print(json.dumps({"ready": p.report.load_to_ready_seconds, "cache": p.report.kernel_cache,
                  "stages": p.report.stages}))
"""


def _load_fresh(path: Path, cache: Path, kernels: str = "auto") -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT) + os.pathsep
           + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", LOAD_IN_FRESH_PROCESS, str(path), kernels],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("warm") / "qkan64"
    shapes = ",".join(f"{b}x64" for b in (1, 2, 4, 8, 16, 32, 64, 128))
    build(EXAMPLES / "qkan_mlp.py", shapes, output=path,
          config={"width": [64, 64, 64], "reps": 3})
    result = warm(path, "cuda")
    assert result.files > 0
    return path


def test_warm_records_a_verified_kernel_set(warmed: Path) -> None:
    artifact = read_artifact(warmed)
    (kernel_set,) = artifact.manifest.kernels
    assert kernel_set.details["arch"].startswith("sm_")
    shipped = [n for n in artifact.files if n.startswith(kernel_set.directory + "/")]
    assert any(n.endswith(".cubin") for n in shipped)


def test_fresh_process_uses_shipped_kernels_without_writing_anywhere(warmed: Path,
                                                                     tmp_path: Path) -> None:
    user_cache = tmp_path / "user-cache"
    user_cache.mkdir()
    digest = read_artifact(warmed).digest
    result = _load_fresh(warmed, user_cache)
    assert "using shipped kernels" in result["cache"], result
    assert "0 compiled here" in result["cache"], result
    assert list(user_cache.iterdir()) == []  # the user's own cache was not touched
    assert read_artifact(warmed).digest == digest  # nor the artifact
    cold = _load_fresh(warmed, tmp_path / "empty-cache", kernels="off")
    print(f"load-to-ready with shipped kernels {result['ready']:.3f}s, "
          f"compiling from an empty cache {cold['ready']:.3f}s")
    assert result["ready"] < cold["ready"]


def test_rewarming_replaces_the_set_for_the_same_key(warmed: Path) -> None:
    before = read_artifact(warmed).manifest.kernels
    warm(warmed, "cuda")
    after = read_artifact(warmed).manifest.kernels
    assert [k.key for k in after] == [k.key for k in before]
