"""The one capture recipe: warm-up and capture primitives every graph in qkan-pack uses.

torch.cuda.graphs' recipe: warm up on a side stream made on the target device, synchronize,
capture on another side stream into a memory pool, all under ``torch.cuda.device(N)``;
like torch.compile's CUDA graph trees, cuBLAS's cached workspaces are cleared around the
captures (``capture_session``) so the one the graphs use lives in their pool. The runtime's
``GraphRunner`` and the benchmark's bare-graph baseline both call these functions.

Not owned here: which shapes or modules to capture (the runners), reading files, timing.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ..errors import CaptureError
from ._diagnose import explain_capture_failure
from ._source import describe
from ._tree import flatten

#: What the package (``qkan_pack.runtime``) exports from this module.
__all__ = [
    "WARMUP_CALLS",
    "ShapeGraph",
    "capture_graph",
    "capture_session",
    "capture_streams",
    "check_context",
    "flat_forward",
    "release_graph_memory",
    "warm_up",
]


#: Forwards on the warm-up stream before a capture (torch's recipe uses 3 as well): the
#: first compiles kernels and allocates workspaces, later ones settle lazy initialisation.
WARMUP_CALLS = 3


@dataclass(frozen=True)
class CaptureStreams:
    """The side streams of one device: eager warm-ups on ``warmup``, captures on ``capture``.

    No eager work runs on ``capture``, so the cuBLAS workspace a capture finds for it was
    allocated inside a capture (in a graph pool), never in the general pool at warm-up.
    """

    warmup: torch.cuda.Stream
    capture: torch.cuda.Stream


@dataclass
class ShapeGraph:
    """One captured graph with the static buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    static_outputs: list[torch.Tensor]

    def replay_copy(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``copy_`` inputs in, replay, ``clone`` outputs out: the plainest safe call."""
        for static, x in zip(self.static_inputs, inputs):
            static.copy_(x)
        self.graph.replay()
        return [t.clone() for t in self.static_outputs]


_CAPTURE_STREAMS: dict[int, CaptureStreams] = {}
_CAPTURE_SESSION = threading.RLock()


def capture_streams(device: torch.device) -> CaptureStreams:
    """One pair of side streams per device for every warm-up and capture in the process."""
    streams = _CAPTURE_STREAMS.get(device.index)
    if streams is None:
        # torch leaves torch.cuda.Stream's constructor unannotated
        side = [torch.cuda.Stream(device=device) for _ in range(2)]  # type: ignore[no-untyped-call]
        streams = _CAPTURE_STREAMS[device.index] = CaptureStreams(*side)
    return streams


def clear_cublas_workspaces() -> None:
    """Drop torch's cached cuBLAS workspaces (one per cuBLAS handle and stream).

    A graph bakes in the address of the workspace of the stream it was captured on. A
    workspace allocated eagerly lives in the general pool, and whatever later clears these
    caches -- torch.compile(mode="reduce-overhead") does before and after every recording --
    hands that memory back to the allocator while the graph still writes to it: silent
    corruption, or an illegal memory access once ``empty_cache`` unmaps it.
    Cleared just before capture, the workspace is allocated inside the capture, in the
    graph's private pool, which is neither released nor lent out while the graph lives.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def capture_session() -> Iterator[None]:
    """Captures inside get a cuBLAS workspace in their own pool, which nothing else keeps
    using afterwards (torch's CUDA graph trees do the same around each recording).

    One such session at a time in the process: a load on another thread clearing the cache
    mid-capture would free the workspace the graphs being captured have just baked in.
    """
    with _CAPTURE_SESSION:
        clear_cublas_workspaces()
        try:
            yield
        finally:
            clear_cublas_workspaces()


def warm_up(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], streams: CaptureStreams,
            device: torch.device) -> None:
    """``WARMUP_CALLS`` forwards on the warm-up stream, then wait and synchronize."""
    caller = torch.cuda.current_stream(device)
    with torch.no_grad():
        streams.warmup.wait_stream(caller)
        with torch.cuda.stream(streams.warmup):
            for _ in range(WARMUP_CALLS):
                fn(*inputs)
        caller.wait_stream(streams.warmup)
    torch.cuda.synchronize(device)


def flat_forward(forward: Callable[..., Any], *inputs: torch.Tensor) -> list[torch.Tensor]:
    """``forward``'s outputs as a flat list of tensors: what a graph captures and replays.

    Bound with ``functools.partial``, not a lambda: a closure over the model in a failed
    capture's traceback would keep the model alive (``_calling.KeywordForward`` says why).
    """
    return flatten(forward(*inputs))


def capture_graph(fn: Callable[..., list[torch.Tensor]], static_inputs: list[torch.Tensor],
                  streams: CaptureStreams, pool: Any) -> ShapeGraph:
    """Capture ``fn(*static_inputs)`` on the capture stream into ``pool`` (warm up first)."""
    graph = torch.cuda.CUDAGraph()
    began = False
    try:
        with torch.no_grad(), torch.cuda.graph(graph, pool=pool, stream=streams.capture,
                                               capture_error_mode="thread_local"):
            began = True
            static_outputs = fn(*static_inputs)
    except BaseException:
        if began and pool is not None and not _capture_ended(graph):
            release_abandoned_pool(streams.capture.device, pool)
        del graph  # the traceback would keep the half-built graph (and its pool) alive
        raise
    return ShapeGraph(graph, static_inputs, static_outputs)


