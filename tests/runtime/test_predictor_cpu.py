"""Inputs a predictor must refuse (with a message listing what it accepts) or answer with a
documented result, padding, output ownership and lifetime, on the CPU."""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qkan_pack import DeviceError, InputError, Predictor, PredictorClosedError, build

from ..conftest import MODELS

ACCEPTED = "1x2 float32 | 64x2 float32"


@pytest.fixture(scope="module")
def mlp(mlp_artifact: Path) -> Predictor:
    with Predictor.load(mlp_artifact) as predictor:
        yield predictor


@pytest.fixture(scope="module")
def padded(mlp_artifact: Path) -> Predictor:
    with Predictor.load(mlp_artifact, pad_batch=True) as predictor:
        yield predictor


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("multi") / "multi"
    build(MODELS / "multi_io.py", [{"a": (2, 3), "b": (2, 4)}, {"a": (8, 3), "b": (8, 4)}],
          output=out, dtype={"b": "int64"})
    return out


def eager_rows(predictor: Predictor, x: torch.Tensor) -> torch.Tensor:
    """Row-by-row reference through the 1x2 shape (QKAN rows are independent)."""
    return torch.cat([predictor(row.reshape(1, 2).contiguous()) for row in x])


# ---------------------------------------------------------------------------
# Refused inputs: each an InputError that lists the accepted shapes
# ---------------------------------------------------------------------------

class _Tagged(torch.Tensor):
    """A user's tensor subclass."""


BAD_INPUTS = {
    "rank too low": lambda: torch.randn(2),
    "rank too high": lambda: torch.randn(1, 1, 2),
    "0-d tensor": lambda: torch.tensor(1.0),
    "wrong width": lambda: torch.randn(1, 3),
    "undeclared batch": lambda: torch.randn(3, 2),
    "zero-size": lambda: torch.randn(0, 2),
    "float64": lambda: torch.randn(1, 2, dtype=torch.float64),
    "float16": lambda: torch.randn(1, 2).half(),
    "int64": lambda: torch.ones(1, 2, dtype=torch.int64),
    "complex": lambda: torch.randn(1, 2, dtype=torch.complex64),
    # round 2, finding 9: a strided nested tensor raised a bare RuntimeError, a masked array
    # was computed with its mask silently dropped
    "nested (strided)": lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(2)]),
    "nested (jagged)": lambda: torch.nested.nested_tensor([torch.zeros(1, 2)] * 2,
                                                          layout=torch.jagged),
    "masked numpy": lambda: np.ma.masked_array(np.ones((1, 2), np.float32), mask=[[0, 1]]),
    # a torch MaskedTensor failed inside the model (CPU) or was copied into the graph's input
    # buffer without its mask (GPU fast path); every tensor subclass is refused up front
    "masked tensor": lambda: torch.masked.masked_tensor(torch.ones(1, 2),
                                                        torch.tensor([[True, False]])),
    "tensor subclass": lambda: torch.randn(1, 2).as_subclass(_Tagged),
    "bool": lambda: torch.ones(1, 2, dtype=torch.bool),
    "numpy float64": lambda: np.zeros((1, 2)),
    "numpy wrong shape": lambda: np.zeros((2, 2), dtype=np.float32),
}


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.filterwarnings("ignore:The PyTorch API of MaskedTensors:UserWarning")
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_lists_what_is_accepted(mlp: Predictor, case: str) -> None:
    with pytest.raises(InputError) as info:
        mlp(BAD_INPUTS[case]())
    assert ACCEPTED in str(info.value)


