"""Compiled mode without a GPU: options, the fallback when nothing is shipped, and (slow:
inductor's CPU backend compiles C++ with gcc) compiled outputs against eager ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qkan_pack import LoadOptions, Predictor, build
from qkan_pack.errors import LoadOptionError
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import MODELS


@pytest.fixture(scope="module")
def plain_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compiled") / "plain"
    return build(MODELS / "plain_mlp.py", "1x2,8x2", output=out).path


def _eager_twin(path: Path) -> torch.nn.Module:
    return rebuild_model(read_artifact(path), torch.device("cpu"), {})


def test_compiled_mode_is_checked_before_loading() -> None:
    with pytest.raises(LoadOptionError, match="compiled='fast': one of off, shipped, on") as info:
        LoadOptions(compiled="fast")
    assert info.value.option == "compiled"
    assert LoadOptions().compiled == "off"


def test_shipped_without_a_shipped_cache_warns_and_serves_as_today(plain_artifact: Path) -> None:
    with pytest.warns(UserWarning, match="precompiled graphs ship for GPU hosts only"):
        predictor = Predictor.load(plain_artifact, compiled="shipped")
    assert predictor.report.compiled.startswith("off (compiled='shipped' but")
    assert "compile" not in predictor.report.stages
    model = _eager_twin(plain_artifact)
    x = torch.randn(8, 2)
    with torch.no_grad():
        assert torch.equal(predictor(x), model(x))


@pytest.mark.slow
def test_compiled_mode_equals_eager_on_the_cpu(plain_artifact: Path) -> None:
    predictor = Predictor.load(plain_artifact, compiled="on")
    report = predictor.report
    assert report.compiled == "precompiled: 2 inductor graph(s) traced and compiled here"
    assert report.stages["compile"] > 0
    assert "compiled mode: precompiled" in str(report)
    model = _eager_twin(plain_artifact)
    for batch in (1, 8, 1):
        x = torch.randn(batch, 2)
        with torch.no_grad():
            torch.testing.assert_close(predictor(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_model_torch_compile_cannot_compile_is_served_as_today(
        plain_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("dynamo cannot trace this")

    monkeypatch.setattr(torch, "compile", refuse)
    with pytest.warns(UserWarning, match="torch.compile failed: RuntimeError: dynamo cannot"):
        predictor = Predictor.load(plain_artifact, compiled="on")
    assert predictor.report.compiled.startswith("off (torch.compile failed")
    x = torch.randn(1, 2)
    with torch.no_grad():
        assert torch.equal(predictor(x), _eager_twin(plain_artifact)(x))


@pytest.mark.slow
def test_inductor_failing_on_the_precompiled_route_falls_back_saying_why(
        plain_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qkan_pack.runtime import _precompiled

    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("inductor lowering failed")

    monkeypatch.setattr(_precompiled, "compile_graph", fail)
    with pytest.warns(UserWarning, match="no precompiled graphs: precompiled graphs failed: "
                                         "RuntimeError: inductor lowering failed"):
        predictor = Predictor.load(plain_artifact, compiled="on")
    assert predictor.report.compiled.startswith("inductor (mode default)"), predictor.report
    x = torch.randn(8, 2)
    with torch.no_grad():
        torch.testing.assert_close(predictor(x), _eager_twin(plain_artifact)(x))
