"""Predictors on several GPUs of one host (issue "Multi-GPU check"; needs >= 2 GPUs)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from qkan_pack import Predictor, build
from qkan_pack.runtime import read_artifact, rebuild_model

from ..conftest import EXAMPLES

pytestmark = pytest.mark.gpu
TIGHT = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this host has {torch.cuda.device_count()}")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("multi") / "mlp64"
    build(EXAMPLES / "qkan_mlp.py", "1x64,32x64", output=path,
          config={"width": [64, 64, 64], "reps": 3})
    return path


def _eager(path: Path, device: str) -> torch.nn.Module:
    verified = read_artifact(path)
    return rebuild_model(verified, torch.device(device), dict(verified.manifest.model.config))


def test_load_on_second_gpu_touches_only_that_gpu(two_gpus: None, artifact: Path) -> None:
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0)
    before = [torch.cuda.memory_reserved(i) for i in (0, 1)]
    with Predictor.load(artifact, device="cuda:1") as predictor:
        after = [torch.cuda.memory_reserved(i) for i in (0, 1)]
        assert after[0] == before[0], "capture on cuda:1 allocated on cuda:0"
        assert after[1] > before[1]
        assert torch.cuda.current_device() == 0
        eager = _eager(artifact, "cuda:1")
        for shape in [(1, 64), (32, 64)]:
            x = torch.randn(shape, device="cuda:1")
            # qkan's flash solver launches Triton on the *current* device: eager qkan on
            # cuda:1 needs cuda:1 current (the predictor sets it itself)
            with torch.no_grad(), torch.cuda.device(1):
                want = eager(x)
            got = predictor(x)
            assert got.device == torch.device("cuda", 1)
            torch.testing.assert_close(got, want, **TIGHT)


def test_one_predictor_per_gpu_from_threads(two_gpus: None, artifact: Path) -> None:
    predictors = [Predictor.load(artifact, device=f"cuda:{i}") for i in (0, 1)]
    eagers = [_eager(artifact, f"cuda:{i}") for i in (0, 1)]
    failures: list[str] = []

    def worker(gpu: int) -> None:
        torch.cuda.set_device(gpu)
        for step in range(500):
            x = torch.randn((1, 64) if step % 2 else (32, 64), device=f"cuda:{gpu}")
            with torch.no_grad():
                want = eagers[gpu](x)
            if not torch.allclose(predictors[gpu](x), want, **TIGHT):
                failures.append(f"gpu {gpu} step {step}")

    threads = [threading.Thread(target=worker, args=(i % 2,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for predictor in predictors:
        predictor.close()
    assert failures == []
