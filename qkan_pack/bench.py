"""``qkan-pack bench``: the predictor and its alternatives, side by side, on one artifact.

Everything runs in one process on the same artifact, for every manifest shape, with the
variants interleaved round-robin (in blocks, the order rotating each block) so that drift in
clocks, caches or neighbours hits them all alike:

- ``eager``: the model rebuilt from the artifact (strict weights, ``eval()``, no_grad);
- ``predictor``: ``Predictor.load(path, device)`` (copy in, replay, copy out);
- ``bare_graph``: a ``torch.cuda.CUDAGraph`` of the same model and shape with a ``copy_`` in
  and a ``clone`` out: the floor for any graph-based runtime;
- ``qkan_compile_inference``: ``qkan.compile_inference(model)`` (lazy per-shape graphs);
- ``torch_compile``: ``torch.compile(model, mode="reduce-overhead")`` (warm-up timed apart).

Latency is host call to result ready (``torch.cuda.synchronize`` after every call): median,
p90, p99. Throughput is many calls with one synchronize at the end. Both are measured
``repeats`` times and the spread between repeats is reported so noise is visible. On CUDA the
GPU time per call of back-to-back bare replays is the physical floor every variant is
compared with, and the graph memory of one shared pool is compared with one pool per shape.
Without CUDA only eager and the predictor (eager there too) are compared.

The cold start (a fresh process to the first served call) lives in ``bench_cold``; tables,
JSON and the plot in ``bench_report``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import __version__
from .capture import CaptureStreams, capture_streams, private_cublas_workspace
from .errors import QkanPackError
from .progress import progress
from .source import describe
from .tree import flatten

SCHEMA = "qkan-pack-bench/1"
VARIANTS = ("eager", "predictor", "bare_graph", "qkan_compile_inference", "torch_compile")
LABELS = {
    "eager": "eager",
    "predictor": "predictor",
    "bare_graph": "bare replay",
    "qkan_compile_inference": "qkan.compile_inference",
    "torch_compile": "torch.compile r-o",
}
CPU_NOTE = ("CUDA graphs need CUDA: this host has none, so only eager PyTorch and the predictor "
            "(which runs eagerly here) were compared; run on a GPU host with --device cuda for "
            "graph replay, qkan.compile_inference, torch.compile and GPU memory")
SKIPPABLE = VARIANTS[2:]
GRAPH_WARMUP = 3  # forwards on the side stream before a capture (torch's recipe)


class BenchError(QkanPackError, RuntimeError):
    """A benchmark that cannot run as asked (bad settings, missing plotting library)."""


@dataclass(frozen=True)
class BenchSettings:
    iters: int = 300
    repeats: int = 2
    warmup: int = 20
    blocks: int = 10
    throughput_calls: int = 0  # 0: the same as iters
    kernel_replays: int = 100
    skip: tuple[str, ...] = ()
    config_overrides: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        for name in ("iters", "repeats", "warmup", "blocks", "kernel_replays"):
            value = getattr(self, name)
            if value < (0 if name == "warmup" else 1):
                raise BenchError(f"{name} must be at least {0 if name == 'warmup' else 1}, got {value}")
        bad = [name for name in self.skip if name not in SKIPPABLE]
        if bad:
            raise BenchError(f"cannot skip {', '.join(bad)}; skippable variants: "
                             f"{', '.join(SKIPPABLE)}")

    @property
    def pipelined_calls(self) -> int:
        return self.throughput_calls or self.iters


@dataclass
class VariantResult:
    """One variant at one shape; times in microseconds, throughput in calls per second."""

    name: str
    label: str
    status: str = "ok"  # ok | skipped | failed
    reason: str = ""
    note: str = ""
    median_us: float | None = None
    p90_us: float | None = None
    p99_us: float | None = None
    mean_us: float | None = None
    min_us: float | None = None
    spread_pct: float | None = None
    throughput_cps: float | None = None
    throughput_spread_pct: float | None = None
    repeats: list[dict[str, float]] = field(default_factory=list)
    first_call_s: float | None = None
    warmup_s: float | None = None
    max_abs_diff_vs_eager: float | None = None
    speedup_vs_eager: float | None = None
    overhead_vs_bare: float | None = None
    ratio_to_kernel: float | None = None


@dataclass
class ShapeResult:
    label: str
    kernel_us: float | None = None
    kernel_method: str = ""
    variants: dict[str, VariantResult] = field(default_factory=dict)


@dataclass
class BenchReport:
    artifact: dict[str, Any]
    device: str
    machine: dict[str, Any]
    versions: dict[str, Any]
    settings: dict[str, Any]
    load: dict[str, Any]
    shapes: list[ShapeResult] = field(default_factory=list)
    memory: dict[str, Any] | None = None
    cold_start: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    created: str = ""
    schema: str = SCHEMA

    def as_dict(self) -> dict[str, Any]:
        return _finite(asdict(self))

    def shape(self, label: str) -> ShapeResult:
        for result in self.shapes:
            if result.label == label:
                return result
        raise KeyError(label)


# -- entry point ------------------------------------------------------------------------


def run_bench(path: str | Path, device: str = "auto", *, settings: BenchSettings | None = None,
              cold_start: bool = False, fresh_kernel_cache: bool = False,
              cold_start_timeout: float = 600.0, show_progress: bool | None = None) -> BenchReport:
    """Benchmark every manifest shape of the artifact at ``path`` on ``device``.

    ``device`` is ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    With ``cold_start`` a fresh subprocess first measures load-to-first-call (see
    ``bench_cold``); ``fresh_kernel_cache`` gives it empty Triton/Inductor caches.
    """
    from .predictor import resolve_device

    settings = settings or BenchSettings()
    settings.check()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = resolve_device(device)
    cold = None
    if cold_start:  # first, before this process holds GPU memory or warms any cache
        from .bench_cold import run_cold_start

        cold = run_cold_start(path, target, fresh_kernel_cache=fresh_kernel_cache,
                              timeout=cold_start_timeout,
                              config_overrides=settings.config_overrides,
                              skip_torch_compile="torch_compile" in settings.skip)
    on_device = torch.cuda.device(target) if target.type == "cuda" else contextlib.nullcontext()
    with torch.no_grad(), on_device:  # Triton launches on the current device
        session = _Session(Path(path), target, settings)
        try:
            report = session.run(show_progress)
        finally:
            session.close()
    report.cold_start = cold
    return report


def measure_memory(path: str | Path, device: str = "cuda", *,
                   config_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Graph memory only (no timing): every shape in one shared pool vs one pool per shape,
    and what the predictor recorded at load. Needs CUDA."""
    from .predictor import resolve_device

    target = resolve_device(device)
    if target.type != "cuda":
        raise BenchError(f"graph pool memory needs CUDA; {target} was given")
    settings = BenchSettings(config_overrides=dict(config_overrides or {}))
    with torch.no_grad(), torch.cuda.device(target):
        session = _Session(Path(path), target, settings)
        try:
            notes: list[str] = []
            memory = session._memory(notes)
            memory["notes"] = notes
            memory["load_to_ready_s"] = session.predictor.report.load_to_ready_seconds
            memory["predictor_policies"] = [r.policy for r in session.predictor.report.shapes]
            return memory
        finally:
            session.close()