@pytest.mark.filterwarnings("ignore:The PyTorch API of MaskedTensors:UserWarning")
def test_tensor_subclass_is_named_and_a_parameter_is_plain(mlp: Predictor) -> None:
    masked = torch.masked.masked_tensor(torch.ones(1, 2), torch.tensor([[True, False]]))
    with pytest.raises(InputError, match=r"MaskedTensor, a torch\.Tensor subclass.*fill the masked"):
        mlp(masked)
    with pytest.raises(InputError, match="_Tagged"):
        mlp(x=torch.randn(1, 2).as_subclass(_Tagged))
    x = torch.randn(1, 2)
    torch.testing.assert_close(mlp(torch.nn.Parameter(x)), mlp(x), rtol=0, atol=0)


def test_dtype_error_says_how_to_convert(mlp: Predictor) -> None:
    with pytest.raises(InputError, match=r"has dtype float64.*\.to\(torch\.float32\)"):
        mlp(torch.randn(1, 2, dtype=torch.float64))


def test_zero_d_tensor_is_named(mlp: Predictor) -> None:
    with pytest.raises(InputError, match="0-d tensor"):
        mlp(torch.tensor(1.0))


@pytest.mark.parametrize("value", [[[1.0, 2.0]], None, 1.0, "1x2", np.float32(1.0), (1.0, 2.0)])
def test_non_tensor_refused(mlp: Predictor, value: Any) -> None:
    with pytest.raises(InputError, match=r"pass a torch\.Tensor or numpy\.ndarray") as info:
        mlp(value)
    assert ACCEPTED in str(info.value)


def test_other_device_refused(mlp: Predictor) -> None:
    """A 'meta' tensor stands in for a tensor on a device the predictor is not on."""
    with pytest.raises(InputError, match="is on meta, the predictor on cpu"):
        mlp(torch.empty(1, 2, device="meta"))


def test_sparse_refused(mlp: Predictor) -> None:
    with pytest.raises(InputError, match="dense"):
        mlp(torch.randn(1, 2).to_sparse())


@pytest.mark.parametrize(("args", "kwargs", "says"), [
    ((), {}, "expected 1 input"),
    ((torch.randn(1, 2), torch.randn(1, 2)), {}, "expected 1 input"),
    ((), {"y": torch.randn(1, 2)}, r"unknown input\(s\) \['y'\]"),
    ((torch.randn(1, 2),), {"x": torch.randn(1, 2)}, "both by position and by name"),
])
def test_wrong_number_or_names_of_inputs(mlp: Predictor, args: tuple, kwargs: dict,
                                         says: str) -> None:
    with pytest.raises(InputError, match=says):
        mlp(*args, **kwargs)


def test_multi_input_errors(multi: Path) -> None:
    with Predictor.load(multi) as predictor:
        a, b = torch.randn(2, 3), torch.randint(0, 8, (2, 4))
        with pytest.raises(InputError, match=r"missing input\(s\) \['b'\]"):
            predictor(a=a)
        with pytest.raises(InputError, match="expected 2 input"):
            predictor(a)
        with pytest.raises(InputError, match="input 'b' has dtype float32"):
            predictor(a, b.float())
        with pytest.raises(InputError, match=r"2x3, 8x4 is not in the manifest"):
            predictor(a, torch.randint(0, 8, (8, 4)))
        torch.testing.assert_close(predictor(a, b), predictor(b=b, a=a))


def test_input_error_is_a_value_error(mlp: Predictor) -> None:
    with pytest.raises(ValueError):
        mlp(torch.randn(5, 5))


# ---------------------------------------------------------------------------
# Documented results
# ---------------------------------------------------------------------------


def test_keyword_input_equals_positional(mlp: Predictor) -> None:
    x = torch.randn(1, 2)
    torch.testing.assert_close(mlp(x=x), mlp(x), rtol=0, atol=0)


def test_requires_grad_input_is_read_without_autograd(mlp: Predictor) -> None:
    x = torch.randn(64, 2, requires_grad=True)
    out = mlp(x)
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, mlp(x.detach()), rtol=0, atol=0)
    assert x.grad is None


