"""Remembered call plans (``runtime/_calls``): a call whose signature passed before skips the
checks and goes straight to copy in, replay, copy out. It must answer exactly as the general
path would -- the same result, of the same kind, or the same refusal -- whatever came before
it, from any number of threads, in a bounded memory.

The general path is ``Predictor._first_call`` with no key (checked, not remembered). Graph
runners are exercised on the CPU with stand-in graphs (``EagerReplay``): their replay runs
the model on the static input buffers into the static output buffers, as a captured graph
does, so that the runner's copy in (padding included), copy out and buffer reuse run as on
a GPU.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkan_pack import InputError, Predictor, PredictorClosedError, build
from qkan_pack.runtime import _calls, flatten
from qkan_pack.runtime._capture import ShapeGraph
from qkan_pack.runtime._runners import GraphRunner

from ..conftest import MODELS
from .conftest import both_paths, described, outcome

Call = tuple[tuple, dict[str, Any]]


class EagerReplay:
    """A captured graph's stand-in on the CPU: ``replay`` computes the model from the static
    inputs into the static outputs (a graph reads and writes only those)."""

    def __init__(self, forward: Callable[..., Any], inputs: list[torch.Tensor],
                 outputs: list[torch.Tensor]) -> None:
        self.forward, self.inputs, self.outputs = forward, inputs, outputs

    def replay(self) -> None:
        with torch.no_grad():
            for buffer, leaf in zip(self.outputs, flatten(self.forward(*self.inputs))):
                buffer.copy_(leaf)


def with_stand_in_graphs(predictor: Predictor) -> Predictor:
    """The CPU predictor served by a ``GraphRunner`` whose graphs are ``EagerReplay``s."""
    eager = predictor._runner
    runner = GraphRunner(predictor._model, eager.forward, torch.device("cpu"))
    runner._current_stream = lambda: "the one stream"  # CPU torch has no CUDA streams
    runner._last_stream_id = "the one stream"
    for index, entry in enumerate(predictor.manifest.shapes):
        inputs = [torch.zeros(shape, dtype=getattr(torch, spec.dtype)) for (_, shape), spec
                  in zip(entry.inputs, predictor.manifest.inputs)]
        with torch.no_grad():
            outputs = [leaf.clone() for leaf in flatten(eager.forward(*inputs))]
        graph = EagerReplay(eager.forward, inputs, outputs)
        runner._full[index] = ShapeGraph(graph, inputs, outputs)  # type: ignore[arg-type]
    predictor._runner = runner
    return predictor


def load(path: Path, graphs: bool, **options: Any) -> Predictor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pad_batch
        predictor = Predictor.load(path, progress=False, **options)
    return with_stand_in_graphs(predictor) if graphs else predictor


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two inputs (float32 and int64) and a nested dict/tuple/list output."""
    out = tmp_path_factory.mktemp("multi") / "multi"
    build(MODELS / "multi_io.py", [{"a": (2, 3), "b": (2, 4)}, {"a": (8, 3), "b": (8, 4)}],
          output=out, dtype={"b": "int64"}, progress=False)
    return out


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Declared padding (batch and length) of two int64 inputs, proved at build."""
    from qkan_pack.format import with_batch_sizes

    shapes = with_batch_sizes([{"input_ids": (8,), "attention_mask": (8,)},
                               {"input_ids": (16,), "attention_mask": (16,)}], [1, 4])
    return build(MODELS / "pad_models.py", shapes, dtype="int64",
                 config={"kind": "masked_meanpool"}, output=tmp_path_factory.mktemp("m") / "m",
                 pad={"input_ids": 0, "attention_mask": 0}, progress=False).path


# ---------------------------------------------------------------------------
# Calls of the qkan MLP (one float32 input x, 1x2 and 64x2): right ones and wrong ones
# ---------------------------------------------------------------------------


class _Tagged(torch.Tensor):
    """A user's tensor subclass."""


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _parameter(rows: int) -> torch.Tensor:
    return torch.nn.Parameter(torch.randn(rows, 2))


def _grad(rows: int) -> torch.Tensor:
    return torch.randn(rows, 2, requires_grad=True)


def _masked_numpy() -> np.ndarray:
    return np.ma.masked_array(np.ones((1, 2), np.float32), mask=[[0, 1]])