# -- one benchmark session --------------------------------------------------------------


@dataclass
class _Variant:
    name: str
    call: Callable[[], Any] | None = None
    status: str = "ok"
    reason: str = ""
    note: str = ""
    first_call_s: float | None = None
    warmup_s: float | None = None
    max_abs_diff: float | None = None
    samples: list[list[float]] = field(default_factory=list)  # per repeat, seconds
    throughput: list[float] = field(default_factory=list)  # per repeat, calls/s

    def fail(self, status: str, reason: str) -> None:
        self.status, self.reason, self.call = status, reason, None


@dataclass
class _BareGraph:
    """A graph of the whole model at one shape: copy_ in, replay, clone out."""

    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        for static, x in zip(self.inputs, args):
            static.copy_(x)
        self.graph.replay()
        return [t.clone() for t in self.outputs]


class _Session:
    """The predictor, an eager twin of its model, reference inputs, and per-shape variants."""

    def __init__(self, path: Path, target: torch.device, settings: BenchSettings) -> None:
        from .artifact import read_artifact
        from .loading import rebuild_model, reference_samples
        from .predictor import Predictor

        self.settings = settings
        self.target = target
        self.cuda = target.type == "cuda"
        self.predictor = Predictor.load(path, device=target,
                                        config_overrides=settings.config_overrides,
                                        progress=False)
        artifact = read_artifact(path, expected_digest=self.predictor.digest)
        self.manifest = artifact.manifest
        self._rebuild = lambda: rebuild_model(artifact, target, dict(self.predictor.report.config))
        self.model = self._rebuild()
        self.samples, _ = reference_samples(artifact, target)
        self.streams = capture_streams(target) if self.cuda else None
        self.sync: Callable[[], None] = (lambda: torch.cuda.synchronize(target)) if self.cuda \
            else (lambda: None)
        self._graphs: list[_BareGraph] = []
        self._rounds = 0
        self._wrapper: Any = None
        self._compiled: Any = None
        self._used_dynamo = False

    # -- the whole run ----------------------------------------------------------------

    def run(self, show_progress: bool | None) -> BenchReport:
        notes: list[str] = []
        memory = None
        if self.cuda:
            memory = self._memory(notes)
        else:
            notes.append(CPU_NOTE)
        results: list[ShapeResult] = []
        tasks: list[tuple[str, int]] = []
        for index in range(len(self.samples)):
            tasks += [("setup", index), *[("time", index)] * self.settings.repeats]
        current: tuple[list[_Variant], ShapeResult] | None = None
        for step, index in progress(tasks, desc="benchmarking", total=len(tasks),
                                    enabled=show_progress):
            if step == "setup":
                if current is not None:
                    results.append(_finish_shape(*current))
                current = self._setup_shape(index)
            else:
                self._timing_round(*current)
        if current is not None:
            results.append(_finish_shape(*current))
        return BenchReport(
            artifact=self._artifact_info(), device=str(self.target), machine=machine_info(self.target),
            versions=versions(), settings=_settings_dict(self.settings), load=self._load_info(),
            shapes=results, memory=memory, notes=notes,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )

    def close(self) -> None:
        self.predictor.close()
        self._graphs.clear()
        self._wrapper = self._compiled = None
        if self._used_dynamo:
            _reset_dynamo()
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.target)
            torch.cuda.empty_cache()

    # -- per shape --------------------------------------------------------------------

    def _setup_shape(self, index: int) -> tuple[list[_Variant], ShapeResult]:
        label, inputs = self.samples[index]
        result = ShapeResult(label=label)
        variants = [self._eager_variant(inputs), _Variant("predictor", lambda: self.predictor(*inputs))]
        if self.cuda:
            variants += [self._bare_variant(inputs), self._qkan_variant(inputs),
                         self._torch_compile_variant(inputs)]
        skipped = set(self.settings.skip)
        for variant in variants:
            if variant.name in skipped:
                variant.fail("skipped", "skipped on request (--skip)")
        want = flatten(self.model(*inputs))
        for variant in variants:
            if variant.call is not None:
                self._warm(variant, want)
        if self.cuda:
            bare = next(v for v in variants if v.name == "bare_graph")
            self._kernel_floor(index, bare, result)
        return variants, result

    def _eager_variant(self, inputs: list[torch.Tensor]) -> _Variant:
        model = self.model
        return _Variant("eager", lambda: model(*inputs))

    def _bare_variant(self, inputs: list[torch.Tensor]) -> _Variant:
        variant = _Variant("bare_graph", note="private pool; copy_ in, replay, clone out")
        if "bare_graph" in self.settings.skip:
            return variant
        try:
            static = [t.detach().clone() for t in inputs]
            _warm_on(self.streams, self.model, static, self.target)
            with private_cublas_workspace():
                graph = self._capture(static, pool=None)
        except Exception as exc:
            _recover(self.target)
            variant.fail("failed", f"whole-model capture failed: {describe(exc)}")
            return variant
        self._graphs.append(graph)
        variant.call = lambda: graph(*inputs)
        return variant

    def _qkan_variant(self, inputs: list[torch.Tensor]) -> _Variant:
        variant = _Variant("qkan_compile_inference",
                           note="returns its static output buffer (no copy out)")
        if "qkan_compile_inference" in self.settings.skip:
            return variant
        try:
            from qkan import compile_inference
        except ImportError as exc:
            variant.fail("skipped", f"qkan.compile_inference is not available here ({exc})")
            return variant
        if len(inputs) != 1:
            variant.fail("skipped", f"qkan.compile_inference takes one tensor input; this "
                                    f"artifact takes {len(inputs)}")
            return variant
        if self._wrapper is None:
            self._wrapper = compile_inference(self.model, max_shapes=max(8, len(self.samples)))
            self._wrapper.eval()  # a fresh nn.Module is in training mode: it would run eagerly
        wrapper = self._wrapper
        (x,) = inputs
        variant.call = lambda: wrapper(x)
        return variant

    def _torch_compile_variant(self, inputs: list[torch.Tensor]) -> _Variant:
        variant = _Variant("torch_compile", note='mode="reduce-overhead", dynamic=False; warm-up '
                                                 "(compile + graph recording) timed apart")
        if "torch_compile" in self.settings.skip:
            return variant
        if self._compiled is None:
            try:
                # Its own model instance, so that dynamo's guards see only its own calls.
                self._compiled = torch.compile(self._rebuild(), mode="reduce-overhead",
                                               dynamic=False)
            except Exception as exc:
                variant.fail("failed", f"torch.compile failed: {describe(exc)}")
                return variant
            self._used_dynamo = True
        compiled = self._compiled
        variant.call = lambda: compiled(*inputs)
        return variant

    def _warm(self, variant: _Variant, want: list[torch.Tensor]) -> None:
        """First call (timed: compiles and captures happen here), warm-up calls, one check."""
        call = variant.call
        assert call is not None
        skips, breaks = _dynamo_counts()
        try:
            started = time.perf_counter()
            call()
            self.sync()
            variant.first_call_s = time.perf_counter() - started
            for _ in range(max(self.settings.warmup, GRAPH_WARMUP)):
                call()
            self.sync()
            variant.warmup_s = time.perf_counter() - started
            variant.max_abs_diff = _max_abs_diff(flatten(call()), want)
            self.sync()
        except Exception as exc:
            if self.cuda:
                _recover(self.target)
            variant.fail("failed", f"{LABELS[variant.name]} failed at its first calls: {describe(exc)}")
            return
        if variant.name == "qkan_compile_inference" and not getattr(self._wrapper, "_cache", True):
            variant.note += "; WARNING: no graph was captured, it ran eagerly"
        if variant.name == "torch_compile":
            new_skips, new_breaks = (now - then for now, then in zip(_dynamo_counts(), (skips, breaks)))
            if new_skips:
                variant.note += (f"; WARNING: inductor skipped CUDA graphs {new_skips} time(s) "
                                 "(TORCH_LOGS=perf_hints says why)")
            if new_breaks:
                variant.note += f"; {new_breaks} graph break(s) (TORCH_LOGS=graph_breaks)"

    def _timing_round(self, variants: list[_Variant], result: ShapeResult) -> None:
        live = [v for v in variants if v.call is not None]
        samples: dict[str, list[float]] = {v.name: [] for v in live}
        for block, count in enumerate(_split(self.settings.iters, self.settings.blocks)):
            shift = block % len(live)
            for variant in live[shift:] + live[:shift]:
                samples[variant.name] += self._guarded(variant, _latencies, count)
        for variant in live:
            variant.samples.append(samples[variant.name])
        self._rounds += 1
        shift = self._rounds % max(1, len(live))
        for variant in live[shift:] + live[:shift]:
            rate = self._guarded(variant, _throughput, self.settings.pipelined_calls)
            if rate:
                variant.throughput.append(rate[0])

    def _guarded(self, variant: _Variant, measure: Callable[..., list[float]], count: int
                 ) -> list[float]:
        if variant.call is None:
            return []
        try:
            return measure(variant.call, count, self.sync)
        except Exception as exc:
            if self.cuda:
                _recover(self.target)
            variant.fail("failed", f"{LABELS[variant.name]} failed while timed: {describe(exc)}")
            return []

    # -- GPU floor and memory ---------------------------------------------------------

    def _capture(self, static: list[torch.Tensor], pool: Any) -> _BareGraph:
        """Capture the whole model on the capture stream reading ``static`` (warmed up first)."""
        assert self.streams is not None
        with torch.cuda.device(self.target):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=self.streams.record,
                                  capture_error_mode="thread_local"):
                outputs = flatten(self.model(*static))
        return _BareGraph(graph, static, outputs)

    def _kernel_floor(self, index: int, bare: _Variant, result: ShapeResult) -> None:
        if bare.call is None:
            result.kernel_method = f"unavailable: bare replay {bare.status} ({bare.reason})"
            return
        graph = self._graphs[-1].graph
        try:
            result.kernel_us, result.kernel_method = kernel_time_per_call(
                graph, self.target, self.settings.kernel_replays)
        except Exception as exc:
            _recover(self.target)
            result.kernel_method = f"unavailable: {describe(exc)}"

    def _memory(self, notes: list[str]) -> dict[str, Any]:
        report = self.predictor.report
        memory: dict[str, Any] = {
            "method": "torch.cuda.memory_reserved before and after capture (after warm-up and "
                      "empty_cache), bare whole-model graphs of this artifact; each pool holds "
                      "the cuBLAS workspace its graphs write to (allocated inside the capture)",
            "predictor_pool_bytes": report.pool_bytes,
            "predictor_shapes": {r.label: r.pool_bytes for r in report.shapes},
        }
        try:
            memory.update(measure_pools(self, [inputs for _, inputs in self.samples],
                                        [label for label, _ in self.samples]))
        except Exception as exc:
            _recover(self.target)
            notes.append(f"graph pool memory not measured: {describe(exc)}")
        return memory

    # -- descriptions -------------------------------------------------------------------

    def _artifact_info(self) -> dict[str, Any]:
        model = self.manifest.model
        return {"path": str(self.predictor.path), "digest": self.predictor.digest,
                "model": f"{model.source}::{model.entry}", "config": dict(self.predictor.report.config),
                "parameters": model.parameters, "capture_policy": self.manifest.capture.policy,
                "shapes": [e.label for e in self.manifest.shapes],
                "inputs": {d.name: d.dtype for d in self.manifest.inputs}}

    def _load_info(self) -> dict[str, Any]:
        report = self.predictor.report
        return {"load_to_ready_s": report.load_to_ready_seconds, "stages_s": dict(report.stages),
                "capture_policy": report.capture_policy, "solvers": list(report.solvers),
                "factory_device": report.factory_device, "kernel_cache": report.kernel_cache,
                "shapes": [asdict(r) for r in report.shapes], "warnings": list(report.warnings)}


