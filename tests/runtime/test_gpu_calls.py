"""Remembered call plans on a real GPU (``pytest -m gpu``): device and host tensors, numpy,
keywords, padding and zero-copy outputs answer through a signature's plan exactly as the
general path does, and a plan orders its replay after the previous caller's stream.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import Predictor, build

from ..conftest import EXAMPLES, MODELS
from .conftest import both_paths, described

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu_calls")
    build(EXAMPLES / "qkan_mlp.py", "1x2,64x2", output=root / "mlp", progress=False)
    build(MODELS / "gpu_multi_io.py", [{"a": (2, 3), "b": (2, 3)}, {"a": (16, 3), "b": (16, 3)}],
          output=root / "multi", progress=False)
    return {"mlp": root / "mlp", "multi": root / "multi"}


def load(path: Path, **options: Any) -> Predictor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pad_batch
        return Predictor.load(path, device="cuda", progress=False, **options)


MLP_CALLS: dict[str, Callable[[], tuple[tuple, dict[str, Any]]]] = {
    "device 1x2": lambda: ((torch.randn(1, 2, device="cuda"),), {}),
    "device 64x2": lambda: ((torch.randn(64, 2, device="cuda"),), {}),
    "host 1x2": lambda: ((torch.randn(1, 2),), {}),
    "device keyword 64x2": lambda: ((), {"x": torch.randn(64, 2, device="cuda")}),
    "numpy 64x2": lambda: ((np.random.default_rng().standard_normal((64, 2), np.float32),), {}),
    "non-contiguous device 64x2": lambda: ((torch.randn(2, 64, device="cuda").T,), {}),
    "non-contiguous host 64x2": lambda: ((torch.randn(2, 64).T,), {}),
    "requires grad 1x2": lambda: ((torch.randn(1, 2, device="cuda", requires_grad=True),), {}),
    "padded device 5x2": lambda: ((torch.randn(5, 2, device="cuda"),), {}),
    "padded host 33x2": lambda: ((torch.randn(33, 2),), {}),
    "float64 device 1x2": lambda: ((torch.randn(1, 2, device="cuda", dtype=torch.float64),), {}),
    "sparse device 1x2": lambda: ((torch.randn(1, 2, device="cuda").to_sparse(),), {}),
    "device 3x2": lambda: ((torch.randn(3, 2, device="cuda"),), {}),
}


@pytest.mark.parametrize("options", [{}, {"pad_batch": True}, {"copy_outputs": False}],
                         ids=["exact", "pad_batch", "copy_outputs=False"])
def test_every_signature_answers_as_the_general_path(built: dict[str, Path],
                                                     options: dict[str, Any]) -> None:
    with load(built["mlp"], **options) as predictor:
        for _ in range(3):
            for name, make in MLP_CALLS.items():
                args, kwargs = make()
                fast, general = both_paths(predictor, args, kwargs)
                assert fast == general, name
        statics = [graph.static_inputs[0] for graph in predictor._runner._full.values()]
        assert not any(t.requires_grad for t in statics)


def test_several_inputs_by_name_and_dict_outputs_answer_as_the_general_path(
        built: dict[str, Path]) -> None:
    with load(built["multi"], pad_batch=True) as predictor:
        for _ in range(3):
            for rows in (16, 2, 9):
                a, b = torch.randn(rows, 3, device="cuda"), torch.randn(rows, 3)
                for args, kwargs in [((a, b), {}), ((), {"b": b, "a": a}),
                                     ((a.cpu().numpy(), b.numpy()), {})]:
                    fast, general = both_paths(predictor, args, kwargs)
                    assert fast == general, rows


def test_a_plan_replays_after_the_previous_callers_stream(built: dict[str, Path]) -> None:
    """Threads calling on their own streams, alternating with the default stream: each
    remembered call waits for the stream that last used the graph's buffers."""
    with load(built["mlp"]) as predictor:
        inputs = [torch.randn(64, 2, device="cuda") for _ in range(8)]
        torch.cuda.synchronize()
        wants = [described(predictor._first_call(None, (x,), {})) for x in inputs]
        failures: list[str] = []

        def worker(offset: int) -> None:
            torch.cuda.set_device(0)
            stream = torch.cuda.Stream() if offset % 2 else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                for step in range(300):
                    pick = (offset + step) % len(inputs)
                    got = predictor(inputs[pick])
                    stream.synchronize()
                    if described(got) != wants[pick]:
                        failures.append(f"thread {offset} call {step}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