def test_non_contiguous_input_gives_the_contiguous_result(mlp: Predictor) -> None:
    x = torch.randn(2, 64).t()
    assert not x.is_contiguous()
    torch.testing.assert_close(mlp(x), mlp(x.contiguous()), rtol=0, atol=0)
    strided = torch.randn(64, 4)[:, ::2]
    torch.testing.assert_close(mlp(strided), mlp(strided.contiguous()), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_are_computed_as_given(mlp: Predictor, bad: float) -> None:
    """No check (it would cost a sync per call): non-finite rows give non-finite outputs,
    and other rows are unaffected."""
    x = torch.randn(64, 2)
    clean = mlp(x)
    x[5, 0] = bad
    out = mlp(x)
    assert not torch.isfinite(out[5]).all()
    keep = torch.ones(64, dtype=torch.bool)
    keep[5] = False
    torch.testing.assert_close(out[keep], clean[keep], rtol=0, atol=0)


def test_numpy_in_numpy_out(mlp: Predictor) -> None:
    x = np.random.default_rng(0).standard_normal((64, 2)).astype(np.float32)
    out = mlp(x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (64, 2)
    np.testing.assert_array_equal(out, mlp(torch.from_numpy(x)).numpy())
    transposed = np.ascontiguousarray(x.T).T  # non-contiguous view
    np.testing.assert_array_equal(mlp(transposed), out)
    swapped = x.astype(">f4")  # big-endian
    np.testing.assert_array_equal(mlp(swapped), out)
    frozen = x.copy()
    frozen.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(mlp(frozen), out)


def test_numpy_structured_outputs(multi: Path) -> None:
    with Predictor.load(multi) as predictor:
        a = np.ones((2, 3), dtype=np.float32)
        b = np.zeros((2, 4), dtype=np.int64)
        out = predictor(a, b)
        assert isinstance(out["y"], np.ndarray) and isinstance(out["parts"][1][1], np.ndarray)
        assert out["parts"][1][1].dtype == np.int64
        np.testing.assert_array_equal(out["parts"][1][0], a * 2)


# ---------------------------------------------------------------------------
# Padding (pad_batch=True)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [2, 3, 17, 63])
def test_smaller_batch_is_padded_and_sliced(padded: Predictor, mlp: Predictor, batch: int) -> None:
    x = torch.randn(batch, 2)
    out = padded(x)
    assert out.shape == (batch, 2)
    torch.testing.assert_close(out, eager_rows(mlp, x), rtol=1e-5, atol=1e-6)


def test_padding_limits(padded: Predictor) -> None:
    assert "(smaller batches padded)" in padded.accepted()
    torch.testing.assert_close(padded(torch.ones(64, 2)), padded(torch.ones(64, 2)))
    with pytest.raises(InputError, match="batches up to 64 are padded"):
        padded(torch.randn(65, 2))
    with pytest.raises(InputError, match="cannot be padded"):
        padded(torch.randn(0, 2))
    with pytest.raises(InputError, match="cannot be padded"):
        padded(torch.randn(3, 3))
    with pytest.raises(InputError, match="cannot be padded"):
        padded(torch.randn(3))


def test_without_pad_batch_smaller_batches_are_refused(mlp: Predictor) -> None:
    with pytest.raises(InputError, match="not in the manifest"):
        mlp(torch.randn(3, 2))


def test_padding_multi_input_same_batch(multi: Path) -> None:
    with Predictor.load(multi, pad_batch=True) as predictor, Predictor.load(multi) as exact:
        a, b = torch.randn(8, 3), torch.randint(0, 8, (8, 4))
        with pytest.raises(InputError, match="cannot be padded"):
            predictor(a[:3], b[:4])  # batches disagree
        with pytest.raises(InputError, match="batches up to 8"):
            predictor(torch.randn(9, 3), torch.randint(0, 8, (9, 4)))
        full = exact(a, b)
        assert full["y"].shape == (8, 3)


def test_padding_multi_input_different_widths(multi: Path) -> None:
    with Predictor.load(multi, pad_batch=True) as predictor, Predictor.load(multi) as exact:
        a, b = torch.randn(2, 3), torch.randint(0, 8, (2, 4))
        out = predictor(torch.cat([a, a[:1]]), torch.cat([b, b[:1]]))
        torch.testing.assert_close(out["y"][:2], exact(a, b)["y"])


# ---------------------------------------------------------------------------
# Output ownership
# ---------------------------------------------------------------------------


def test_outputs_are_never_aliased(tmp_path: Path) -> None:
    result = build(MODELS / "aliasing.py", "2x2", output=tmp_path / "alias")
    with Predictor.load(result.path) as predictor:
        x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        first = predictor(x)
        same_x = first[0]
        for out in first:
            assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        model = predictor._model
        internal = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        assert not {t.untyped_storage().data_ptr() for t in first} & internal
        for out in first:
            out.fill_(99.0)  # a caller scribbling on its results changes nothing inside
        x.fill_(-1.0)        # nor does reusing its input buffer change held results
        assert same_x.eq(99.0).all()
        again = predictor(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        torch.testing.assert_close(again[1], torch.tensor([1.0, 2.0]))
        torch.testing.assert_close(again[2], torch.tensor([0.5, -0.5]))
        torch.testing.assert_close(again[4], torch.tensor([[1.5, 3.5], [3.5, 7.5]]))


def test_repeated_calls_return_distinct_tensors(mlp: Predictor) -> None:
    x = torch.randn(1, 2)
    first, second = mlp(x), mlp(x)
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    first.zero_()
    assert second.abs().sum() > 0


# ---------------------------------------------------------------------------
# Lifetime and devices
# ---------------------------------------------------------------------------


class GatedLock:
    """The predictor's lock, holding back one thread (the caller) until ``gate`` is set: it
    lets a test park a call just before it takes the lock, then close the predictor."""

    def __init__(self, inner: Any, gated: threading.Thread | None = None) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.arrived = threading.Event()
        self.gated = gated

    def __enter__(self) -> None:
        if threading.current_thread() is self.gated:
            self.arrived.set()
            self.gate.wait(10)
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


@pytest.mark.parametrize("path", ["first (one tensor)", "first (numpy)", "remembered (one tensor)",
                                  "remembered (numpy)"])
def test_a_call_racing_close_raises_a_clean_error(mlp_artifact: Path, path: str) -> None:
    """Round 2, finding 6: the caller read the runner, close() freed it, the call then ran it
    (TypeError: 'NoneType' object is not callable). Now it finds the predictor closed, on the
    general path and on a remembered signature's plan alike."""
    predictor = Predictor.load(mlp_artifact)
    value = torch.randn(1, 2) if path.endswith("tensor)") else np.ones((1, 2), np.float32)
    if path.startswith("remembered"):
        predictor(value)
        assert len(predictor._calls) == 1
    outcome: list[Any] = []
    caller = threading.Thread(target=lambda: outcome.append(_call_catching(predictor, value)))
    lock = GatedLock(predictor._lock, gated=caller)
    predictor._lock = lock
    caller.start()
    assert lock.arrived.wait(10)
    predictor.close()
    lock.gate.set()
    caller.join(10)
    assert isinstance(outcome[0], PredictorClosedError), outcome
    assert isinstance(outcome[0], InputError) and "closed" in str(outcome[0])


def _call_catching(predictor: Predictor, value: Any) -> Any:
    try:
        return predictor(value)
    except Exception as exc:
        return exc


def test_close_waits_for_the_call_in_flight(mlp_artifact: Path) -> None:
    """A call inside the model when close() is called completes with the right answer; close
    returns only after it; the next call is refused."""
    predictor = Predictor.load(mlp_artifact)
    x = torch.randn(1, 2)
    want = predictor(x)
    inside, release = threading.Event(), threading.Event()
    model = predictor._model
    forward = model.forward

    def slow_forward(*args: Any) -> Any:
        inside.set()
        release.wait(10)
        return forward(*args)

    model.forward = slow_forward
    results: list[Any] = []
    caller = threading.Thread(target=lambda: results.append(predictor(x)))
    caller.start()
    assert inside.wait(10)
    closer = threading.Thread(target=predictor.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while a call was inside the model"
    release.set()
    caller.join(10)
    closer.join(10)
    assert not closer.is_alive()
    torch.testing.assert_close(results[0], want, rtol=0, atol=0)
    with pytest.raises(PredictorClosedError):
        predictor(x)


def test_many_threads_and_a_close_give_right_answers_or_closed(mlp_artifact: Path) -> None:
    """8 threads x 200 calls (exact and padded shapes, numpy and torch) with close() in the
    middle: every call returns the eager answer or PredictorClosedError, nothing else."""
    predictor = Predictor.load(mlp_artifact, pad_batch=True)
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(batch, 2, generator=generator) for batch in (1, 5, 64, 33)]
    with Predictor.load(mlp_artifact, pad_batch=True) as reference:
        wants = [reference(x) for x in inputs]
    counts = {"ok": 0, "closed": 0, "wrong": 0, "other": 0}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        for call in range(200):
            pick = (seed + call) % len(inputs)
            value = inputs[pick] if call % 2 else inputs[pick].numpy()
            try:
                got = torch.as_tensor(predictor(value))
                kind = "ok" if torch.equal(got, wants[pick]) else "wrong"
            except PredictorClosedError:
                kind = "closed"
            except Exception:
                kind = "other"
            with lock:
                counts[kind] += 1

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    while counts["ok"] < 200:
        time.sleep(0.001)
    predictor.close()
    for thread in threads:
        thread.join(60)
    assert counts["wrong"] == 0 and counts["other"] == 0, counts
    assert counts["ok"] >= 200 and counts["ok"] + counts["closed"] == 1600, counts


def test_meta_device_is_a_device_error(mlp_artifact: Path) -> None:
    """Round 2, finding 4 (the device part): a device that holds no data is refused first."""
    for device in ("meta", torch.device("meta")):
        with pytest.raises(DeviceError, match="meta"):
            Predictor.load(mlp_artifact, device=device)


def test_close_and_context_manager(mlp_artifact: Path) -> None:
    predictor = Predictor.load(mlp_artifact)
    assert "ready" in repr(predictor)
    predictor(torch.randn(1, 2))
    predictor.close()
    predictor.close()  # idempotent
    assert "closed" in repr(predictor)
    with pytest.raises(InputError, match="closed"):
        predictor(torch.randn(1, 2))
    with Predictor.load(mlp_artifact) as managed:
        managed(torch.randn(1, 2))
    with pytest.raises(InputError, match="closed"):
        managed(torch.randn(1, 2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only host behaviour")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:7", torch.device("cuda")])
def test_cuda_on_a_cpu_host_is_a_device_error(mlp_artifact: Path, device: Any) -> None:
    with pytest.raises(DeviceError, match="CUDA is not available"):
        Predictor.load(mlp_artifact, device=device)


@pytest.mark.parametrize("device", ["meta", "tpu", "cuda:x", "", "cpu:zero"])
def test_unusable_devices_are_device_errors(mlp_artifact: Path, device: str) -> None:
    with pytest.raises(DeviceError, match="write cpu, cuda, cuda:N or auto"):
        Predictor.load(mlp_artifact, device=device)


def test_load_report_on_cpu(mlp: Predictor) -> None:
    report = mlp.report
    assert report.device == "cpu" and report.capture_policy == "eager (no CUDA)"
    assert [r.label for r in report.shapes] == ["1x2", "64x2"]
    assert {"verify", "import", "build", "weights"} <= set(report.stages)
    assert mlp.digest.startswith("sha256:") and len(mlp.digest) == 7 + 64
    assert "artifact" in str(report)


def test_captures_clear_cublas_workspaces_on_entry_and_exit(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The capture session clears torch's cuBLAS workspace cache before (so the capture
    allocates its own, in the graph pool) and after (so nothing eager shares it), even when
    the capture fails; without the private hook it does nothing."""
    from qkan_pack.runtime import _capture as capture

    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("clear"),
                        raising=False)
    with capture.capture_session():
        calls.append("capture")
    assert calls == ["clear", "capture", "clear"]
    calls.clear()
    with pytest.raises(RuntimeError, match="capture failed"), capture.capture_session():
        raise RuntimeError("capture failed")
    assert calls == ["clear", "clear"]
    monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces")
    capture.clear_cublas_workspaces()  # absent in a future torch: a no-op, not an error


def test_capture_sessions_run_one_at_a_time() -> None:
    """A second thread's session (and its cache clear) waits until the first has finished
    capturing, so it cannot free a workspace that graph has baked in."""
    import threading

    from qkan_pack.runtime import _capture as capture

    first_inside, release, second_inside = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with capture.capture_session():
            first_inside.set()
            release.wait(10)

    def second() -> None:
        first_inside.wait(10)
        with capture.capture_session():
            second_inside.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    assert first_inside.wait(10)
    assert not second_inside.wait(0.3), "a second capture session ran during the first"
    release.set()
    for thread in threads:
        thread.join(10)
    assert second_inside.is_set()


def test_model_code_failing_in_a_call_names_the_stage(gpt_artifact: Path) -> None:
    """A token id beyond the embedding: the model's own IndexError, wrapped once."""
    from qkan_pack import ModelSourceError

    with Predictor.load(gpt_artifact) as predictor, pytest.raises(ModelSourceError) as info:
        predictor(torch.full((1, 16), 10_000, dtype=torch.int64))
    assert info.value.stage == "call" and isinstance(info.value.__cause__, IndexError)
    assert "(call)" in str(info.value)


def test_no_whole_graph_on_the_cpu_and_none_after_close(mlp_artifact: Path) -> None:
    """``whole_graph`` (the bare-replay baseline of ``bench --cold``) is a CUDA graph or None;
    a closed predictor says it is closed."""
    predictor = Predictor.load(mlp_artifact, "cpu", progress=False)
    assert predictor.whole_graph(0) is None
    predictor.close()
    with pytest.raises(PredictorClosedError):
        predictor.whole_graph(0)


def test_load_report_columns_fit_long_named_input_labels(tmp_path: Path) -> None:
    """Audit: a keyword shape label longer than the column ran into the policy column
    ('...attention_mask:1x16eager')."""
    source = tmp_path / "named.py"
    source.write_text("import torch\n\n"
                      "class Net(torch.nn.Module):\n"
                      "    def forward(self, hidden_states, attention_mask):\n"
                      "        return hidden_states * attention_mask\n\n"
                      "def build_model():\n    return Net()\n")
    artifact = build(source, [{"hidden_states": (1, 16), "attention_mask": (1, 16)}],
                     output=tmp_path / "a").path
    with Predictor.load(artifact) as predictor:
        table = str(predictor.report).splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("shape"))
    policy_at = table[header].index("policy")
    (row,) = table[header + 1:header + 2]
    assert len(predictor.report.shapes[0].label) > 18
    assert row[policy_at - 1] == " " and row[policy_at:].startswith("eager"), row


def test_a_0d_numpy_array_is_refused_like_a_0d_tensor(mlp: Predictor) -> None:
    """Audit: ``np.ascontiguousarray`` made a 0-d array 1-d, so it was served as a row of one
    element where the same value as a 0-d tensor is refused."""
    for value in (torch.tensor(0.5), np.array(0.5, dtype=np.float32)):
        with pytest.raises(InputError, match=r"shape \(\)"):
            mlp(value)
