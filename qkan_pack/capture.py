"""Run a loaded model per manifest shape: CUDA-graph replay, or eager with the same interface.

Capture follows torch.cuda.graphs' recipe: warm up on a side stream made on the target
device, synchronize, capture (on another side stream) the largest shape first, hand one
memory pool to every capture, all under ``torch.cuda.device(N)``; like torch.compile's CUDA
graph trees, cuBLAS's cached workspaces are cleared around the captures so the one the
graphs use lives in their pool (see ``clear_cublas_workspaces``). Nothing here reads files.

Runners expose ``run(index, inputs, rows, copy) -> list[Tensor]`` (flat output leaves). The
caller (the predictor) serialises calls; a runner is never entered by two threads at once.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import CaptureError
from .progress import progress
from .source import describe
from .tree import describe_output, flatten, unflatten

WARMUP_ITERS = 3


@dataclass(frozen=True)
class CaptureStreams:
    """The side streams of one device: eager warm-ups on ``warm``, captures on ``record``.

    No eager work runs on ``record``, so the cuBLAS workspace a capture finds for it was
    allocated inside a capture (in a graph pool), never in the general pool at warm-up.
    """

    warm: torch.cuda.Stream
    record: torch.cuda.Stream


_CAPTURE_STREAMS: dict[int, CaptureStreams] = {}
_CAPTURE_SESSION = threading.RLock()


def capture_streams(device: torch.device) -> CaptureStreams:
    """One pair of side streams per device for every warm-up and capture in the process."""
    streams = _CAPTURE_STREAMS.get(device.index)
    if streams is None:
        streams = _CAPTURE_STREAMS[device.index] = CaptureStreams(
            torch.cuda.Stream(device=device), torch.cuda.Stream(device=device))
    return streams


def clear_cublas_workspaces() -> None:
    """Drop torch's cached cuBLAS workspaces (one per cuBLAS handle and stream).

    A graph bakes in the address of the workspace of the stream it was captured on. A
    workspace allocated eagerly lives in the general pool, and whatever later clears these
    caches -- torch.compile(mode="reduce-overhead") does before and after every recording --
    hands that memory back to the allocator while the graph still writes to it: silent
    corruption, or an illegal memory access once ``empty_cache`` unmaps it (seen on an H200).
    Cleared just before capture, the workspace is allocated inside the capture, in the
    graph's private pool, which is neither released nor lent out while the graph lives.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def private_cublas_workspace() -> Iterator[None]:
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