def _nested() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(2)])


MLP_CALLS: dict[str, Callable[[], Call]] = {
    "tensor 1x2": lambda: ((torch.randn(1, 2),), {}),
    "tensor 64x2": lambda: ((torch.randn(64, 2),), {}),
    "keyword 64x2": lambda: ((), {"x": torch.randn(64, 2)}),
    "numpy 1x2": lambda: ((np.random.default_rng().standard_normal((1, 2), np.float32),), {}),
    "numpy keyword 64x2": lambda: ((), {"x": np.random.default_rng().standard_normal(
        (64, 2), np.float32)}),
    "non-contiguous tensor 64x2": lambda: ((torch.randn(2, 64).T,), {}),
    "non-contiguous numpy 64x2": lambda: ((np.random.default_rng().standard_normal(
        (2, 64), np.float32).T,), {}),
    "read-only numpy 1x2": lambda: ((_read_only(np.ones((1, 2), np.float32)),), {}),
    "big-endian numpy 1x2": lambda: ((np.ones((1, 2), ">f4"),), {}),
    "requires grad 1x2": lambda: ((_grad(1),), {}),
    "parameter 64x2": lambda: ((_parameter(64),), {}),
    "padded 5x2": lambda: ((torch.randn(5, 2),), {}),
    "padded numpy 17x2": lambda: ((np.ones((17, 2), np.float32),), {}),
    # wrong, mostly with the shape of a right one
    "float64 1x2": lambda: ((torch.randn(1, 2, dtype=torch.float64),), {}),
    "int64 numpy 1x2": lambda: ((np.ones((1, 2), np.int64),), {}),
    "sparse 1x2": lambda: ((torch.randn(1, 2).to_sparse(),), {}),
    "meta 1x2": lambda: ((torch.empty(1, 2, device="meta"),), {}),
    "nested": lambda: ((_nested(),), {}),
    "subclass 1x2": lambda: ((torch.randn(1, 2).as_subclass(_Tagged),), {}),
    "masked numpy 1x2": lambda: ((_masked_numpy(),), {}),
    "width 3": lambda: ((torch.randn(1, 3),), {}),
    "batch 65": lambda: ((torch.randn(65, 2),), {}),
    "0-d": lambda: ((torch.tensor(1.0),), {}),
    "list": lambda: (([[1.0, 2.0]],), {}),
    "two values": lambda: ((torch.randn(1, 2), torch.randn(1, 2)), {}),
    "none": lambda: ((), {}),
    "unknown name": lambda: ((), {"y": torch.randn(1, 2)}),
    "extra name": lambda: ((torch.randn(1, 2),), {"y": torch.randn(1, 2)}),
    "both ways": lambda: ((torch.randn(1, 2),), {"x": torch.randn(1, 2)}),
}


@pytest.fixture(scope="module", params=["eager runner", "graph runner"])
def mlps(request: pytest.FixtureRequest, mlp_artifact: Path) -> Iterator[list[Predictor]]:
    """The MLP as loaded (exact shapes), with pad_batch, and with outputs not copied."""
    graphs = request.param == "graph runner"
    predictors = [load(mlp_artifact, graphs), load(mlp_artifact, graphs, pad_batch=True),
                  load(mlp_artifact, graphs, copy_outputs=False)]
    yield predictors
    for predictor in predictors:
        predictor.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(sorted(MLP_CALLS))),
                min_size=1, max_size=12))
def test_any_sequence_of_calls_answers_as_the_general_path(mlps: list[Predictor],
                                                           calls: list[tuple[int, str]]) -> None:
    """Right and wrong calls in any order (a wrong one after a right one of the same shape,
    dtype or kind; a right one seen many times) answer as the general path does."""
    for which, name in calls:
        predictor = mlps[which]
        args, kwargs = MLP_CALLS[name]()
        fast, general = both_paths(predictor, args, kwargs)
        assert fast == general, name


RIGHT = ["tensor 1x2", "tensor 64x2", "keyword 64x2", "numpy 1x2", "numpy keyword 64x2",
         "non-contiguous tensor 64x2", "non-contiguous numpy 64x2", "read-only numpy 1x2",
         "big-endian numpy 1x2", "requires grad 1x2", "parameter 64x2"]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager runner", "graph runner"])
