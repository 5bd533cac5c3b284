"""Run a loaded model per manifest shape: CUDA-graph replay, or eager with the same interface.

Runners expose ``replayer(index, fit, copy, out_device)``: the call of one manifest shape
as a function of the input tensors alone (flat output leaves back; ``fit`` says how a smaller
call is padded into the entry and sliced back, None for an exact call), with everything that
depends only on those arguments worked out once -- the predictor keeps one per call
signature (``_calls``). ``run(index, inputs, fit, copy, out_device)`` is the same for one
call. The caller (the predictor) serialises calls; a runner is never entered by two threads
at once. Not owned here: input checking (the predictor), the capture recipe (``_capture``),
which submodules to graph (``_submodules``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from ..errors import CaptureError, QkanPackError
from ._capture import (
    GraphPool,
    ShapeGraph,
    capture_session,
    flat_forward,
    release_graph_memory,
    stream_query,
)
from ._inputs import Fit
from ._progress import progress_bar
from ._report import ShapeRecord
from ._source import model_code_failed
from ._submodules import SubmoduleGraphs, capture_submodules
from ._tree import flatten

#: Internal to ``qkan_pack.runtime``: the package exports nothing from this module.
__all__: list[str] = []

Sample = tuple[str, list[torch.Tensor]]  # (shape label, reference inputs on the device)
#: One manifest shape's call: input tensors in declared order -> flat output leaves.
Replay = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]


def _prepare_for_out(tensor: torch.Tensor, region: tuple[slice, ...] | None,
                     out_device: torch.device | None, copy: bool) -> torch.Tensor:
    return _taker(tensor, region, out_device, copy)()


def _taker(tensor: torch.Tensor, region: tuple[slice, ...] | None,
           out_device: torch.device | None, copy: bool) -> Callable[[], torch.Tensor]:
    """How one output leaf leaves, as a call without arguments: the region a padded call
    keeps (a view made once), then the graph's own buffer (``copy`` False), a copy to
    ``out_device``, or a clone where it is."""
    if region is not None:
        tensor = tensor[region]
    if not copy:
        return partial(_same, tensor)
    if out_device is not None and out_device != tensor.device:
        return partial(tensor.to, out_device)
    return tensor.clone


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class EagerRunner:
    """Eager forward on the model's device; outputs never alias parameters or inputs.

    ``forward`` takes the inputs' tensors in declared order (``bind_forward``); ``shown``
    names the model file in errors from its code."""

    def __init__(self, forward: Callable[..., Any], device: torch.device,
                 shown: str = "model") -> None:
        self.forward: Callable[..., Any] | None = forward
        self.device = device
        self.shown = shown
        self.records: list[ShapeRecord] = []

    def run(self, index: int, inputs: Sequence[torch.Tensor], fit: Fit | None,
            copy: bool = True, out_device: torch.device | None = None) -> list[torch.Tensor]:
        moved = [self._to_device(x, fit, i) for i, x in enumerate(inputs)]
        assert self.forward is not None, "run after close"
        try:
            with torch.no_grad():
                leaves = flatten(self.forward(*moved))
        except QkanPackError:
            raise
        except Exception as exc:  # e.g. a token id beyond the embedding: the model's own check
            raise model_code_failed("call", self.shown, "forward", exc) from exc
        # Always copy: a forward may return a parameter, an input or a tensor it caches.
        kept = fit.outputs if fit is not None else [None] * len(leaves)
        return [_prepare_for_out(leaf, region, out_device, copy=True)
                for leaf, region in zip(leaves, kept)]

    def replayer(self, index: int, fit: Fit | None, copy: bool,
                 out_device: torch.device | None) -> Replay:
        """``run`` with everything but the inputs given (eager outputs are copied always)."""
        return lambda inputs: self.run(index, inputs, fit, copy, out_device)

    def _to_device(self, x: torch.Tensor, fit: Fit | None, position: int) -> torch.Tensor:
        """Move to the model's device; pad up to the entry's shape as ``fit`` says."""
        x = x.to(self.device).contiguous()
        region = None if fit is None else fit.inputs[position]
        if fit is None or region is None:
            return x
        full = torch.full(fit.shapes[position], fit.values[position], dtype=x.dtype,
                          device=self.device)
        full[region].copy_(x)
        return full

    def close(self) -> None:
        self.forward = None


class GraphRunner:
    """Replays one captured graph per manifest shape (whole model), or eager glue around
    captured submodules for shapes where whole-model capture failed.
    """

    def __init__(self, model: torch.nn.Module, forward: Callable[..., Any],
                 device: torch.device, shown: str = "model") -> None:
        self.model = model
        self.forward = forward
        self.device = device
        self.pool: GraphPool | None = None
        self.records: list[ShapeRecord] = []
        self._full: dict[int, ShapeGraph] = {}
        self._eager = EagerRunner(forward, device, shown)
        self._submodule_graphs: list[SubmoduleGraphs] = []
        self._current_stream = stream_query(device.index)
        self._last_stream_id: Any = None
        self._last_stream: torch.cuda.Stream | None = None

    # -- capture ---------------------------------------------------------------------

    def capture(self, samples: Sequence[Sample], policy: str, submodule_names: Sequence[str],
                *, progress: bool | None) -> None:
        """Capture every shape under ``policy``; raise CaptureError leaving nothing captured.

        Largest shape first, so that the shared pool is sized by it and the rest fit in.
        """
        order = sorted(range(len(samples)), key=lambda i: -sum(t.numel() for t in samples[i][1]))
        self.records = [ShapeRecord(label=label) for label, _ in samples]
        try:
            with torch.cuda.device(self.device), capture_session():
                self.pool = GraphPool(self.device)
                fallback = self._capture_whole(samples, order, policy, progress)
                if fallback:
                    self._submodule_graphs = capture_submodules(
                        self.model, self.forward, self.pool, samples, fallback, submodule_names,
                        self.records, progress)
                torch.cuda.synchronize(self.device)
        except BaseException:
            self.close()
            raise

    def _capture_whole(self, samples: Sequence[Sample], order: list[int], policy: str,
                       progress: bool | None) -> list[int]:
        """Whole-model graphs; the shape indices left for submodule capture."""
        if policy == "submodules":
            return order
        assert self.pool is not None
        fallback = []
        for index in progress_bar(order, desc="capturing graphs", enabled=progress):
            label, sample = samples[index]
            record = self.records[index]
            started = time.perf_counter()
            try:
                graph, grown = self.pool.capture(partial(flat_forward, self.forward), sample)
            except CaptureError as exc:
                if policy == "full":
                    raise CaptureError(exc.op, shape=label, hint=(
                        "Rebuild with --capture auto or --capture submodules to graph only the "
                        "safe blocks")) from exc
                record.fallback_reason = str(exc)
                fallback.append(index)
                continue
            self._full[index] = graph
            record.policy, record.graphs = "full", 1
            record.pool_bytes += grown
            record.capture_seconds = time.perf_counter() - started
        return fallback

    # -- replay ----------------------------------------------------------------------

    def run(self, index: int, inputs: Sequence[torch.Tensor], fit: Fit | None,
            copy: bool = True, out_device: torch.device | None = None) -> list[torch.Tensor]:
        return self.replayer(index, fit, copy, out_device)(inputs)

    def replayer(self, index: int, fit: Fit | None, copy: bool,
                 out_device: torch.device | None) -> Replay:
        """Copy in, replay, copy out at shape ``index``, everything but the inputs worked out
        now: the regions a padded call writes and keeps (views of the graph's buffers, made
        once), how each output leaves (``copy`` False: the graph's own buffer, overwritten by
        the next call; else a copy to ``out_device``, or a clone where it is). Shapes not
        graphed whole run eager glue around their submodule graphs. Valid until ``close``."""
        shape_graph = self._full.get(index)
        if shape_graph is None:
            return lambda inputs: self._run_glued(index, inputs, fit, out_device)
        regions = fit.outputs if fit is not None else [None] * len(shape_graph.static_outputs)
        takes = [_taker(t, region, out_device, copy)
                 for t, region in zip(shape_graph.static_outputs, regions)]
        if fit is None and len(shape_graph.static_inputs) == 1 and len(takes) == 1:
            return self._replay_one(shape_graph, takes[0])
        writes = ([partial(_write, static) for static in shape_graph.static_inputs] if fit is None
                  else [_padded_writer(static, region, value) for static, region, value
                        in zip(shape_graph.static_inputs, fit.inputs, fit.values)])
        return partial(self._replay, writes, shape_graph.graph.replay, takes)

    def _replay(self, writes: Sequence[Callable[[torch.Tensor], Any]], replay: Callable[[], None],
                takes: Sequence[Callable[[], torch.Tensor]],
                inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self._current_stream() != self._last_stream_id:
            self._order_after_last_stream()
        for write, x in zip(writes, inputs):
            write(x)
        replay()
        return [take() for take in takes]

    def _replay_one(self, shape_graph: ShapeGraph, take: Callable[[], torch.Tensor]) -> Replay:
        """The hot path, one tensor in and one out at its exact shape: no loop, no partial."""
        (static,) = shape_graph.static_inputs
        replay, current = shape_graph.graph.replay, self._current_stream

        def replay_one(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            if current() != self._last_stream_id:
                self._order_after_last_stream()
            static.copy_(inputs[0], True)  # non_blocking, by position: cheaper to parse
            replay()
            return [take()]

        return replay_one

    def _run_glued(self, index: int, inputs: Sequence[torch.Tensor], fit: Fit | None,
                   out_device: torch.device | None) -> list[torch.Tensor]:
        self._order_after_last_stream()
        with torch.cuda.device(self.device):  # eager glue launches on the current device
            return self._eager.run(index, inputs, fit, copy=True, out_device=out_device)

    def whole_graph(self, index: int) -> ShapeGraph | None:
        """The whole-model graph of shape ``index``, or None where that shape is not one."""
        return self._full.get(index)

    def _order_after_last_stream(self) -> None:
        """Static buffers were last touched on the previous caller's stream: wait for it."""
        current_id = self._current_stream()
        if current_id == self._last_stream_id:
            return
        current = torch.cuda.current_stream(self.device)
        if self._last_stream is not None:
            current.wait_stream(self._last_stream)
        self._last_stream_id, self._last_stream = current_id, current

    def close(self) -> None:
        for recorder in self._submodule_graphs:
            recorder.uninstall()
        self._submodule_graphs = []
        self._full.clear()
        self.pool = None
        release_graph_memory(self.device)


def _write(static: torch.Tensor, x: torch.Tensor) -> None:
    static.copy_(x, True)


def _padded_writer(static: torch.Tensor, region: tuple[slice, ...] | None,
                   value: Any) -> Callable[[torch.Tensor], None]:
    """Writes one input of a padded call: the whole buffer, or the pad value then the region
    (a view of the buffer, made once)."""
    if region is None:
        return partial(_write, static)
    view = static[region]

    def write(x: torch.Tensor) -> None:
        static.fill_(value)
        view.copy_(x, True)

    return write