def _stream_id(device_index: int) -> Any:
    """A cheap identity for the calling thread's current stream (no Stream object built)."""
    query = getattr(torch._C, "_cuda_getCurrentStream", None)
    if query is not None:
        return query(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


@dataclass
class ShapeRecord:
    """What happened to one manifest shape at load (surfaced in ``predictor.report``)."""

    label: str
    policy: str = "eager"
    capture_seconds: float = 0.0
    pool_bytes: int = 0
    fallback_reason: str = ""
    graphs: int = 0
    replay_max_abs: float = 0.0
    reference_max_abs: float = 0.0


@dataclass
class _ShapeGraph:
    graph: torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    static_outputs: list[torch.Tensor]


def _prepare_for_out(tensor: torch.Tensor, rows: int | None, out_device: torch.device | None,
                     copy: bool) -> torch.Tensor:
    if rows is not None:
        tensor = tensor[:rows]
    if not copy:
        return tensor
    if out_device is not None and out_device != tensor.device:
        return tensor.to(out_device)
    return tensor.clone()


class EagerRunner:
    """Eager forward on the model's device; outputs never alias parameters or inputs."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.records: list[ShapeRecord] = []

    def run(self, index: int, inputs: Sequence[torch.Tensor], rows: int | None,
            padded: Sequence[int] | None, copy: bool = True,
            out_device: torch.device | None = None) -> list[torch.Tensor]:
        moved = [self._to_device(x, None if padded is None else padded[i])
                 for i, x in enumerate(inputs)]
        with torch.no_grad():
            leaves = flatten(self.model(*moved))
        # Always copy: a forward may return a parameter, an input or a tensor it caches.
        return [_prepare_for_out(leaf, rows, out_device, copy=True) for leaf in leaves]

    def run_one(self, index: int, x: torch.Tensor, copy: bool) -> torch.Tensor:
        out_device = x.device if x.device != self.device else None
        return self.run(index, [x], None, None, copy=copy, out_device=out_device)[0]

    def _to_device(self, x: torch.Tensor, padded: Sequence[int] | None) -> torch.Tensor:
        """Move to the model's device; zero-pad the batch up to ``padded`` when given."""
        x = x.to(self.device).contiguous()
        if padded is not None and tuple(x.shape) != tuple(padded):
            full = torch.zeros(padded, dtype=x.dtype, device=self.device)
            full[: x.shape[0]].copy_(x)
            return full
        return x

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


class GraphRunner:
    """Replays one captured graph per manifest shape (whole model), or eager glue around
    captured submodules for shapes where whole-model capture failed.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.pool: Any = None
        self.records: list[ShapeRecord] = []
        self._full: dict[int, _ShapeGraph] = {}
        self._eager = EagerRunner(model, device)
        self._submodule_graphs: list[_SubmoduleGraphs] = []
        self._last_stream_id: Any = None
        self._last_stream: torch.cuda.Stream | None = None

    # -- capture ---------------------------------------------------------------------

    def capture(self, shapes: Sequence[tuple[str, list[torch.Tensor]]], policy: str,
                submodule_names: Sequence[str], *, show_progress: bool | None) -> None:
        """Capture every shape under ``policy``; raise CaptureError leaving nothing captured."""
        order = sorted(range(len(shapes)), key=lambda i: -sum(t.numel() for t in shapes[i][1]))
        self.records = [ShapeRecord(label=label) for label, _ in shapes]
        try:
            with torch.cuda.device(self.device), private_cublas_workspace():
                self.pool = torch.cuda.graph_pool_handle()
                streams = capture_streams(self.device)
                fallback = self._capture_full(shapes, order, policy, streams, show_progress)
                if fallback:
                    self._capture_submodules(shapes, fallback, submodule_names, streams, show_progress)
                torch.cuda.synchronize(self.device)
        except BaseException:
            self.close()
            raise

    def _capture_full(self, shapes: Sequence[tuple[str, list[torch.Tensor]]], order: list[int],
                      policy: str, streams: CaptureStreams, show_progress: bool | None) -> list[int]:
        if policy == "submodules":
            return order
        fallback = []
        for index in progress(order, desc="capturing graphs", enabled=show_progress):
            label, sample = shapes[index]
            record = self.records[index]
            started = time.perf_counter()
            try:
                self._full[index] = self._capture_one(lambda *a: flatten(self.model(*a)),
                                                      sample, streams, record)
            except CaptureError as exc:
                if policy == "full":
                    raise CaptureError(
                        f"whole-model capture failed for shape {label}: {exc}. Rebuild with "
                        "--capture auto or --capture submodules to graph only the safe blocks"
                    ) from exc
                record.fallback_reason = str(exc)
                fallback.append(index)
                continue
            record.policy = "full"
            record.graphs = 1
            record.capture_seconds = time.perf_counter() - started
        return fallback

    def _capture_one(self, fn: Callable[..., list[torch.Tensor]], sample: Sequence[torch.Tensor],
                     streams: CaptureStreams, record: ShapeRecord) -> _ShapeGraph:
        """Warm up on a side stream, then capture into the shared pool (torch's recipe)."""
        static_inputs = [t.to(self.device).clone() for t in sample]
        graph = torch.cuda.CUDAGraph()
        caller_stream = torch.cuda.current_stream(self.device)
        try:
            with torch.no_grad():
                streams.warm.wait_stream(caller_stream)
                with torch.cuda.stream(streams.warm):
                    for _ in range(WARMUP_ITERS):
                        fn(*static_inputs)
                caller_stream.wait_stream(streams.warm)
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()  # torch.cuda.graph does it too: measure from there
                before = torch.cuda.memory_reserved(self.device)
                with torch.cuda.graph(graph, pool=self.pool, stream=streams.record,
                                      capture_error_mode="thread_local"):
                    static_outputs = fn(*static_inputs)
                record.pool_bytes += torch.cuda.memory_reserved(self.device) - before
        except Exception as exc:
            del graph
            _recover(self.device, caller_stream, streams, self.pool)
            self.pool = torch.cuda.graph_pool_handle()  # the failed capture's pool is unusable
            raise CaptureError(describe(exc)) from exc
        return _ShapeGraph(graph, static_inputs, static_outputs)

    def _capture_submodules(self, shapes: Sequence[tuple[str, list[torch.Tensor]]],
                            indices: list[int], names: Sequence[str], streams: CaptureStreams,
                            show_progress: bool | None) -> None:
        targets = select_submodules(self.model, names)
        if not targets:
            wanted = ", ".join(names) if names else "modules from the qkan package"
            raise CaptureError(
                f"no submodules to capture: the model has no {wanted}; pass --submodules "
                "ClassName,... naming graph-safe blocks"
            )
        recorders = [_SubmoduleGraphs(path, module, self) for path, module in targets]
        _record_calls(self.model, recorders, {i: shapes[i][1] for i in indices}, self.device)
        for index in indices:
            self.records[index].policy = "submodules"
        for index in progress(indices, desc="capturing submodules", enabled=show_progress):
            started = time.perf_counter()
            record = self.records[index]
            record.graphs = sum(r.capture_for(index, streams, record) for r in recorders)
            record.capture_seconds = time.perf_counter() - started
        for recorder in recorders:
            recorder.install()
        self._submodule_graphs = recorders

    # -- replay ----------------------------------------------------------------------

    def run(self, index: int, inputs: Sequence[torch.Tensor], rows: int | None,
            padded: Sequence[int] | None, copy: bool = True,
            out_device: torch.device | None = None) -> list[torch.Tensor]:
        self._order_after_last_stream()
        shape_graph = self._full.get(index)
        if shape_graph is None:
            with torch.cuda.device(self.device):  # eager glue launches on the current device
                return self._eager.run(index, inputs, rows, padded, copy=True,
                                       out_device=out_device)
        for static, x in zip(shape_graph.static_inputs, inputs):
            if rows is None:
                static.copy_(x, non_blocking=True)
            else:
                static[:rows].copy_(x, non_blocking=True)
                static[rows:].zero_()
        shape_graph.graph.replay()
        return [_prepare_for_out(t, rows, out_device, copy) for t in shape_graph.static_outputs]

    def run_one(self, index: int, x: torch.Tensor, copy: bool) -> torch.Tensor | None:
        """Hot path: one input, one output tensor, exact shape; None when not graphed whole."""
        shape_graph = self._full.get(index)
        if shape_graph is None:
            return None
        self._order_after_last_stream()
        shape_graph.static_inputs[0].copy_(x, non_blocking=True)
        shape_graph.graph.replay()
        out = shape_graph.static_outputs[0]
        if not copy:
            return out
        return out.clone() if x.is_cuda else out.to("cpu")

    def _order_after_last_stream(self) -> None:
        """Static buffers were last touched on the previous caller's stream: wait for it."""
        stream_id = _stream_id(self.device.index)
        if stream_id == self._last_stream_id:
            return
        current = torch.cuda.current_stream(self.device)
        if self._last_stream is not None:
            current.wait_stream(self._last_stream)
        self._last_stream_id, self._last_stream = stream_id, current

    def close(self) -> None:
        for recorder in self._submodule_graphs:
            recorder.uninstall()
        self._submodule_graphs = []
        self._full.clear()
        self.pool = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


def select_submodules(model: torch.nn.Module, names: Sequence[str]
                      ) -> list[tuple[str, torch.nn.Module]]:
    """Top-most submodules whose class is in ``names`` (default: classes from ``qkan``)."""

    def wanted(module: torch.nn.Module) -> bool:
        cls = type(module)
        if names:
            return cls.__name__ in names
        return cls.__module__.split(".")[0] == "qkan"

    chosen: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if not path or not wanted(module):
            continue
        if any(path.startswith(prefix + ".") for prefix, _ in chosen):
            continue
        chosen.append((path, module))
    return chosen


class _SubmoduleGraphs:
    """Per-signature graphs for one submodule; replaces its forward with replay + copy."""

    def __init__(self, path: str, module: torch.nn.Module, runner: GraphRunner) -> None:
        self.path = path
        self.module = module
        self.runner = runner
        self.samples: dict[int, list[tuple[Any, list[torch.Tensor]]]] = {}
        self.graphs: dict[Any, tuple[_ShapeGraph, Any]] = {}
        self._recording: int | None = None

    def pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self._recording is None:
            return
        if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            raise CaptureError(
                f"submodule {self.path} ({type(module).__name__}) is called with non-tensor or "
                "keyword arguments; only submodules taking tensors positionally can be captured"
            )
        key = _signature(args)
        samples = self.samples.setdefault(self._recording, [])
        if all(existing != key for existing, _ in samples):
            samples.append((key, [a.detach().clone() for a in args]))

    def capture_for(self, index: int, streams: CaptureStreams, record: ShapeRecord) -> int:
        captured = 0
        for key, sample in self.samples.get(index, []):
            if key in self.graphs:
                continue
            module = self.module
            structure: list[Any] = []

            def call(*args: torch.Tensor, _module: torch.nn.Module = module,
                     _structure: list[Any] = structure) -> list[torch.Tensor]:
                out = _module(*args)
                _structure[:] = [describe_output(out)]
                return flatten(out)

            try:
                shape_graph = self.runner._capture_one(call, sample, streams, record)
            except CaptureError as exc:
                raise CaptureError(
                    f"capturing submodule {self.path} ({type(module).__name__}) for shape "
                    f"{record.label} failed: {exc}"
                ) from exc
            self.graphs[key] = (shape_graph, structure[0])
            captured += 1
        return captured

    def install(self) -> None:
        graphs = self.graphs
        path = self.path

        def replay(*args: torch.Tensor, **kwargs: Any) -> Any:
            key = _signature(args)
            found = graphs.get(key) if not kwargs else None
            if found is None:
                raise CaptureError(
                    f"submodule {path} was called with {key}, which no captured graph covers "
                    "(its input shapes depend on data, not only on the declared shapes)"
                )
            shape_graph, structure = found
            for static, x in zip(shape_graph.static_inputs, args):
                static.copy_(x)
            shape_graph.graph.replay()
            return unflatten(structure, [t.clone() for t in shape_graph.static_outputs])

        self.module.forward = replay  # type: ignore[method-assign]

    def uninstall(self) -> None:
        self.module.__dict__.pop("forward", None)
        self.graphs.clear()


def _signature(args: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(a.shape), a.dtype, tuple(a.stride())) for a in args)


def _record_calls(model: torch.nn.Module, recorders: list[_SubmoduleGraphs],
                  samples: dict[int, list[torch.Tensor]], device: torch.device) -> None:
    """Run eager forwards with hooks to learn each submodule's input signatures per shape."""
    handles = [r.module.register_forward_pre_hook(r.pre_hook, with_kwargs=True) for r in recorders]
    try:
        for index, sample in samples.items():
            for recorder in recorders:
                recorder._recording = index
            with torch.no_grad():
                model(*[t.to(device) for t in sample])
    finally:
        for handle in handles:
            handle.remove()
        for recorder in recorders:
            recorder._recording = None


def _recover(device: torch.device, caller_stream: torch.cuda.Stream,
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
    with torch.cuda.graph(reset, stream=streams.record):
        torch.zeros(1, device=device).add_(1)
    del reset
    probe = torch.ones(4, device=device)
    if float((probe * 2).sum().item()) != 8.0 or float(torch.rand(1, device=device).item()) >= 1:
        raise CaptureError("the CUDA context is unusable after a failed capture")
