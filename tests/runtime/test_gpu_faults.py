"""Under load and faults, on a real GPU (``pytest -m gpu``; skipped without CUDA).

- 16 threads x 2,000 calls of mixed shapes (exact and padded), copying and zero-copy
  predictors, and a ``close()`` in the middle: every call returns what eager PyTorch on the
  same device returns, or ``PredictorClosedError``; nothing else.
- A load that fails partway (capture error, replay or reference self-test refusal, out of
  memory while capturing the largest shape under ``set_per_process_memory_fraction``)
  frees every graph and pool: allocated and reserved memory after equal before.

Each test prints its figures (``-s``) for SECURITY.md.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from qkan_pack import CaptureError, Predictor, PredictorClosedError, SelfTestError, build
from qkan_pack.runtime import read_artifact, rebuild_model
from qkan_pack.runtime._capture import clear_cublas_workspaces
from qkan_pack.runtime._options import SAME_HOST_TOLERANCE

from ..conftest import EXAMPLES, MODELS
from .test_tamper import REF0, resign

pytestmark = pytest.mark.gpu
THREADS, CALLS = 16, 2000
RTOL, ATOL = SAME_HOST_TOLERANCE  # padded rows run the batch-64 graph, eager the batch itself


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults")
    paths = {name: root / name for name in ("mlp", "item_full", "differs", "wide", "bad_refs")}
    build(EXAMPLES / "qkan_mlp.py", "1x2,8x2,64x2", output=paths["mlp"])
    build(MODELS / "gpu_item_model.py", "1x4,8x4", output=paths["item_full"], capture="full")
    build(MODELS / "gpu_capture_differs.py", "1x4,8x4", output=paths["differs"])
    build(MODELS / "gpu_wide.py", "1x1024,2048x1024", output=paths["wide"], capture="full")
    build(MODELS / "gpu_capture_differs.py", "1x4,8x4", output=paths["bad_refs"])
    data = bytearray((paths["bad_refs"] / REF0).read_bytes())
    data[-1] ^= 0x40  # a reference output edited (and re-hashed): the reference self-test
    (paths["bad_refs"] / REF0).write_bytes(bytes(data))
    resign(paths["bad_refs"], REF0)
    return paths


def eager_model(path: Path) -> torch.nn.Module:
    artifact = read_artifact(path)
    return rebuild_model(artifact, torch.device("cuda"), dict(artifact.manifest.model.config))


# ---------------------------------------------------------------------------
# 16 threads x 2,000 calls with padding, zero-copy outputs and a concurrent close()
# ---------------------------------------------------------------------------


def test_threads_padding_zero_copy_and_close_give_eager_results(built: dict[str, Path]) -> None:
    eager = eager_model(built["mlp"])
    generator = torch.Generator(device="cuda").manual_seed(0)
    batches = (1, 3, 8, 20, 64, 37)  # 3, 20, 37: padded up to 8 or 64
    pool = [torch.randn(b, 2, device="cuda", generator=generator) for b in batches for _ in range(4)]
    with torch.no_grad():
        expected = [eager(x) for x in pool]
    copying = Predictor.load(built["mlp"], device="cuda", pad_batch=True)
    zero_copy = Predictor.load(built["mlp"], device="cuda", pad_batch=True, copy_outputs=False)
    zero_copy_lock = threading.Lock()  # documented: a zero-copy output lives until the next call
    counts = {"ok": 0, "wrong": 0, "closed": 0, "other": 0, "zero-copy": 0, "padded": 0}
    counted = threading.Lock()
    errors: list[str] = []

    def record(kind: str, *more: str) -> None:
        with counted:
            for name in (kind, *more):
                counts[name] += 1

    def call(predictor: Predictor, i: int) -> str:
        x = pool[i] if i % 3 else pool[i].cpu()  # CPU inputs come back on the CPU
        got = predictor(x)
        return "ok" if torch.allclose(got.to("cuda"), expected[i], rtol=RTOL, atol=ATOL) else "wrong"

    def worker(index: int) -> None:
        torch.cuda.set_device(0)
        for step in range(CALLS):
            i = (index * 7 + step) % len(pool)
            padded = ("padded",) if pool[i].shape[0] not in (1, 8, 64) else ()
            try:
                if index < 2:
                    with zero_copy_lock:
                        kind = call(zero_copy, i)
                    record(kind, "zero-copy", *padded)
                else:
                    record(call(copying, i), *padded)
            except PredictorClosedError:
                record("closed")
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                record("other")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    while sum(counts.values()) - counts["zero-copy"] - counts["padded"] < THREADS * CALLS * 6 // 10:
        threading.Event().wait(0.001)
    copying.close()  # while 14 threads are calling it
    for thread in threads:
        thread.join()
    zero_copy.close()
    print(f"threads/faults: {THREADS} threads x {CALLS} calls = {THREADS * CALLS}: {counts}")
    assert counts["wrong"] == 0 and counts["other"] == 0, (counts, errors[:3])
    assert counts["ok"] + counts["closed"] == THREADS * CALLS
    assert counts["closed"] > 0 and counts["zero-copy"] == 2 * CALLS and counts["padded"] > 0


# ---------------------------------------------------------------------------
# A load that fails partway frees every graph and pool
# ---------------------------------------------------------------------------


def settled() -> tuple[int, int]:
    """(allocated, reserved) bytes once garbage, cuBLAS workspaces and cached blocks are gone."""
    gc.collect()
    torch.cuda.synchronize()
    clear_cublas_workspaces()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def failed_load(load: Callable[[], Predictor]) -> tuple[BaseException, tuple[int, int],
                                                        tuple[int, int]]:
    before = settled()
    try:
        load().close()
    except Exception as exc:  # the failure under test
        error: BaseException = exc
    else:
        pytest.fail("the load was expected to fail")
    return error, before, settled()


@pytest.mark.parametrize(("name", "error", "says"), [
    ("item_full", CaptureError, "shape"),  # .item() under --capture full
    ("differs", SelfTestError, "replayed outputs"),  # replay self-test refuses
    ("bad_refs", SelfTestError, "build-time references"),  # reference self-test refuses
])
def test_a_failed_load_frees_everything(built: dict[str, Path], name: str, error: type,
                                        says: str) -> None:
    Predictor.load(built["mlp"], device="cuda").close()  # CUDA, cuBLAS, Triton warmed first
    for _ in range(3):  # the same failure, again and again: no growth
        exc, before, after = failed_load(lambda: Predictor.load(built[name], device="cuda"))
        assert isinstance(exc, error) and says in str(exc), exc
        print(f"failed load ({name}, {type(exc).__name__}): allocated {before[0]} -> {after[0]}, "
              f"reserved {before[1]} -> {after[1]} bytes")
        assert after == before


def test_out_of_memory_while_capturing_frees_everything(built: dict[str, Path]) -> None:
    """Cap this process's GPU memory at a sweep of sizes around what the wide model needs:
    small caps fail while building or in the first forward, some in the capture of the
    largest shape (captured first), large ones load. Every failure must leave memory as it
    found it; at least one must be an out-of-memory inside the capture."""
    device = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(device).total_memory
    Predictor.load(built["wide"], device="cuda").close()  # warm everything once
    base = settled()[1]
    torch.cuda.reset_peak_memory_stats(device)
    probe = Predictor.load(built["wide"], device="cuda")
    need = torch.cuda.max_memory_reserved(device) - base
    probe.close()
    outcomes: list[str] = []
    loaded = 0
    try:
        for step in range(8, 80):  # caps from a quarter of the need up, in 1/32 steps
            cap = base + need * step // 32
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
            before = settled()
            try:
                Predictor.load(built["wide"], device="cuda").close()
                outcomes.append(f"{cap >> 20} MiB: loaded")
                loaded += 1
                if loaded == 3:
                    break
                continue
            except Exception as exc:  # any failure (OOM may surface raw from torch or cuBLAS)
                where = (f"capture of {exc.shape}" if isinstance(exc, CaptureError)
                         else type(exc).__name__)
                oom = "out of memory" in str(exc).lower()
                after = settled()
                outcomes.append(f"{cap >> 20} MiB: {where}{' (OOM)' if oom else ''}, allocated "
                                f"{before[0]}->{after[0]}, reserved {before[1]}->{after[1]}")
                assert after == before, outcomes[-1]
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    print("OOM sweep:\n  " + "\n  ".join(outcomes))
    assert any("capture of 2048x1024 (OOM)" in line for line in outcomes), outcomes