def _capture_ended(graph: torch.cuda.CUDAGraph) -> bool:
    """Whether torch finished this capture (``pool()`` answers only then)."""
    try:
        graph.pool()
    except RuntimeError:
        return False
    return True


def release_abandoned_pool(device: torch.device, pool: Any) -> None:
    """Give back the use of ``pool`` that a capture which began but never ended took.

    torch releases a graph's use of its pool when the graph is destroyed, but only if
    ``capture_end`` succeeded; a capture invalidated mid-way (a sync, an out-of-memory)
    would otherwise keep the pool, and every block in it, reserved for the process's
    life. Allocation routing to the pool is ended first, as ``torch.cuda.use_mem_pool`` does.
    """
    with contextlib.suppress(RuntimeError):  # routing already ended
        torch._C._cuda_endAllocateToPool(device.index, pool)
    torch._C._cuda_releasePool(device.index, pool)


class GraphPool:
    """Captures into one memory pool shared by every graph of a predictor.

    Warm-up, capture and the pool-growth measurement of each graph; after a failed capture
    CUDA is recovered and a fresh pool replaces the one the failure left unusable.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.streams = capture_streams(device)
        self.handle: Any = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[..., list[torch.Tensor]],
                sample: Sequence[torch.Tensor]) -> tuple[ShapeGraph, int]:
        """Warm up and capture ``fn`` on copies of ``sample``; the graph and the bytes the
        pool grew by. Any failure is a ``CaptureError`` naming what broke, CUDA left usable."""
        static_inputs = [t.to(self.device).clone() for t in sample]
        caller = torch.cuda.current_stream(self.device)
        try:
            warm_up(fn, static_inputs, self.streams, self.device)
            torch.cuda.empty_cache()  # torch.cuda.graph does it too: measure from there
            before = torch.cuda.memory_reserved(self.device)
            shape_graph = capture_graph(fn, static_inputs, self.streams, self.handle)
            grown = torch.cuda.memory_reserved(self.device) - before
        except Exception as exc:
            recover_after_failed_capture(self.device, caller, self.streams, self.handle)
            self.handle = torch.cuda.graph_pool_handle()  # the failed capture's pool is unusable
            op = explain_capture_failure(fn, static_inputs, self.device) or describe(exc)
            raise CaptureError(op) from exc
        return shape_graph, grown


def release_graph_memory(device: torch.device) -> None:
    """Free what dropped graphs and pools held: collect, drain the device, empty the cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def recover_after_failed_capture(device: torch.device, caller_stream: torch.cuda.Stream,
                                 streams: CaptureStreams, pool: Any) -> None:
    """Leave CUDA as it was before a failed capture, and prove the context still works.

    A capture that raises skips parts of torch's clean-up: the caller's current stream is
    not restored, the allocator keeps routing the capture stream's allocations to the
    graph pool, and the device's RNG stays in "capturing" mode so that every later random
    op fails ("Offset increment outside graph capture"). A trivial successful capture runs
    the RNG epilogue again. A cuBLAS workspace first allocated by the failed capture lives in
    its abandoned pool: cleared here, the next capture allocates its own.
    """
    torch.cuda.set_stream(caller_stream)
    if pool is not None:
        with contextlib.suppress(RuntimeError):  # not recording any more: nothing to end
            torch._C._cuda_endAllocateToPool(device.index, pool)
    for _ in range(2):
        try:
            torch.cuda.synchronize(device)
            break
        except RuntimeError:
            continue
    clear_cublas_workspaces()
    reset = torch.cuda.CUDAGraph()
    with torch.cuda.graph(reset, stream=streams.capture):
        torch.zeros(1, device=device).add_(1)
    del reset
    check_context(device)


def check_context(device: torch.device) -> None:
    """Raise ``CaptureError`` unless arithmetic and the RNG work on ``device``."""
    try:
        probe = torch.ones(4, device=device)
        healthy = float((probe * 2).sum().item()) == 8.0 and float(
            torch.rand(1, device=device).item()) < 1
    except RuntimeError as exc:
        raise CaptureError(f"the CUDA context is unusable after a failed capture: {exc}") from exc
    if not healthy:
        raise CaptureError("the CUDA context is unusable after a failed capture")


def stream_query(device_index: int | None) -> Callable[[], Any]:
    """A cheap identity of the calling thread's current stream on the device, as a call
    without arguments (no Stream object built per call: it runs on every replay)."""
    query = getattr(torch._C, "_cuda_getCurrentStream", None)
    if query is not None:
        return partial(query, device_index)
    return lambda: torch.cuda.current_stream(device_index).cuda_stream
