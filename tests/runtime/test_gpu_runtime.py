"""The CUDA-graph runtime on a real GPU (``pytest -m gpu``; skipped without CUDA).

Every comparison is against eager PyTorch on the same device, on fresh random inputs.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from qkan_pack import ArtifactError, CaptureError, DeviceError, InputError, Predictor, build
from qkan_pack.runtime import read_artifact, rebuild_model
from qkan_pack.runtime._capture import clear_cublas_workspaces

from ..conftest import EXAMPLES, MODELS

pytestmark = pytest.mark.gpu
TIGHT = {"rtol": 1e-5, "atol": 1e-6}
CALLS_PER_THREAD = 2000  # 16 threads x 2,000 calls, mixed shapes (reliability issue)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu")
    specs = {
        "mlp": (EXAMPLES / "qkan_mlp.py", "1x2,64x2", {}, "float32"),
        "mlp64": (EXAMPLES / "qkan_mlp.py", "1x64,8x64",
                  {"width": [64, 64, 64], "reps": 3}, "float32"),
        "gpt": (EXAMPLES / "hqkan_gpt.py", "1x128,8x128", {}, "int64"),
        "item": (MODELS / "gpu_item_model.py", "1x4,8x4", {}, "float32"),
    }
    paths = {}
    for name, (source, shapes, config, dtype) in specs.items():
        paths[name] = root / name
        build(source, shapes, output=paths[name], config=config, dtype=dtype)
    paths["item_full"] = root / "item_full"
    build(MODELS / "gpu_item_model.py", "1x4", output=paths["item_full"], capture="full")
    paths["multi"] = root / "multi"
    build(MODELS / "gpu_multi_io.py", [{"a": (2, 3), "b": (2, 3)}, {"a": (16, 3), "b": (16, 3)}],
          output=paths["multi"])
    return paths


def eager_model(path: Path, device: str = "cuda") -> torch.nn.Module:
    artifact = read_artifact(path)
    return rebuild_model(artifact, torch.device(device), dict(artifact.manifest.model.config))


def fresh_input(shape: tuple[int, ...], dtype: str, device: str = "cuda") -> torch.Tensor:
    if dtype == "int64":
        return torch.randint(0, 256, shape, device=device)
    return torch.randn(shape, device=device)


def assert_matches_eager(predictor: Predictor, eager: torch.nn.Module, calls: int = 1) -> None:
    """``calls`` fresh random inputs per manifest shape: the predictor equals eager."""
    dtype = predictor.manifest.inputs[0].dtype
    for entry in predictor.manifest.shapes:
        for _ in range(calls):
            x = fresh_input(entry.inputs[0][1], dtype)
            with torch.no_grad():
                want = eager(x)
            torch.testing.assert_close(predictor(x), want, **TIGHT)


@pytest.mark.parametrize("name", ["mlp", "mlp64", "gpt"])
def test_replay_matches_eager_on_every_shape(built: dict[str, Path], name: str) -> None:
    with Predictor.load(built[name], device="cuda") as predictor:
        eager = eager_model(built[name])
        assert predictor.report.solvers == ["flash"]
        assert all(r.policy == "full" for r in predictor.report.shapes), predictor.report
        assert_matches_eager(predictor, eager, calls=3)


def test_rejects_shapes_and_dtypes_outside_the_manifest(built: dict[str, Path]) -> None:
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        with pytest.raises(InputError, match=r"1x2 float32 \| 64x2 float32"):
            predictor(torch.randn(2, 2, device="cuda"))
        with pytest.raises(InputError, match="dtype float64"):
            predictor(torch.randn(1, 2, device="cuda", dtype=torch.float64))
        with pytest.raises(InputError):
            predictor(torch.randn(1, 2, 1, device="cuda"))


def test_earlier_outputs_survive_later_calls_across_shapes(built: dict[str, Path]) -> None:
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        first = predictor(torch.randn(1, 2, device="cuda"))
        kept = first.clone()
        predictor(torch.randn(1, 2, device="cuda"))
        predictor(torch.randn(64, 2, device="cuda"))
        torch.testing.assert_close(first, kept, rtol=0, atol=0)


def test_copy_outputs_false_returns_the_static_buffer(built: dict[str, Path]) -> None:
    with Predictor.load(built["mlp"], device="cuda", copy_outputs=False) as predictor:
        first = predictor(torch.randn(1, 2, device="cuda"))
        second = predictor(torch.randn(1, 2, device="cuda"))
        assert first.data_ptr() == second.data_ptr()  # documented: overwritten by the next call


def test_threads_with_mixed_shapes_give_sequential_results(built: dict[str, Path]) -> None:
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        eager = eager_model(built["mlp"])
        inputs = [torch.randn(shape, device="cuda") for shape in [(1, 2), (64, 2)] * 8]
        with torch.no_grad():
            expected = [eager(x) for x in inputs]
        failures: list[str] = []
        kept: list[tuple[int, torch.Tensor]] = []

        def worker(offset: int) -> None:
            torch.cuda.set_device(0)
            for step in range(CALLS_PER_THREAD):
                i = (offset + step) % len(inputs)
                y = predictor(inputs[i])
                if not torch.allclose(y, expected[i], **TIGHT):
                    failures.append(f"thread {offset} step {step}")
                if step % 100 == 0:
                    kept.append((i, y))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        torch.cuda.synchronize()
        assert failures == []
        assert all(torch.allclose(y, expected[i], **TIGHT) for i, y in kept)  # held outputs intact
        print(f"{len(threads)} threads x {CALLS_PER_THREAD} calls: {len(failures)} mismatches")


def test_auto_falls_back_to_submodules_when_forward_syncs(built: dict[str, Path]) -> None:
    with Predictor.load(built["item"], device="cuda") as predictor:
        assert [r.policy for r in predictor.report.shapes] == ["submodules", "submodules"]
        assert all(r.fallback_reason for r in predictor.report.shapes)
        eager = eager_model(built["item"])
        for shape in [(1, 4), (8, 4)]:
            x = torch.randn(shape, device="cuda")
            with torch.no_grad():
                want = eager(x)
            torch.testing.assert_close(predictor(x), want, **TIGHT)


def test_any_model_falls_back_to_its_graph_safe_blocks(tmp_path: Path) -> None:
    """No qkan modules: the fallback finds the largest blocks that capture and replay
    correctly (the encoder and the head), leaving only the .item() glue eager."""
    path = build(MODELS / "plain_item_model.py", "1x8,4x8", output=tmp_path / "plain").path
    with Predictor.load(path, device="cuda") as predictor:
        assert [r.policy for r in predictor.report.shapes] == ["submodules", "submodules"]
        assert all(r.graphs == 2 for r in predictor.report.shapes), predictor.report
        assert "aten::_local_scalar_dense" in predictor.report.shapes[0].fallback_reason
        eager = eager_model(path)
        for shape in [(1, 8), (4, 8), (1, 8)]:
            x = torch.randn(shape, device="cuda")
            with torch.no_grad():
                want = eager(x)
            torch.testing.assert_close(predictor(x), want, **TIGHT)


def test_full_policy_names_the_shape_and_leaves_cuda_usable(built: dict[str, Path]) -> None:
    with pytest.raises(CaptureError, match="shape 1x4") as info:
        Predictor.load(built["item_full"], device="cuda")
    assert info.value.shape == "1x4" and info.value.module is None
    assert "aten::_local_scalar_dense" in info.value.op and "gpu_item_model.py:18" in info.value.op
    assert torch.ones(3, device="cuda").sum().item() == 3.0
    assert torch.rand(2, device="cuda").max().item() < 1.0  # RNG left out of capture mode
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        assert predictor(torch.randn(1, 2, device="cuda")).shape == (1, 2)


def test_explicit_device_index(built: dict[str, Path]) -> None:
    count = torch.cuda.device_count()
    torch.cuda.set_device(count - 1)
    with Predictor.load(built["mlp"], device="cuda:0") as predictor:
        assert predictor.device == torch.device("cuda", 0)
        y = predictor(torch.randn(1, 2, device="cuda:0"))
        assert y.device == torch.device("cuda", 0)
    torch.cuda.set_device(0)
    with pytest.raises(DeviceError, match=f"has {count} CUDA device"):
        Predictor.load(built["mlp"], device=f"cuda:{count}")


def test_the_context_starts_beside_verification_and_no_thread_outlives_a_load(
        built: dict[str, Path], tmp_path: Path) -> None:
    """Verification overlaps the GPU context's creation: a refused artifact still reports
    its own error (not a CUDA one) and leaves no context thread; a good one imports the model
    source before it waits for the context."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(built["mlp"], broken)
    weights = broken / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[int(len(data) * 0.7)] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        Predictor.load(broken, device="cuda")
    threads = [t.name for t in threading.enumerate()]
    assert "qkan-pack-cuda-context" not in threads
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        stages = list(predictor.report.stages)  # in the order they ran
        # the model source is imported (CPU work) while the context is being created
        assert stages.index("import") < stages.index("cuda init") < stages.index("first forward")
        assert "qkan-pack-cuda-context" not in [t.name for t in threading.enumerate()]


