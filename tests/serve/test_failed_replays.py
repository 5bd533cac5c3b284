"""A replay of several clients' rows that fails is replayed row by row: only the rows that
fail alone fail, each with its own error, and the others get their own answers. Runs the
replica's model core in process (no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.errors import ModelSourceError

from ..conftest import MODELS

pytest.importorskip("orjson", reason="the serve extra is not installed")

ONE_HOT = MODELS / "one_hot.py"
GOOD = [[1, 2, 3, 0], [5, 5, 1, 0], [4, 0, 0, 0]]


def _core(path: Path) -> Any:
    from qkan_pack.serve._model import ModelCore

    predictor = Predictor.load(path, "cpu", progress=False)
    return ModelCore(predictor, max_batch_size=8, max_batch_wait_ms=None, exact=False)


def _replays(core: Any) -> list[int]:
    """Rows of every replay the core makes from now on (in order)."""
    seen: list[int] = []
    replay = core.replay

    def counted(arrays: Sequence[np.ndarray]) -> Any:
        seen.append(len(arrays[0]))
        return replay(arrays)

    core.replay = counted
    return seen


def _together(core: Any, rows: Sequence[Sequence[int]]) -> list[Any]:
    """Each row a request of its own, all in flight at once; an error is its request's result."""
    async def one(row: Sequence[int]) -> Any:
        try:
            return await core.infer(core.given((np.array(row, np.int64),), {}))
        except Exception as exc:  # the error the request's client would get
            return exc

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(one(row) for row in rows))

    return asyncio.run(all_at_once())


def _alone(path: Path, row: Sequence[int]) -> np.ndarray:
    with Predictor.load(path, "cpu", progress=False) as predictor:
        return predictor(torch.tensor([row])).numpy()[0]


@pytest.fixture(scope="module")
def one_hot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(ONE_HOT, "1x4,8x4", dtype="int64", input_range=(0, 6), progress=False,
                 output=tmp_path_factory.mktemp("one_hot") / "a").path


def test_one_clients_bad_id_fails_its_own_request_only(one_hot: Path) -> None:
    """Audit M4: an id past the one-hot's classes failed the whole batch: every request in
    it got a 500 carrying the bad client's error."""
    core = _core(one_hot)
    assert core.mixes
    replays = _replays(core)
    bad, *good = _together(core, [[9, 0, 0, 0], *GOOD])
    assert isinstance(bad, ModelSourceError) and "num_classes" in str(bad)
    assert replays[0] == 8  # the rows did share a replay, which failed
    for row, reply in zip(GOOD, good):
        assert isinstance(reply, np.ndarray), reply
        np.testing.assert_allclose(reply, _alone(one_hot, row), rtol=1e-6, atol=1e-6)


def test_each_failing_row_gets_its_own_error_in_a_ragged_group(tmp_path: Path) -> None:
    """Rows of different lengths padded into one replay (``build --pad``), two of them bad:
    a model error that quotes the values it refuses quotes only the row's own."""
    path = build(ONE_HOT, "1x4,8x8", dtype="int64", input_range=(0, 6), pad={"ids": 0},
                 config={"names_ids": True}, output=tmp_path / "a", progress=False).path
    core = _core(path)
    assert core.mixes and core._ragged is not None
    good = [[1, 2], [3, 1, 4, 1, 5], [2]]
    replays = _replays(core)
    first, second, *answers = _together(core, [[7, 1, 1], [2, 8], *good])
    assert replays[0] == 5  # one padded replay of every row, which failed
    assert "unknown category ids [7] " in str(first)  # the group's error said [7, 8]
    assert "unknown category ids [8] " in str(second)
    for row, reply in zip(good, answers):
        assert isinstance(reply, np.ndarray), reply
        np.testing.assert_allclose(reply, _alone(path, row), rtol=1e-6, atol=1e-6)


def test_after_a_device_error_the_rows_are_not_replayed_again(one_hot: Path) -> None:
    """A replica marked unhealthy (a CUDA error: Ray replaces it) replays nothing more; every
    row of the failed replay gets its error."""
    core = _core(one_hot)
    calls: list[int] = []

    def device_error(arrays: Sequence[np.ndarray]) -> Any:
        calls.append(len(arrays[0]))
        core.fault = "RuntimeError: CUDA error: device-side assert triggered"
        raise RuntimeError("CUDA error: device-side assert triggered")

    core.replay = device_error
    replies = _together(core, GOOD)
    assert calls == [8]
    assert all(isinstance(r, RuntimeError) and "device-side" in str(r) for r in replies)


def test_one_bad_row_costs_a_few_halvings_not_a_replay_per_row(tmp_path: Path) -> None:
    """Second audit: with only a 64-row shape, a group of 63 good rows and one bad one was
    replayed 64 times, each a full 64-row replay; halving finds the bad row in about
    2 log2(64) replays."""
    path = build(ONE_HOT, "64x4", dtype="int64", input_range=(0, 6), progress=False,
                 output=tmp_path / "a").path
    from qkan_pack.serve._model import ModelCore

    predictor = Predictor.load(path, "cpu", progress=False)
    core = ModelCore(predictor, max_batch_size=64, max_batch_wait_ms=None, exact=False)
    replays = _replays(core)
    rows = [[9, 0, 0, 0], *([GOOD[0]] * 63)]
    bad, *good = _together(core, rows)
    assert isinstance(bad, ModelSourceError)
    assert all(isinstance(reply, np.ndarray) for reply in good)
    assert len(replays) <= 2 * 6 + 1, len(replays)
