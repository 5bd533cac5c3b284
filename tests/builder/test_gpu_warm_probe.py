"""warm --compiled on a GPU when its fresh-process probe of the precompiled graphs fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkan_pack import build
from qkan_pack.builder import _warm, warm
from qkan_pack.runtime import read_artifact

from ..conftest import EXAMPLES
from ..runtime.test_gpu_compiled import QKAN_CONFIG, _fresh

pytestmark = pytest.mark.gpu


@pytest.fixture
def qkan64(tmp_path: Path) -> Path:
    return build(EXAMPLES / "qkan_mlp.py", "1x64,32x64", output=tmp_path / "qkan64",
                 config=QKAN_CONFIG).path


def test_a_probe_that_crashes_ships_inductor_cache_instead(qkan64: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A precompiled route that crashes a fresh process (as AOTInductor packages have on
    torch 2.11) is detected by warm's probe: the forms are dropped, the reason recorded,
    inductor's cache shipped, and a load asking for it (``compiled="shipped"``) serves through
    torch.compile, saying why; a default load serves the default graphs."""
    monkeypatch.setattr(_warm, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    result = warm(qkan64, "cuda", compiled=True)
    (kernel_set,) = read_artifact(qkan64).manifest.kernels
    assert "exited with -11" in kernel_set.details["precompiled_refused"], kernel_set.details
    assert "precompiled" not in kernel_set.details and "inductor" in kernel_set.details
    assert result.compiled.startswith("no precompiled graphs (a fresh process loading them "
                                      "exited with -11"), result
    assert not [n for n in read_artifact(qkan64).files if "-precompiled/" in n]
    # the default mode leaves inductor's cache alone (torch.compile traces, a slower start)
    default = _fresh(qkan64, tmp_path / "default")
    assert (default["compiled"], default["warnings"], default["traced"]) == ("off", [], 0), default
    seen = _fresh(qkan64, tmp_path / "fresh", compiled="shipped")
    assert seen["compiled"].startswith("inductor") and "shipped inductor cache" in seen["compiled"], seen
    assert seen["inductor"].get("fxgraph_cache_miss", 0) == 0, seen["inductor"]
    assert any("warm refused them" in w for w in seen["warnings"]), seen["warnings"]
    assert seen["worst"] < 1e-4
