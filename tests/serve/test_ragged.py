"""Ragged batching (artifacts built with ``--pad``): single rows of different lengths replay
together, each reply cut to its own length and equal to eager on the row alone. Runs the
replica's model core in process (no Ray)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from qkan_pack import InputError, Predictor, build
from qkan_pack.format import with_batch_sizes
from qkan_pack.runtime import read_artifact, rebuild_model
from qkan_pack.serve._model import ModelCore
from qkan_pack.serve._wire import Given

from ..conftest import MODELS

pytest.importorskip("transformers")
TOKENS = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                           {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])


@pytest.fixture(scope="module")
def gpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal LM: its logits follow the sequence, so each reply is cut to its own length."""
    return build(MODELS / "hf_models.py", TOKENS, dtype="int64", config={"arch": "gpt2"},
                 output=tmp_path_factory.mktemp("ragged") / "gpt",
                 pad={"input_ids": 0, "attention_mask": 0}, progress=False).path


def _row(length: int, batched: bool) -> dict[str, Given]:
    ids = np.random.default_rng(length).integers(1, 100, size=(length,)).astype(np.int64)
    mask = np.ones(length, dtype=np.int64)
    if batched:
        ids, mask = ids[None], mask[None]
    return {"input_ids": Given(ids, "int64"), "attention_mask": Given(mask, "int64")}


def test_rows_of_every_length_batch_together_and_equal_eager_alone(gpt: Path) -> None:
    artifact = read_artifact(gpt)
    eager = rebuild_model(artifact, torch.device("cpu"), dict(artifact.manifest.model.config))
    with Predictor.load(gpt, pad_batch=True) as predictor:
        core = ModelCore(predictor, max_batch_size=4, max_batch_wait_ms=None, exact=False)
        lengths = [random.Random(seed).randint(1, 16) for seed in range(24)]
        forms = [bool(i % 2) for i in range(24)]

        async def all_rows() -> list:
            return await asyncio.gather(*(core.infer(_row(n, b)) for n, b in zip(lengths, forms)))

        replies = asyncio.run(all_rows())
        stats = core.stats.view()
    assert stats["requests"]["rows"] == 24
    assert sum(int(k) * v for k, v in stats["rows_per_replay"].items()) == 24
    assert max(int(k) for k in stats["rows_per_replay"]) > 1  # rows really shared replays
    for n, batched, reply in zip(lengths, forms, replies):
        given = _row(n, True)
        with torch.no_grad():
            want = eager(input_ids=torch.from_numpy(given["input_ids"].array),
                         attention_mask=torch.from_numpy(given["attention_mask"].array)).logits
        got = np.asarray(reply["logits"])
        expected = want.numpy() if batched else want.numpy()[0]
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_too_long_a_row_is_a_422_with_the_ranges(gpt: Path) -> None:
    with Predictor.load(gpt, pad_batch=True) as predictor:
        core = ModelCore(predictor, max_batch_size=4, max_batch_wait_ms=None, exact=False)
        with pytest.raises(InputError) as info:
            asyncio.run(core.infer(_row(17, False)))
        assert info.value.ranges and "(1-4)x(1-16)" in str(info.value)
        reply = asyncio.run(core.infer({  # several rows at once: padded by the predictor
            "input_ids": Given(np.ones((3, 5), np.int64), "int64"),
            "attention_mask": Given(np.ones((3, 5), np.int64), "int64")}))
        assert np.asarray(reply["logits"]).shape == (3, 5, 100)


def test_get_root_shows_the_padded_ranges(gpt: Path) -> None:
    from qkan_pack.serve import describe_artifact, row_plan

    manifest = read_artifact(gpt).manifest
    shown = describe_artifact(manifest, "sha256:x", row_plan(manifest))
    assert shown["padded"]["values"] == {"input_ids": 0, "attention_mask": 0}
    assert {"dtype": "int64", "dims": [[1, 4], [1, 16]]} in [
        entry["input_ids"] for entry in shown["padded"]["ranges"]]


def test_a_row_without_its_batch_dimension_drops_the_dimension_that_follows_the_batch(
        tmp_path: Path) -> None:
    """A sequence-first output (length, batch, features): a row sent without its batch
    dimension used to lose dim 0 of every output, its length, and got the first token's
    features back as a 1x4 array."""
    path = build(MODELS / "pad_models.py", TOKENS, dtype="int64", config={"kind": "seq_first"},
                 output=tmp_path / "seq", pad={"input_ids": 0, "attention_mask": 0},
                 progress=False).path
    lengths = [1, 3, 8, 11, 16, 5]
    with Predictor.load(path) as predictor:
        for exact in (False, True):
            core = ModelCore(predictor, max_batch_size=4, max_batch_wait_ms=None, exact=exact)

            async def all_rows(core: ModelCore) -> list:
                return await asyncio.gather(*(core.infer(_row(n, batched=i % 2 == 0))
                                              for i, n in enumerate(lengths)))

            for i, (n, reply) in enumerate(zip(lengths, asyncio.run(all_rows(core)))):
                given = _row(n, True)
                alone = predictor(input_ids=torch.from_numpy(given["input_ids"].array),
                                  attention_mask=torch.from_numpy(given["attention_mask"].array))
                want = alone.numpy() if i % 2 == 0 else alone.numpy()[:, 0]
                assert np.asarray(reply).shape == want.shape, (exact, n)
                np.testing.assert_array_equal(np.asarray(reply), want)


def test_rows_are_padded_with_the_bfloat16_value_build_proved(tmp_path: Path) -> None:
    """bfloat16 pad values used to be truncated (0.1 became 0x3dcc) where torch, the
    predictor and the build's proof round them (0x3dcd)."""
    from qkan_pack.serve._ragged import RaggedPlan

    path = build(MODELS / "pad_models.py", "1x4x6,2x8x6", dtype="bfloat16",
                 config={"kind": "bfloat16_rows"}, output=tmp_path / "bf16", pad={"x": 0.1},
                 progress=False).path
    plan = RaggedPlan(read_artifact(path).manifest)
    rows = [plan.row([np.zeros((n, 6), np.uint16)])[0] for n in (3, 8)]
    stacked = plan.stack(rows)[0]
    torch_bits = torch.full((1,), 0.1, dtype=torch.bfloat16).view(torch.int16).item() & 0xFFFF
    assert stacked.shape == (2, 8, 6) and (stacked[0, 3:] == torch_bits).all()
