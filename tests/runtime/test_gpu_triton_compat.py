"""Triton's installation key on a real Triton: rebuilt exactly, and a fresh process loading a
warmed artifact never hashes Triton (and still finds every shipped kernel)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.builder import warm
from qkan_pack.runtime import read_artifact, record_installation
from qkan_pack.runtime._triton_compat import vouched_key

from ..conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.gpu

FRESH = """
import json, sys
import torch
from qkan_pack import Predictor
from triton.runtime import cache
p = Predictor.load(sys.argv[1], device="cuda")
p(torch.randn(1, 64, device="cuda")); torch.cuda.synchronize()
print(json.dumps({"hashed": cache.triton_key.cache_info().currsize, "cache": p.report.kernel_cache}))
"""


def test_the_key_is_rebuilt_exactly_from_this_installation() -> None:
    import triton
    from triton.runtime import cache

    record = record_installation()
    assert record is not None, "libtriton has no GNU build ID here"
    root = Path(cache.__file__).resolve().parent.parent
    assert vouched_key(record, root, triton.__version__) == cache.triton_key()


def test_a_fresh_load_with_shipped_kernels_never_hashes_triton(tmp_path: Path) -> None:
    path = build(EXAMPLES / "qkan_mlp.py", "1x64,8x64", output=tmp_path / "q64",
                 config={"width": [64, 64, 64], "reps": 3}).path
    warm(path, "cuda")
    (kernel_set,) = read_artifact(path).manifest.kernels
    assert "triton_key" in kernel_set.details
    (tmp_path / "cache").mkdir()
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", FRESH, str(path)], env=env, capture_output=True,
                          text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hashed"] == 0, seen  # triton_key() never ran: the shipped record answered
    assert "0 compiled here" in seen["cache"], seen  # and every shipped kernel was found


def test_verify_says_plainly_when_this_triton_is_outside_the_supported_range(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shipped kernels a release refuses: ``verify`` shows the warning naming the release and
    the range (the installed Triton taken out of the range for the test)."""
    import triton
    from click.testing import CliRunner

    from qkan_pack.cli import cli
    from qkan_pack.runtime import _triton_compat

    path = build(EXAMPLES / "qkan_mlp.py", "1x2", output=tmp_path / "q").path
    warm(path, "cuda")
    monkeypatch.setattr(_triton_compat, "SUPPORTED",
                        dataclasses.replace(_triton_compat.SUPPORTED, low=(3, 0), high=(3, 1)))
    result = CliRunner().invoke(cli, ["verify", str(path), "--device", "cuda"])
    assert result.exit_code == 0, result.output
    said = (f"shipped kernels not used: Triton {triton.__version__} is outside the supported "
            "range 3.0.x; kernels are compiled at load instead")
    assert f"kernel cache: {said}" in result.output and f"warning: {said}" in result.output
