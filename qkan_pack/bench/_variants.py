"""The contestants of a benchmark: each a callable for one shape, made ready and checked.

Every variant is built from the same artifact: eager PyTorch (the rebuilt model), the
``Predictor``, a bare graph captured with the runtime's own primitives (the floor for any
graph runtime), ``qkan.compile_inference`` and ``torch.compile(mode="reduce-overhead")``;
with ``--precision``, the whole model's graph at each precision asked (the runtime's own
``served_forward`` and ``precision_scope``; eager on a CPU), with its error against the
float32 references; for a model with a 2-D convolution (``runtime.channels_last_applies``)
also in the channels-last layout, on a twin of the model whose weights are channels-last
(``runtime.to_channels_last``: converting the shared model would move the storage the
other variants' graphs read).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from ..errors import BenchError
from ..format import CHANNELS_LAST, CONTIGUOUS, LAYOUTS
from ..runtime import (
    WARMUP_CALLS,
    ShapeGraph,
    capture_graph,
    capture_session,
    capture_streams,
    channels_last_applies,
    check_context,
    compare,
    describe,
    flat_forward,
    flatten,
    output_errors,
    precision_scope,
    precision_unavailable,
    served_forward,
    to_channels_last,
    warm_up,
)
from ._names import LABELS, precision_variant


@dataclass
class Variant:
    """One contestant at one shape: its call, its first calls' timings, its samples."""

    name: str
    call: Callable[[], Any] | None = None
    status: str = "ok"
    reason: str = ""
    note: str = ""
    first_call_s: float | None = None
    warmup_s: float | None = None
    max_abs_diff: float | None = None
    #: What the call must return, when not the shape's eager outputs (a padded call's own).
    want: list[torch.Tensor] | None = None
    samples: list[list[float]] = field(default_factory=list)  # per repeat, seconds
    throughput: list[float] = field(default_factory=list)  # per repeat, calls/s
    #: The float32 references its error is measured against (precision variants).
    references: list[torch.Tensor] | None = None
    precision_error: float | None = None
    graph: ShapeGraph | None = None  # its own graph (bare and precision variants on CUDA)
    kernel_us: float | None = None
    pool_bytes: int | None = None

    def fail(self, status: str, reason: str) -> None:
        self.status, self.reason, self.call = status, reason, None


def bare_graph(forward: Callable[..., Any], inputs: list[torch.Tensor], device: torch.device,
               streams: Any) -> ShapeGraph:
    """The whole model (``forward``: ``bind_forward``'s call) captured at one shape, in a
    private pool, with the runtime's recipe."""
    static = [t.detach().clone() for t in inputs]
    forward = partial(flat_forward, forward)
    warm_up(forward, static, streams, device)
    with capture_session():
        return capture_graph(forward, static, streams, pool=None)


