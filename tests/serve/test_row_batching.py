"""serve batches rows of different requests only where build proved them independent
(``builder._row_proof``): a model whose rows see each other answers each request as if it
came alone, and never reveals another request's input."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.errors import InputError
from qkan_pack.runtime import read_artifact

from ..conftest import MODELS

pytest.importorskip("orjson", reason="the serve extra is not installed")

ROWS = MODELS / "row_models.py"
CLIENTS = 32


def _core(path: Path) -> Any:
    from qkan_pack.serve._model import ModelCore

    predictor = Predictor.load(path, "cpu", progress=False)
    return ModelCore(predictor, max_batch_size=16, max_batch_wait_ms=None, exact=False)


def _concurrently(core: Any, rows: np.ndarray) -> list[Any]:
    from qkan_pack.serve._wire import given_from_python

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(core.infer({core.names[0]: given_from_python(row, "x")})
                                      for row in rows))

    return asyncio.run(all_at_once())


def _clients(seed: int) -> np.ndarray:
    """One row per client, each of its own magnitude (a client's private scale)."""
    generator = np.random.default_rng(seed)
    rows = generator.standard_normal((CLIENTS, 8)).astype(np.float32)
    return rows * generator.uniform(0.1, 1000.0, (CLIENTS, 1)).astype(np.float32)


def _eager(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("rows_eager", ROWS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build_model(**read_artifact(path).manifest.model.config).eval()
    return model


def test_a_dependent_model_answers_each_client_alone_and_leaks_nothing(tmp_path: Path) -> None:
    """Before the row proof, serve packed these rows into the 16-row graph: each reply
    carried the batch's largest input, another client's private value."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        path = build(ROWS, "1x8,16x8", config={"kind": "leaky"}, output=tmp_path / "a",
                     progress=False).path
    core = _core(path)
    assert not core.mixes and core._gatherer is None
    rows = _clients(0)
    replies = _concurrently(core, rows)
    model = _eager(path)
    for row, reply in zip(rows, replies):
        assert float(reply["scale"]) == pytest.approx(float(np.abs(row).max()), rel=1e-6)
        with torch.no_grad():
            alone = model(torch.from_numpy(row[None]))
        np.testing.assert_allclose(reply["y"], alone["y"][0].numpy(), rtol=1e-5, atol=1e-5)
    stats = core.stats.view()
    assert stats["rows_per_replay"] == {"1": CLIENTS}
    assert stats["replays"] == {"1x8": CLIENTS}


@pytest.mark.parametrize("kind", ["int8", "moe", "batch_max"])
def test_each_dependent_pattern_is_served_one_request_at_a_time(tmp_path: Path, kind: str) -> None:
    with pytest.warns(UserWarning, match="rows are not independent"):
        path = build(ROWS, "1x8,16x8", config={"kind": kind}, output=tmp_path / kind,
                     progress=False).path
    core = _core(path)
    rows = _clients(1)
    replies = _concurrently(core, rows)
    model = _eager(path)
    with torch.no_grad():
        alone = [model(torch.from_numpy(row[None])).numpy() for row in rows]
    np.testing.assert_allclose(np.stack(replies), np.concatenate(alone), rtol=1e-5,
                               atol=1e-5)


def test_a_single_row_never_fills_an_entry_whose_rows_depend(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="rows are not independent"):
        path = build(ROWS, "16x8", config={"kind": "batch_max"}, output=tmp_path / "a",
                     progress=False).path
    core = _core(path)
    with pytest.raises(InputError, match=r"a single row does not fill 16x8 .*not proved independent"):
        _concurrently(core, _clients(2)[:1])
    batch = _clients(3)[:16]
    (whole,) = _concurrently(core, batch[None])  # a whole batch of its own shape is served
    assert whole.shape == (16, 3)


def test_a_proved_model_still_batches_requests(tmp_path: Path) -> None:
    path = build(ROWS, "1x8,16x8", output=tmp_path / "a", progress=False).path
    core = _core(path)
    assert core.mixes
    rows = _clients(4)
    replies = _concurrently(core, rows)
    predictor = core.predictor
    alone = np.concatenate([predictor(torch.from_numpy(row[None])).numpy() for row in rows])
    # a 16-row matrix product rounds unlike a 1-row one: each value is held to its row's
    # magnitude (the clients' rows are up to 10,000 apart), as the row proof holds it
    row_scale = np.abs(alone).max(axis=1, keepdims=True)
    error = np.abs(np.stack(replies) - alone)
    np.testing.assert_array_less(error, np.broadcast_to(1e-5 * row_scale + 1e-6, error.shape))
    stats = core.stats.view()
    assert stats["replays"]["16x8"] >= 1  # rows of different requests shared replays
    assert max(map(int, stats["rows_per_replay"])) > 1


def test_an_artifact_from_before_the_proof_is_not_batched(tmp_path: Path) -> None:
    path = build(ROWS, "1x8,16x8", output=tmp_path / "a", progress=False).path
    manifest = json.loads((path / "manifest.json").read_text())
    for entry in manifest["shapes"]:
        entry.pop("rows", None)
    (path / "manifest.json").write_text(json.dumps(manifest))
    core = _core(path)
    assert not core.mixes
    assert "built before qkan-pack proved rows independent" in json.dumps(
        _dependent_texts(core))


def _dependent_texts(core: Any) -> list[str]:
    return [text for texts in core._dependent.values() for text in texts]


def test_a_declared_shape_without_rows_is_answered_as_declared(tmp_path: Path) -> None:
    """1x8 is declared, but its fixed 8x3 table does not follow the batch, so 1x8 takes no
    rows: a 1x8 request was routed as a row into 8x8 (were 8x8 proved, here by an edited
    manifest) and got one row of the table."""
    with pytest.warns(UserWarning, match="rows are not independent"):
        path = build(ROWS, "1x8,8x8", config={"kind": "fixed_table"}, output=tmp_path / "a",
                     progress=False).path
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["shapes"][1]["rows"] = {"independent": True}
    (path / "manifest.json").write_text(json.dumps(manifest))
    core = _core(path)
    assert core.mixes
    (reply,) = _concurrently(core, _clients(5)[None, :1])
    assert reply["prototypes"].shape == (8, 3)
    want = core.predictor(torch.from_numpy(_clients(5)[:1]))
    np.testing.assert_array_equal(reply["prototypes"], want["prototypes"].numpy())


def test_a_rows_share_holds_only_its_own_row(tmp_path: Path) -> None:
    """Second audit: a bfloat16 output stays a tensor, and a row's slice of the batch was a
    view: pickled for a Ray handle's reply, it carried every other client's row (numpy
    shares kept them as ``.base``)."""
    source = tmp_path / "bf.py"
    source.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(8, 3)\n"
        "    def forward(self, x):\n"
        "        y = self.linear(x)\n"
        "        return {'y': y, 'score': y.to(torch.bfloat16)}\n"
        "def build_model():\n"
        "    torch.manual_seed(0)\n"
        "    return M()\n")
    path = build(source, "1x8,8x8", output=tmp_path / "a", progress=False).path
    core = _core(path)
    assert core.mixes
    replies = _concurrently(core, _clients(6)[:, None, :])  # each a 1x8 request
    assert max(map(int, core.stats.view()["rows_per_replay"])) > 1
    for reply in replies:
        score, y = reply["score"], reply["y"]
        assert score.shape == (1, 3)
        assert score.untyped_storage().nbytes() == 3 * 2  # its own 3 bfloat16 values
        assert y.base is None or y.base.size == y.size