def test_a_remembered_signature_skips_the_checks_and_reads_new_values(
        mlp_artifact: Path, graphs: bool) -> None:
    """After one round of right calls, every later call takes its signature's plan (no
    matching), on whatever values it brings, and answers as a fresh predictor's general path
    does on the same values."""
    with load(mlp_artifact, graphs) as predictor, load(mlp_artifact, False) as fresh:
        matched: list[tuple] = []
        match = predictor._inputs.match
        predictor._inputs.match = lambda *a: matched.append(a) or match(*a)  # type: ignore[method-assign]
        for round_ in range(3):
            for name in RIGHT:
                args, kwargs = MLP_CALLS[name]()
                got = outcome(lambda: predictor(*args, **kwargs))  # noqa: B023
                assert got[0] == "answered", (name, got)
                assert got == outcome(lambda: fresh._first_call(None, args, kwargs)), name  # noqa: B023
            if round_ == 0:
                assert matched, "the first round takes the general path"
                matched.clear()
        assert matched == []
        buffers = [predictor._runner._full[i].static_inputs[0] for i in (0, 1)] if graphs else []
        assert not any(t.requires_grad for t in buffers), "a copy in recorded autograd"


class _Array(np.ndarray):
    """A user's ndarray subclass."""


def test_an_ndarray_subclass_is_answered_but_never_remembered(mlp_artifact: Path) -> None:
    with load(mlp_artifact, graphs=False) as predictor:
        value = np.ones((1, 2), np.float32).view(_Array)
        for _ in range(2):
            assert type(predictor(value)) is np.ndarray
        assert len(predictor._calls) == 0


# ---------------------------------------------------------------------------
# Several inputs, keywords in any order, structured outputs, declared padding
# ---------------------------------------------------------------------------


def _ab(rows: int, numpy: bool = False) -> tuple[Any, Any]:
    a, b = torch.randn(rows, 3), torch.randint(0, 8, (rows, 4))
    return (a.numpy(), b.numpy()) if numpy else (a, b)


MULTI_CALLS: dict[str, Callable[[], Call]] = {
    "positional": lambda: (_ab(8), {}),
    "mixed": lambda: (_ab(2)[:1], {"b": _ab(2)[1]}),
    "keywords": lambda: ((), dict(zip("ab", _ab(8)))),
    "keywords reversed": lambda: ((), dict(zip("ba", reversed(_ab(8))))),
    "numpy": lambda: (_ab(2, numpy=True), {}),
    "numpy and tensor": lambda: ((_ab(8, numpy=True)[0], _ab(8)[1]), {}),
    "padded": lambda: (_ab(5), {}),
    "b as float": lambda: ((torch.randn(8, 3), torch.randn(8, 4)), {}),
    "batches differ": lambda: ((torch.randn(8, 3), torch.randint(0, 8, (2, 4))), {}),
    "a missing": lambda: ((), {"b": _ab(2)[1]}),
}


@pytest.mark.parametrize("graphs", [False, True], ids=["eager runner", "graph runner"])
def test_several_inputs_answer_as_the_general_path(multi: Path, graphs: bool) -> None:
    with load(multi, graphs, pad_batch=True) as padded, load(multi, graphs) as exact:
        for predictor in (exact, padded):
            for _ in range(3):
                for name, make in MULTI_CALLS.items():
                    args, kwargs = make()
                    fast, general = both_paths(predictor, args, kwargs)
                    assert fast == general, name
        assert padded(*_ab(5))["y"].shape == (5, 3)


def test_declared_padding_answers_as_the_general_path_and_as_eager(masked: Path) -> None:
    """Padded calls into graphs whose buffers hold an earlier, larger call (the pad values
    must be written again each time) answer as the general path and as the eager runner,
    which pads into a fresh tensor."""
    with load(masked, graphs=True) as predictor, load(masked, graphs=False) as eager:
        for batch, length in [(2, 5), (2, 5), (4, 16), (1, 9), (2, 5), (3, 12), (5, 8), (2, 17),
                              (4, 16), (3, 12), (4, 8), (2, 5)]:
            ids = torch.randint(1, 50, (batch, length))
            mask = torch.ones(batch, length, dtype=torch.int64)
            for args, kwargs in [((ids, mask), {}), ((), {"attention_mask": mask,
                                                          "input_ids": ids})]:
                fast, general = both_paths(predictor, args, kwargs)
                assert fast == general == outcome(lambda: eager(*args, **kwargs)), (  # noqa: B023
                    batch, length)