def precision_graph(forward: Callable[..., Any], inputs: list[torch.Tensor],
                    device: torch.device, streams: Any, precision: str) -> tuple[ShapeGraph, int]:
    """The whole model captured at ``precision`` in a private pool (warm-up and capture in
    its math, under the capture-session lock its TF32 switches need); the bytes the capture
    grew ``memory_reserved`` by."""
    static = [t.detach().clone() for t in inputs]
    forward = partial(flat_forward, forward)
    with capture_session(), precision_scope(precision, device):
        warm_up(forward, static, streams, device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(device)
        graph = capture_graph(forward, static, streams, pool=None)
        return graph, torch.cuda.memory_reserved(device) - before


def first_calls(variant: Variant, want: list[torch.Tensor], warmup: int,
                sync: Callable[[], None]) -> None:
    """First call (timed: compiles and captures happen here), warm-up calls, one check."""
    call = variant.call
    assert call is not None
    started = time.perf_counter()
    call()
    sync()
    variant.first_call_s = time.perf_counter() - started
    for _ in range(max(warmup, WARMUP_CALLS)):
        call()
    sync()
    variant.warmup_s = time.perf_counter() - started
    outputs = flatten(call())
    variant.max_abs_diff = compare(outputs, variant.want or want, (0.0, 0.0)).max_abs
    if variant.references is not None:
        variant.precision_error = max(output_errors(outputs, variant.references), default=0.0)
    sync()


def fail_variant(variant: Variant, what: str, exc: BaseException, device: torch.device) -> None:
    """Mark a variant failed; on CUDA make sure the context survived (else stop the run)."""
    if device.type == "cuda":
        try:
            with contextlib.suppress(RuntimeError):
                torch.cuda.synchronize(device)
            check_context(device)
        except Exception as context_error:
            raise BenchError(f"the CUDA context is unusable after {LABELS[variant.name]} "
                             f"failed: {context_error}") from exc
    variant.fail("failed", f"{LABELS[variant.name]} {what}: {describe(exc)}")


def dynamo_counts() -> tuple[int, int]:
    """Inductor's cudagraph skips and dynamo's graph breaks so far in this process."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return 0, 0
    skips = int(counters.get("inductor", Counter()).get("cudagraph_skips", 0))
    breaks = int(sum(counters.get("graph_break", Counter()).values()))
    return skips, breaks


def reset_dynamo() -> None:
    with contextlib.suppress(Exception):  # best effort: a later bench recompiles anyway
        torch._dynamo.reset()


class Contestants:
    """Builds the variants for each shape from one model; owns what they keep alive
    (bare graphs, the qkan wrapper, the torch.compile'd twin) until ``close``.

    ``bind`` turns a model into the call the manifest prescribes (``runtime.bind_forward``:
    named inputs by keyword), so that every variant computes what the predictor computes."""

    def __init__(self, model: torch.nn.Module, rebuild: Callable[[], torch.nn.Module],
                 bind: Callable[[Any], Callable[..., Any]], predictor: Any, device: torch.device,
                 shapes: int, skip: tuple[str, ...], precisions: tuple[str, ...] = ()) -> None:
        self.model = model
        self.forward = bind(model)
        self.bind = bind
        self.keyword = self.forward is not model
        self.rebuild = rebuild
        self.predictor = predictor
        self.device = device
        self.shapes = shapes
        self.skip = set(skip)
        self.precisions = precisions
        self.layouts = LAYOUTS if precisions and channels_last_applies(model) else (CONTIGUOUS,)
        self.streams = capture_streams(device) if device.type == "cuda" else None
        self.graphs: list[ShapeGraph] = []
        self._wrapper: Any = None
        self._compiled: Any = None
        self._channels_last: Callable[..., Any] | None = None
        self.used_dynamo = False

    def for_shape(self, inputs: list[torch.Tensor],
                  references: list[torch.Tensor] | None = None) -> list[Variant]:
        """The variants at one shape; ``references``: its float32 reference outputs, which
        precision variants measure their error against."""
        forward, predictor = self.forward, self.predictor
        variants = [Variant("eager", lambda: forward(*inputs)),
                    Variant("predictor", lambda: predictor(*inputs))]
        padded = self._padded(inputs)
        if padded is not None:
            variants.append(padded)
        if self.device.type == "cuda":
            variants += [self._bare(inputs), self._qkan(inputs), self._torch_compile(inputs)]
        variants += [self._precision(inputs, references, name, layout)
                     for name in self.precisions for layout in self.layouts]
        for variant in variants:
            if variant.name in self.skip:
                variant.fail("skipped", "skipped on request (--skip)")
        return variants

    def _padded(self, inputs: list[torch.Tensor]) -> Variant | None:
        """The predictor on inputs one smaller along every padded axis (the batch only where
        nothing else is padded): what a padded call costs against the exact call of its
        entry. None for artifacts without declared padding, or entries already minimal."""
        padding = self.predictor.manifest.padding
        if padding is None:
            return None
        names = list(self.predictor.manifest.input_names)
        axes = [a for a in padding.axes if a.inputs[0][1] != 0] or list(padding.axes)
        cut = list(inputs)
        shrunk = []
        for axis in axes:
            name, dim = axis.inputs[0]
            size = inputs[names.index(name)].shape[dim]
            if size < 2:
                continue
            shrunk.append(f"{axis.label} {size - 1}")
            for member, member_dim in axis.inputs:
                position = names.index(member)
                cut[position] = cut[position].narrow(member_dim, 0, size - 1).contiguous()
        if not shrunk:
            return None
        predictor, forward = self.predictor, self.forward
        return Variant("predictor_padded", lambda: predictor(*cut),
                       note=f"{'; '.join(shrunk)}: padded into this shape",
                       want=flatten(forward(*cut)))

    def _bare(self, inputs: list[torch.Tensor]) -> Variant:
        variant = Variant("bare_graph", note="private pool; copy_ in, replay, clone out")
        if variant.name in self.skip:
            return variant
        return self._replaying(variant, inputs, lambda: bare_graph(self.forward, inputs,
                                                                   self.device, self.streams))

    def _precision(self, inputs: list[torch.Tensor], references: list[torch.Tensor] | None,
                   precision: str, layout: str) -> Variant:
        """The whole model's graph at ``precision`` in ``layout`` (eager on a CPU)."""
        cuda = self.device.type == "cuda"
        note = "private pool; copy_ in, replay, clone out" if cuda else "eager (no CUDA)"
        if layout == CHANNELS_LAST:
            note += "; inputs and weights channels-last, converted inside the call"
        variant = Variant(precision_variant(precision, layout), references=references,
                          note=note)
        unavailable = precision_unavailable(precision, self.device)
        if variant.name in self.skip or unavailable is not None:
            if unavailable is not None:
                variant.fail("skipped", f"{precision} is not available on {self.device}: "
                                        f"{unavailable}")
            return variant
        forward = self.forward if layout == CONTIGUOUS else self._channels_last_forward()
        served = served_forward(forward, precision, self.device, layout)
        if not cuda:
            variant.call = lambda: served(*inputs)
            return variant

        def capture() -> ShapeGraph:
            graph, variant.pool_bytes = precision_graph(served, inputs, self.device,
                                                        self.streams, precision)
            return graph

        return self._replaying(variant, inputs, capture)

    def _channels_last_forward(self) -> Callable[..., Any]:
        """The forward of the model's channels-last twin, made on first use."""
        if self._channels_last is None:
            twin = self.rebuild()
            to_channels_last(twin)
            self._channels_last = self.bind(twin)
        return self._channels_last

    def _replaying(self, variant: Variant, inputs: list[torch.Tensor],
                   capture: Callable[[], ShapeGraph]) -> Variant:
        """``variant`` calling a whole-model graph of its own (``capture`` makes it): copy in,
        replay, clone out; a capture that fails fails the variant, saying why."""
        try:
            graph = capture()
        except Exception as exc:
            fail_variant(variant, "whole-model capture failed", exc, self.device)
            return variant
        self.graphs.append(graph)
        variant.graph = graph
        variant.call = lambda: graph.replay_copy(inputs)
        return variant

    def _qkan(self, inputs: list[torch.Tensor]) -> Variant:
        variant = Variant("qkan_compile_inference",
                          note="returns its static output buffer (no copy out)")
        if variant.name in self.skip:
            return variant
        try:
            from qkan import compile_inference
        except ImportError as exc:
            variant.fail("skipped", f"qkan.compile_inference is not available here ({exc})")
            return variant
        if len(inputs) != 1 or self.keyword:
            variant.fail("skipped", "qkan.compile_inference takes one tensor input, passed "
                                    f"by position; this artifact takes {len(inputs)}"
                                    + (", by name" if self.keyword else ""))
            return variant
        if self._wrapper is None:
            self._wrapper = compile_inference(self.model, max_shapes=max(8, self.shapes))
            self._wrapper.eval()  # a fresh nn.Module is in training mode: it would run eagerly
        wrapper, (x,) = self._wrapper, inputs
        variant.call = lambda: wrapper(x)
        return variant

    def _torch_compile(self, inputs: list[torch.Tensor]) -> Variant:
        variant = Variant("torch_compile", note='mode="reduce-overhead", dynamic=False; warm-up '
                                                "(compile + graph recording) timed apart")
        if variant.name in self.skip:
            return variant
        if self._compiled is None:
            try:
                # Its own model instance, so that dynamo's guards see only its own calls.
                self._compiled = self.bind(torch.compile(self.rebuild(), mode="reduce-overhead",
                                                         dynamic=False))
            except Exception as exc:
                variant.fail("failed", f"torch.compile failed: {describe(exc)}")
                return variant
            self.used_dynamo = True
        compiled = self._compiled
        variant.call = lambda: compiled(*inputs)
        return variant

    def note_first_calls(self, variant: Variant, before: tuple[int, int]) -> None:
        """Warn in the variant's note when it did not run as advertised."""
        if variant.name == "qkan_compile_inference" and not getattr(self._wrapper, "_cache", True):
            variant.note += "; WARNING: no graph was captured, it ran eagerly"
        if variant.name == "torch_compile":
            skips, breaks = (now - then for now, then in zip(dynamo_counts(), before))
            if skips:
                variant.note += (f"; WARNING: inductor skipped CUDA graphs {skips} time(s) "
                                 "(TORCH_LOGS=perf_hints says why)")
            if breaks:
                variant.note += f"; {breaks} graph break(s) (TORCH_LOGS=graph_breaks)"

    def close(self) -> None:
        self.graphs.clear()
        self._wrapper = self._compiled = self._channels_last = None
        if self.used_dynamo:
            reset_dynamo()
