"""The predictor's fit of padded calls (``_inputs.InputMatcher``): worked out once per call
shape, in a bounded memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.format import with_batch_sizes
from qkan_pack.runtime import _inputs, read_artifact, rebuild_model

from ..conftest import MODELS

TOKENS = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                           {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(MODELS / "pad_models.py", TOKENS, dtype="int64",
                 config={"kind": "masked_meanpool"}, output=tmp_path_factory.mktemp("fit") / "m",
                 pad={"input_ids": 0, "attention_mask": 0}, progress=False).path


def _eager(path: Path) -> torch.nn.Module:
    artifact = read_artifact(path)
    return rebuild_model(artifact, torch.device("cpu"), dict(artifact.manifest.model.config))


def _tokens(batch: int, length: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(1, 50, (batch, length)),
            "attention_mask": torch.ones(batch, length, dtype=torch.int64)}


def test_a_call_shape_is_fitted_once_and_the_memory_stays_bounded(
        masked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    searched = []
    real = _inputs.fit_entry
    monkeypatch.setattr(_inputs, "fit_entry", lambda *a: searched.append(a[0]) or real(*a))
    monkeypatch.setattr(_inputs, "FIT_MEMORY", 3)
    eager = _eager(masked)
    with Predictor.load(masked) as predictor:
        for length in (5, 5, 6, 5, 7, 9, 5):
            inputs = _tokens(2, length)
            with torch.no_grad():
                want = eager(**inputs)
            torch.testing.assert_close(predictor(**inputs), want, rtol=1e-5, atol=1e-6)
        assert [call[0][1] for call in searched] == [5, 6, 7, 9, 5]  # 5 was dropped at 9
        assert len(predictor._inputs._fits) == 3