# -- measurement primitives ----------------------------------------------------------------


def _latencies(call: Callable[[], Any], count: int, sync: Callable[[], None]) -> list[float]:
    """Host call to result ready, one call at a time (seconds)."""
    clock = time.perf_counter
    times = []
    for _ in range(count):
        started = clock()
        call()
        sync()
        times.append(clock() - started)
    return times


def _throughput(call: Callable[[], Any], count: int, sync: Callable[[], None]) -> list[float]:
    """Pipelined: ``count`` calls and one synchronize at the end (calls per second)."""
    sync()
    started = time.perf_counter()
    for _ in range(count):
        call()
    sync()
    return [count / max(time.perf_counter() - started, 1e-12)]


def _split(total: int, blocks: int) -> list[int]:
    blocks = max(1, min(blocks, total))
    base, extra = divmod(total, blocks)
    return [base + (1 if i < extra else 0) for i in range(blocks)]


def _warm_on(streams: CaptureStreams | None, model: torch.nn.Module,
             inputs: Sequence[torch.Tensor], device: torch.device) -> None:
    """torch's recipe: forwards on a side stream, then wait and synchronize."""
    assert streams is not None
    side = streams.warm
    caller = torch.cuda.current_stream(device)
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP):
            model(*inputs)
    caller.wait_stream(side)
    torch.cuda.synchronize(device)


