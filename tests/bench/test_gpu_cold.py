"""``qkan-pack bench --cold`` on a GPU: the CUDA stages, shipped kernels, the steady-state
figures, and that serving a QKAN with the flash solver still never runs sympy or pyplot."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.bench import ColdSettings, render_cold, run_cold
from qkan_pack.builder import warm

from ..conftest import EXAMPLES

pytestmark = pytest.mark.gpu


def test_gpu_cold_start_with_shipped_kernels(tmp_path: Path) -> None:
    path = build(EXAMPLES / "qkan_mlp.py", "1x64,8x64", output=tmp_path / "q64",
                 config={"width": [64, 64, 64], "reps": 3}).path
    warm(path, "cuda")
    report = run_cold(path, "cuda", settings=ColdSettings(runs=1, calls=5), progress=False)
    print("\n" + render_cold(report))
    summary = report["variants"]["predictor"]
    assert summary["ok_runs"] == 1, summary["errors"]
    for stage in ("cuda init", "first forward", "capture", "self-test", "first call"):
        assert summary["stages_s"][stage] > 0, stage
    assert "using shipped kernels" in summary["load"]["kernel_cache"]
    assert "0 compiled here" in summary["load"]["kernel_cache"]
    assert summary["modules"]["sympy"] == "absent"
    assert summary["modules"]["matplotlib.pyplot"] in ("deferred", "absent")
    assert summary["modules"]["triton"] == "imported"
    steady = summary["steady"]
    assert steady["gpu_us"] > 0 and steady["bare_replay_us"] > 0 and steady["predictor_us"] > 0