def test_a_context_start_during_another_threads_capture_leaves_it_intact() -> None:
    """Audit: the context thread synchronized the whole device, which CUDA forbids while any
    stream captures; a load starting while another thread captured would have broken that
    capture. Now it only allocates and runs one matmul, allowed beside a thread-local capture."""
    from qkan_pack.runtime._device import ContextStart

    x = torch.randn(64, 64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x @ x  # warm cuBLAS on the capturing stream first, as the capture recipe does
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        y = x @ x + 1
        ContextStart(torch.device("cuda", torch.cuda.current_device())).wait()
    x.copy_(torch.randn(64, 64, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x @ x + 1, **TIGHT)


def test_eight_shapes_share_one_pool(tmp_path: Path) -> None:
    config = {"width": [64, 64, 64], "reps": 3}
    batches = [1, 2, 4, 8, 16, 32, 64, 128]
    build(EXAMPLES / "qkan_mlp.py", ",".join(f"{b}x64" for b in batches),
          output=tmp_path / "eight", config=config)
    build(EXAMPLES / "qkan_mlp.py", "128x64", output=tmp_path / "one", config=config)
    with Predictor.load(tmp_path / "one", device="cuda") as alone:
        largest = alone.report.pool_bytes
    with Predictor.load(tmp_path / "eight", device="cuda") as shared:
        total = shared.report.pool_bytes
    print(f"pool bytes: 8 shapes {total}, largest alone {largest}, ratio {total / largest:.2f}")
    assert largest > 0 and total <= 1.5 * largest


def test_pad_batch_pads_and_slices(built: dict[str, Path]) -> None:
    eager = eager_model(built["mlp"])
    with Predictor.load(built["mlp"], device="cuda", pad_batch=True) as predictor:
        x = torch.randn(3, 2, device="cuda")
        with torch.no_grad():
            want = eager(x)
        torch.testing.assert_close(predictor(x), want, **TIGHT)
        with pytest.raises(InputError, match="cannot be padded"):
            predictor(torch.randn(65, 2, device="cuda"))


def test_cpu_tensors_and_numpy_in_come_back_the_same_kind(built: dict[str, Path]) -> None:
    eager = eager_model(built["mlp"])
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        x = torch.randn(64, 2)
        with torch.no_grad():
            want = eager(x.cuda()).cpu()
        y = predictor(x)
        assert y.device.type == "cpu"
        torch.testing.assert_close(y, want, **TIGHT)
        z = predictor(x.numpy())
        assert isinstance(z, np.ndarray)
        np.testing.assert_allclose(z, want.numpy(), rtol=1e-5, atol=1e-6)
    # audit: with zero-copy outputs, numpy in gave the static CUDA buffers to .numpy()
    with Predictor.load(built["mlp"], device="cuda", copy_outputs=False) as predictor:
        z = predictor(x.numpy())
        assert isinstance(z, np.ndarray)
        np.testing.assert_allclose(z, want.numpy(), rtol=1e-5, atol=1e-6)


def test_several_inputs_and_dict_outputs(built: dict[str, Path]) -> None:
    eager = eager_model(built["multi"])
    with Predictor.load(built["multi"], device="cuda") as predictor:
        a, b = torch.randn(16, 3, device="cuda"), torch.randn(16, 3, device="cuda")
        with torch.no_grad():
            want = eager(a, b)
        got = predictor(a, b=b)
        assert set(got) == {"y", "parts"} and isinstance(got["parts"], tuple)
        torch.testing.assert_close(got, want, **TIGHT)


def test_close_frees_the_pool(built: dict[str, Path]) -> None:
    clear_cublas_workspaces()  # a load frees cached workspaces: not a baseline
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    predictor = Predictor.load(built["gpt"], device="cuda")
    assert torch.cuda.memory_allocated() > before
    predictor.close()
    with pytest.raises(InputError, match="closed"):
        predictor(torch.zeros(1, 128, dtype=torch.int64, device="cuda"))
    assert torch.cuda.memory_allocated() <= before + 2**20


def test_two_artifacts_and_the_same_artifact_twice(built: dict[str, Path]) -> None:
    first = Predictor.load(built["mlp"], device="cuda")
    second = Predictor.load(built["gpt"], device="cuda")
    third = Predictor.load(built["mlp"], device="cuda")
    try:
        x = torch.randn(64, 2, device="cuda")
        torch.testing.assert_close(first(x), third(x), rtol=0, atol=0)
        tokens = torch.randint(0, 256, (1, 128), device="cuda")
        with torch.no_grad():
            want = eager_model(built["gpt"])(tokens)
        torch.testing.assert_close(second(tokens), want, **TIGHT)
    finally:
        for predictor in (first, second, third):
            predictor.close()


def test_cross_solver_self_test_is_recorded(built: dict[str, Path]) -> None:
    with Predictor.load(built["mlp64"], device="cuda") as predictor:
        report = predictor.report
        assert report.factory_device == "cuda:0"
        assert report.reference_tolerance == (2e-3, 2e-4)
        assert all(0 <= r.reference_max_abs < 1e-3 for r in report.shapes)
        print(str(report))


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_replay_survives_other_code_clearing_cublas_workspaces(built: dict[str, Path],
                                                              name: str) -> None:
    """torch.compile(mode="reduce-overhead") clears torch's cuBLAS workspaces around every
    recording. A graph that baked in an eagerly allocated workspace then writes into memory
    the allocator has released (illegal address, seen on an H200) or lent to other tensors."""
    with Predictor.load(built[name], device="cuda") as predictor:
        eager = eager_model(built[name])
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        fillers = [torch.full((n * 2**18,), float("nan"), device="cuda")
                   for n in (1, 2, 4, 8, 16, 32, 64, 128) for _ in range(4)]
        assert_matches_eager(predictor, eager, calls=3)
        torch.cuda.synchronize()
        assert all(bool(torch.isnan(f).all()) for f in fillers), "a replay wrote into freed memory"


def test_predictor_next_to_torch_compile_reduce_overhead(built: dict[str, Path]) -> None:
    """In one process, torch.compile's CUDA graphs are recorded after the predictor's, between
    its calls: both stay correct (the order that crashed before workspaces were pooled)."""
    with Predictor.load(built["mlp"], device="cuda") as predictor:
        eager = eager_model(built["mlp"])
        compiled = torch.compile(eager_model(built["mlp"]), mode="reduce-overhead", dynamic=False)
        try:
            with torch.no_grad():
                for entry in [*predictor.manifest.shapes, *predictor.manifest.shapes]:
                    x = fresh_input(entry.inputs[0][1], "float32")
                    want = eager(x)
                    torch.testing.assert_close(predictor(x), want, **TIGHT)
                    for _ in range(3):
                        got = compiled(x).clone()
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
                    torch.testing.assert_close(predictor(x), want, **TIGHT)
            torch.cuda.synchronize()
        finally:
            torch._dynamo.reset()


def test_concurrent_loads_from_threads(built: dict[str, Path]) -> None:
    """Loads on several threads at once (each clears torch's cuBLAS workspace cache around its
    captures) give predictors that all match eager."""
    names = ["mlp", "gpt", "mlp64", "gpt"]
    loaded: dict[int, Predictor] = {}
    errors: list[BaseException] = []

    def load(slot: int) -> None:
        try:
            loaded[slot] = Predictor.load(built[names[slot]], device="cuda")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(slot,)) for slot in range(len(names))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        clear_cublas_workspaces()
        torch.cuda.empty_cache()
        for slot, name in enumerate(names):
            assert_matches_eager(loaded[slot], eager_model(built[name]))
    finally:
        for predictor in loaded.values():
            predictor.close()