def kernel_time_per_call(graph: torch.cuda.CUDAGraph, device: torch.device, replays: int
                         ) -> tuple[float, str]:
    """GPU time per replay of ``graph`` (microseconds) and how it was measured.

    CUDA events bracket ``replays`` back-to-back replays. The replays are queued behind a
    sleep kernel long enough for the host to enqueue them all, so the GPU runs them without
    waiting on the host: what the events see is GPU time, not launch overhead.
    """
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        unheld = _event_time(graph, stream, replays, hold_cycles=0)
        enqueue_s = time.perf_counter() - started
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return unheld * 1e3 / replays, (f"CUDA events around {replays} back-to-back replays "
                                            "(no sleep kernel here: may include host gaps)")
        cycles_per_ms = _sleep_rate(stream)
        hold_ms = max(2.0, 3e3 * enqueue_s)
        held = _event_time(graph, stream, replays, hold_cycles=int(hold_ms * cycles_per_ms))
    per_call = min(held, unheld) * 1e3 / replays
    return per_call, (f"CUDA events around {replays} back-to-back replays queued behind a "
                      f"{hold_ms:.1f} ms sleep kernel")


def _event_time(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream, replays: int,
                hold_cycles: int) -> float:
    """Milliseconds between events around ``replays`` replays."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    if hold_cycles:
        torch.cuda._sleep(hold_cycles)
    start.record(stream)
    for _ in range(replays):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def _sleep_rate(stream: torch.cuda.Stream) -> float:
    """Cycles of ``torch.cuda._sleep`` per millisecond on this GPU."""
    cycles = 2_000_000
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles // 10)
    start.record(stream)
    torch.cuda._sleep(cycles)
    end.record(stream)
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def measure_pools(session: _Session, inputs: Sequence[Sequence[torch.Tensor]],
                  labels: Sequence[str]) -> dict[str, Any]:
    """Graph memory of every shape in one shared pool (largest first) vs one pool per shape.

    Every shape is warmed up first, then ``empty_cache``; each figure is the growth of
    ``memory_reserved`` across the captures alone. Graphs are freed afterwards.
    """
    device = session.target
    order = sorted(range(len(inputs)), key=lambda i: -sum(t.numel() for t in inputs[i]))
    assert session.streams is not None
    with torch.cuda.device(device):
        statics = [[t.detach().clone() for t in sample] for sample in inputs]
        for static in statics:
            _warm_on(session.streams, session.model, static, device)
        shared: dict[str, int] = {}
        graphs: list[_BareGraph] = []
        pool = torch.cuda.graph_pool_handle()
        with private_cublas_workspace():  # as the predictor captures: one workspace, in the pool
            _settle(device)  # release the warm-ups' workspaces, freed just now, before measuring
            for index in order:
                before = torch.cuda.memory_reserved(device)
                graphs.append(session._capture(statics[index], pool))
                shared[labels[index]] = torch.cuda.memory_reserved(device) - before
        graphs.clear()
        del pool
        _settle(device)
        private: dict[str, int] = {}
        for index in order:
            _settle(device)
            before = torch.cuda.memory_reserved(device)
            with private_cublas_workspace():
                graphs.append(session._capture(statics[index], None))
            private[labels[index]] = torch.cuda.memory_reserved(device) - before
        graphs.clear()
        _settle(device)
    largest = labels[order[0]]
    return {
        "shared_pool_bytes": sum(shared.values()),
        "shared_pool_growth_by_shape": shared,
        "private_pools_bytes": sum(private.values()),
        "private_pool_by_shape": private,
        "largest_shape": largest,
        "largest_alone_bytes": private[largest],
        "shared_over_largest_alone": sum(shared.values()) / private[largest] if private[largest]
        else None,
    }


def _settle(device: torch.device) -> None:
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()


def _recover(device: torch.device) -> None:
    """After a failure on the GPU: drain pending work; raise if the context is unusable."""
    with contextlib.suppress(RuntimeError):
        torch.cuda.synchronize(device)
    try:
        probe = torch.ones(4, device=device)
        healthy = float((probe * 2).sum().item()) == 8.0
    except RuntimeError as exc:
        raise BenchError(f"the CUDA context is unusable after a failed variant: {exc}") from exc
    if not healthy:
        raise BenchError("the CUDA context is unusable after a failed variant")


def _dynamo_counts() -> tuple[int, int]:
    """Inductor's cudagraph skips and dynamo's graph breaks so far in this process."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return 0, 0
    skips = int(counters.get("inductor", {}).get("cudagraph_skips", 0))
    breaks = int(sum(counters.get("graph_break", {}).values()))
    return skips, breaks