# ---------------------------------------------------------------------------
# Threads, memory, lifetime
# ---------------------------------------------------------------------------


def test_many_threads_share_the_plans_and_the_memory_stays_bounded(
        mlp_artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 threads, 12 signatures against a memory of 4 (evictions all the time), a 1 us switch
    interval, graph buffers shared by every call: each answer is its own input's, and the
    memory never holds more than its bound."""
    monkeypatch.setattr(_calls, "CALL_MEMORY", 4)
    predictor = load(mlp_artifact, graphs=True, pad_batch=True)
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(rows, 2, generator=generator) for rows in (1, 64, 5, 33, 2, 9)]
    inputs += [x.numpy() for x in inputs]
    with load(mlp_artifact, graphs=False, pad_batch=True) as reference:
        wants = [described(reference(x)) for x in inputs]
    failures: list[str] = []
    largest = [0]

    def worker(offset: int) -> None:
        try:
            for step in range(300):
                pick = (offset * 5 + step) % len(inputs)
                if described(predictor(inputs[pick])) != wants[pick]:
                    failures.append(f"thread {offset} call {step}: input {pick}")
                largest[0] = max(largest[0], len(predictor._calls))
        except BaseException as exc:  # handed to the test thread
            failures.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
        predictor.close()
    assert failures == []
    assert 0 < largest[0] <= 4


def test_the_oldest_signature_goes_first(mlp_artifact: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """At most ``CALL_MEMORY`` plans, the first remembered forgotten first; a refused call
    leaves none."""
    monkeypatch.setattr(_calls, "CALL_MEMORY", 3)
    sign = _calls.call_signature
    with load(mlp_artifact, graphs=False) as predictor:
        x = torch.randn(1, 2)
        predictor(x)
        predictor(x.numpy())
        with pytest.raises(InputError):
            predictor(x.double())
        predictor(torch.randn(64, 2))
        assert list(predictor._calls.plans) == [sign((x,), {}), sign((x.numpy(),), {}),
                                                sign((torch.randn(64, 2),), {})]
        predictor(torch.randn(1, 2, requires_grad=True))
        assert list(predictor._calls.plans) == [sign((x.numpy(),), {}),
                                                sign((torch.randn(64, 2),), {}),
                                                sign((torch.randn(1, 2, requires_grad=True),),
                                                     {})]


def test_close_forgets_the_plans_and_refuses_a_remembered_signature(mlp_artifact: Path) -> None:
    predictor = load(mlp_artifact, graphs=True)
    x = torch.randn(1, 2)
    predictor(x)
    assert len(predictor._calls) == 1
    predictor.close()
    assert len(predictor._calls) == 0
    with pytest.raises(PredictorClosedError):
        predictor(x)


# ---------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------


def test_signatures_tell_apart_what_the_checks_tell_apart() -> None:
    x = torch.randn(1, 2)
    a = x.numpy()
    sign = _calls.call_signature
    distinct = [sign((x,), {}), sign((x.double(),), {}), sign((x.to_sparse(),), {}),
                sign((torch.randn(1, 2, requires_grad=True),), {}), sign((torch.randn(2, 2),), {}),
                sign((a,), {}), sign((a.astype(">f4"),), {}), sign((), {"x": x}),
                sign((x, x), {}), sign((x,), {"y": x}), sign((), {"y": x, "x": x}),
                sign((), {"x": x, "y": x})]
    assert len(set(distinct)) == len(distinct)
    assert sign((torch.randn(1, 2),), {}) == sign((x,), {})  # values never matter
    assert sign((torch.randn(2, 1).T,), {}) == sign((x,), {})  # nor strides
    assert sign((torch.nn.Parameter(x, requires_grad=False),), {}) == sign((x,), {})
    for unremembered in [(x.as_subclass(_Tagged),), (a.view(_Array),), (_nested(),),
                         ([1.0, 2.0],), (_masked_numpy(),), (x, [1.0])]:
        assert sign(unremembered, {}) is None
