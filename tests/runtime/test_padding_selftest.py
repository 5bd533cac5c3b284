"""The load's padding self-test: one padded call per entry, against the same call unpadded
(``runtime._padcheck``, the check build proves padding with). A manifest re-hashed with
another pad value, or with an output no longer said to follow a padded axis, answered
padded calls wrongly; it is refused at load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, SelfTestError, build
from qkan_pack.builder import write_artifact
from qkan_pack.format import PaddedAxis, Padding, with_batch_sizes
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import MODELS

TOKENS = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                           {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])
PAD_TOKENS = {"input_ids": 0, "attention_mask": 0}


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(MODELS / "pad_models.py", TOKENS, dtype="int64",
                 config={"kind": "masked_meanpool"}, pad=PAD_TOKENS,
                 output=tmp_path_factory.mktemp("padcheck") / "masked", progress=False).path


def _re_hashed(path: Path, target: Path, padding: Padding) -> Path:
    """The artifact with another padding, its manifest re-hashed (every file digest right)."""
    artifact = read_artifact(path)
    write_artifact(target, dataclasses.replace(artifact.manifest, padding=padding),
                   dict(artifact.files))
    return target


def test_a_padded_artifact_runs_the_padding_self_test(masked: Path) -> None:
    with Predictor.load(masked, progress=False) as predictor:
        assert "padding self-test" in predictor.report.stages


def test_a_re_hashed_pad_value_that_changes_answers_is_refused_at_load(
        masked: Path, tmp_path: Path) -> None:
    """attention_mask padded with 1 counts the padded positions in the mean: every padded
    call answered wrongly, and the load passed (it never ran a padded call)."""
    padding = read_artifact(masked).manifest.padding
    assert padding is not None
    edited = _re_hashed(masked, tmp_path / "edited", dataclasses.replace(
        padding, values={**padding.values, "attention_mask": 1}))
    artifact = read_artifact(edited)
    eager = rebuild_model(artifact, torch.device("cpu"), dict(artifact.manifest.model.config))
    with pytest.raises(SelfTestError, match="padded back with attention_mask=1") as info:
        Predictor.load(edited, progress=False)
    assert "was the manifest edited after build?" in str(info.value)
    assert info.value.max_rel is not None and info.value.max_rel > 1e-3
    # what the load refuses is what the predictor would have served (checked without it)
    ids, mask = torch.randint(1, 50, (2, 7)), torch.ones(2, 7, dtype=torch.int64)
    padded_ids = torch.cat([ids, torch.zeros(2, 1, dtype=torch.int64)], 1)
    padded_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.int64)], 1)
    with torch.no_grad():
        assert not torch.allclose(eager(padded_ids, padded_mask), eager(ids, mask), atol=1e-4)


def test_a_re_hashed_pad_value_the_model_ignores_still_loads(masked: Path,
                                                              tmp_path: Path) -> None:
    """The mask hides padded token ids: another pad id gives the same answers, and the
    check holds no sound artifact back."""
    padding = read_artifact(masked).manifest.padding
    assert padding is not None
    edited = _re_hashed(masked, tmp_path / "edited", dataclasses.replace(
        padding, values={**padding.values, "input_ids": 7}))
    Predictor.load(edited, progress=False).close()


def test_a_re_hashed_follower_dropped_is_refused_at_load(masked: Path, tmp_path: Path) -> None:
    """Without the batch axis's follower, a call of fewer rows got every row of the entry
    back (its padded rows too)."""
    padding = read_artifact(masked).manifest.padding
    assert padding is not None
    batch, length = padding.axes
    edited = _re_hashed(masked, tmp_path / "edited", dataclasses.replace(
        padding, axes=(PaddedAxis(batch.inputs, ()), length)))
    with pytest.raises(SelfTestError, match="padded and sliced back, 3x3 unpadded"):
        Predictor.load(edited, progress=False)