def _reset_dynamo() -> None:
    with contextlib.suppress(Exception):  # best effort: a later bench recompiles anyway
        torch._dynamo.reset()


def _max_abs_diff(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    worst = 0.0
    for a, b in zip(got, want):
        if a.shape != b.shape:
            return float("inf")
        diff = (a.detach().double().cpu() - b.detach().double().cpu()).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst


# -- statistics --------------------------------------------------------------------------------


def _stats(seconds: Sequence[float]) -> dict[str, float]:
    us = np.asarray(seconds, dtype=np.float64) * 1e6
    return {"median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)),
            "p99_us": float(np.percentile(us, 99)), "mean_us": float(us.mean()),
            "min_us": float(us.min()), "calls": int(us.size)}


def _spread(values: Sequence[float]) -> float | None:
    values = [v for v in values if v]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / min(values) * 100.0


def _finish_shape(variants: list[_Variant], result: ShapeResult) -> ShapeResult:
    for variant in variants:
        result.variants[variant.name] = _result_of(variant)
    eager = result.variants.get("eager")
    bare = result.variants.get("bare_graph")
    for item in result.variants.values():
        if item.median_us is None:
            continue
        if eager is not None and eager.median_us:
            item.speedup_vs_eager = eager.median_us / item.median_us
        if bare is not None and bare.median_us:
            item.overhead_vs_bare = item.median_us / bare.median_us
        if result.kernel_us:
            item.ratio_to_kernel = item.median_us / result.kernel_us
    return result


def _result_of(variant: _Variant) -> VariantResult:
    result = VariantResult(name=variant.name, label=LABELS[variant.name], status=variant.status,
                           reason=variant.reason, note=variant.note,
                           first_call_s=variant.first_call_s, warmup_s=variant.warmup_s,
                           max_abs_diff_vs_eager=variant.max_abs_diff)
    rounds = [s for s in variant.samples if s]
    if variant.status != "ok" or not rounds:
        return result
    pooled = _stats([t for s in rounds for t in s])
    result.median_us, result.p90_us, result.p99_us = (pooled["median_us"], pooled["p90_us"],
                                                      pooled["p99_us"])
    result.mean_us, result.min_us = pooled["mean_us"], pooled["min_us"]
    result.repeats = [_stats(s) for s in rounds]
    for stats, rate in zip(result.repeats, variant.throughput):
        stats["throughput_cps"] = rate
    result.spread_pct = _spread([s["median_us"] for s in result.repeats])
    if variant.throughput:
        result.throughput_cps = float(np.median(variant.throughput))
        result.throughput_spread_pct = _spread(variant.throughput)
    return result


# -- environment -------------------------------------------------------------------------------


def machine_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": platform.node(), "platform": platform.platform(terse=True),
        "python": platform.python_version(), "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
        "gpu": None, "gpu_memory_bytes": None, "cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_bytes"] = int(props.total_memory)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"torch": torch.__version__, "qkan_pack": __version__}
    for name in ("triton", "qkan", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _settings_dict(settings: BenchSettings) -> dict[str, Any]:
    data = asdict(settings)
    data["skip"] = list(settings.skip)
    data["throughput_calls"] = settings.pipelined_calls
    data["latency"] = "host call to result ready (synchronize after each call)"
    data["interleaving"] = (f"round-robin in {min(settings.blocks, settings.iters)} blocks per "
                            "repeat, order rotated each block")
    return data


def _finite(value: Any) -> Any:
    """JSON-safe: inf and nan become None."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
