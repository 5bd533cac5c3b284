"""Declared padding on the GPU (``pytest -m gpu``): padded calls of transformers encoders and a
causal LM, built on the CPU, equal same-device eager on the unpadded input; each padded call
replays a captured graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.format import with_batch_sizes
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import MODELS

pytestmark = pytest.mark.gpu
#: The test models take at most 64 positions.
TOKENS = with_batch_sizes([{"input_ids": (16,), "attention_mask": (16,)},
                           {"input_ids": (64,), "attention_mask": (64,)}], [1, 8])


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_padded_calls_equal_same_device_eager(tmp_path: Path, arch: str) -> None:
    pytest.importorskip("transformers")
    path = build(MODELS / "hf_models.py", TOKENS, dtype="int64", config={"arch": arch},
                 output=tmp_path / arch, pad={"input_ids": 0, "attention_mask": 0},
                 progress=False).path
    device = torch.device("cuda")
    artifact = read_artifact(path)
    eager = rebuild_model(artifact, device, dict(artifact.manifest.model.config))
    with Predictor.load(path, device="cuda", progress=False) as predictor:
        assert all(r.policy == "full" for r in predictor.report.shapes), predictor.report
        for batch, length in ((1, 1), (3, 17), (8, 31), (5, 50), (2, 64), (1, 16)):
            ids = torch.randint(0, 100, (batch, length), device=device)
            mask = torch.ones(batch, length, dtype=torch.int64, device=device)
            with torch.no_grad():
                want = eager(input_ids=ids, attention_mask=mask).logits
            got = predictor(input_ids=ids, attention_mask=mask).logits
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
