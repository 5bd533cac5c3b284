"""The predictor's fit of padded calls (``_inputs.InputMatcher``): worked out once per call
shape, in a bounded memory."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.format import with_batch_sizes
from qkan_pack.runtime import _calls, _inputs, read_artifact, rebuild_model
from qkan_pack.runtime._inputs import InputMatcher

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
    monkeypatch.setattr(_calls, "CALL_MEMORY", 3)  # the plans in front of the fits forget alike
    eager = _eager(masked)
    with Predictor.load(masked) as predictor:
        for length in (5, 5, 6, 5, 7, 9, 5):
            inputs = _tokens(2, length)
            with torch.no_grad():
                want = eager(**inputs)
            torch.testing.assert_close(predictor(**inputs), want, rtol=1e-5, atol=1e-6)
        assert [call[0][1] for call in searched] == [5, 6, 7, 9, 5]  # 5 was dropped at 9
        assert len(predictor._inputs._fits) == 3


def test_the_fit_memory_is_safe_under_many_threads(masked: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads evicting together both took the same oldest key and the second ``del`` raised
    ``KeyError`` (8 threads, more call shapes than the memory holds, a 1 us switch interval:
    16 in 160,000 calls). Every call must get its fit, and the memory stay bounded."""
    monkeypatch.setattr(_inputs, "FIT_MEMORY", 8)
    matcher = InputMatcher(read_artifact(masked).manifest, torch.device("cpu"), pad_batch=False)
    calls = [[torch.zeros(batch, length, dtype=torch.int64)] * 2
             for batch in range(1, 5) for length in range(1, 17)]  # 64 shapes
    failures: list[BaseException] = []

    def hammer(offset: int) -> None:
        try:
            for step in range(25_000):
                tensors = calls[(offset * 7 + step) % len(calls)]
                _, fit = matcher._lookup(tensors)
                assert fit is None or fit.shapes[0][1] >= tensors[0].shape[1]
        except BaseException as exc:  # handed back to the test thread
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, f"{len(failures)} thread(s) failed, first: {failures[0]!r}"
    assert len(matcher._fits) <= 8
