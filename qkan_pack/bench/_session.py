"""``qkan-pack bench``: the predictor and its alternatives, side by side, on one artifact.

Everything runs in one process on the same artifact, for every manifest shape, with the
variants (``_variants``) interleaved round-robin (in blocks, the order rotating each block)
so that drift in clocks, caches or neighbours hits them all alike. Latency is host call to
result ready (``torch.cuda.synchronize`` after every call): median, p90, p99. Throughput is
many calls with one synchronize at the end. Both are measured ``repeats`` times and the
spread between repeats is reported so noise is visible. On CUDA the GPU time per call of
back-to-back bare replays is the physical floor every variant is compared with, and the
graph memory of one shared pool is compared with one pool per shape. Without CUDA only
eager and the predictor (eager there too) are compared.

Not owned here: fresh-process cold starts (``_cold``), tables/JSON/plots (``_render``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..runtime import (
    Predictor,
    bind_forward,
    describe,
    flatten,
    package_versions,
    progress_bar,
    read_artifact,
    rebuild_model,
    reference_samples,
    resolve_device,
)
from ._machine import machine_info
from ._memory import measure_pools
from ._results import BenchReport, BenchSettings, ShapeResult, finish_shape, settings_dict
from ._timing import kernel_time_per_call, latencies, split, throughput
from ._variants import Contestants, Variant, dynamo_counts, fail_variant, first_calls

CPU_NOTE = ("CUDA graphs need CUDA: this host has none, so only eager PyTorch and the predictor "
            "(which runs eagerly here) were compared; run on a GPU host with --device cuda for "
            "graph replay, qkan.compile_inference, torch.compile and GPU memory")


def run_bench(path: str | Path, device: str = "auto", *, settings: BenchSettings | None = None,
              progress: bool | None = None) -> BenchReport:
    """Benchmark every manifest shape of the artifact at ``path`` on ``device``.

    ``device`` is ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    Cold starts (fresh processes) are ``_cold.run_cold``'s.
    """
    settings = settings or BenchSettings()
    settings.check()
    target = resolve_device(device)
    on_device = torch.cuda.device(target) if target.type == "cuda" else contextlib.nullcontext()
    with torch.no_grad(), on_device:  # Triton launches on the current device
        session = _Session(Path(path), target, settings)
        try:
            report = session.run(progress)
        finally:
            session.close()
    return report


class _Session:
    """The predictor, an eager twin of its model, reference inputs, and the timing loop."""

    def __init__(self, path: Path, target: torch.device, settings: BenchSettings) -> None:
        self.settings = settings
        self.target = target
        self.cuda = target.type == "cuda"
        self.predictor = Predictor.load(path, device=target, progress=False,
                                        config_overrides=settings.config_overrides)
        artifact = read_artifact(path, expected_digest=self.predictor.digest)
        self.manifest = artifact.manifest
        config = dict(self.predictor.report.config)
        self.model = rebuild_model(artifact, target, config)
        names, call = self.manifest.input_names, self.manifest.call
        self.samples, self.references = reference_samples(artifact, target)
        self.contestants = Contestants(
            self.model, lambda: rebuild_model(artifact, target, config),
            lambda model: bind_forward(model, names, call), self.predictor, target,
            len(self.samples), settings.skip, settings.precisions)
        self.forward = self.contestants.forward  # the predictor's call: named inputs by keyword
        self.sync: Callable[[], None] = (lambda: torch.cuda.synchronize(target)) if self.cuda \
            else (lambda: None)
        self._rounds = 0

    def run(self, progress: bool | None) -> BenchReport:
        notes: list[str] = [] if self.cuda else [CPU_NOTE]
        memory = self._memory(notes) if self.cuda else None
        tasks: list[tuple[str, int]] = []
        for index in range(len(self.samples)):
            tasks += [("setup", index), *[("time", index)] * self.settings.repeats]
        results: list[ShapeResult] = []
        current: tuple[list[Variant], ShapeResult] | None = None
        for step, index in progress_bar(tasks, desc="benchmarking", total=len(tasks),
                                        enabled=progress):
            if step == "setup":
                if current is not None:
                    results.append(finish_shape(*current))
                current = self._setup_shape(index)
            else:
                assert current is not None
                self._timing_round(*current)
        if current is not None:
            results.append(finish_shape(*current))
        return BenchReport(
            artifact=self._artifact_info(), device=str(self.target),
            machine=machine_info(self.target), versions=package_versions("triton", "numpy"),
            settings=settings_dict(self.settings), load=self._load_info(), shapes=results,
            memory=memory, notes=notes,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )

    def close(self) -> None:
        self.predictor.close()
        self.contestants.close()

    def _setup_shape(self, index: int) -> tuple[list[Variant], ShapeResult]:
        label, inputs = self.samples[index]
        result = ShapeResult(label=label)
        variants = self.contestants.for_shape(inputs, self.references[index])
        want = flatten(self.forward(*inputs))
        for variant in variants:
            if variant.call is None:
                continue
            before = dynamo_counts()
            try:
                first_calls(variant, want, self.settings.warmup, self.sync)
            except Exception as exc:
                fail_variant(variant, "failed at its first calls", exc, self.target)
                continue
            self.contestants.note_first_calls(variant, before)
        if self.cuda:
            self._kernel_floor(next(v for v in variants if v.name == "bare_graph"), result)
            for variant in variants:
                if variant.name.startswith("precision_") and variant.graph is not None:
                    self._graph_time(variant)
        return variants, result

    def _graph_time(self, variant: Variant) -> None:
        """A precision variant's GPU time per replay of its graph."""
        assert variant.graph is not None
        try:
            variant.kernel_us, _ = kernel_time_per_call(variant.graph.graph, self.target,
                                                        self.settings.kernel_replays)
        except Exception as exc:
            fail_variant(variant, "failed while measuring its GPU time", exc, self.target)

    def _timing_round(self, variants: list[Variant], result: ShapeResult) -> None:
        live = [v for v in variants if v.call is not None]
        samples: dict[str, list[float]] = {v.name: [] for v in live}
        for block, count in enumerate(split(self.settings.iters, self.settings.blocks)):
            shift = block % len(live)
            for variant in live[shift:] + live[:shift]:
                samples[variant.name] += self._guarded(variant, latencies, count)
        for variant in live:
            variant.samples.append(samples[variant.name])
        self._rounds += 1
        shift = self._rounds % max(1, len(live))
        for variant in live[shift:] + live[:shift]:
            rate = self._guarded(variant, throughput, self.settings.pipelined_calls)
            if rate:
                variant.throughput.append(rate[0])

    def _guarded(self, variant: Variant, measure: Callable[..., list[float]],
                 count: int) -> list[float]:
        if variant.call is None:
            return []
        try:
            return measure(variant.call, count, self.sync)
        except Exception as exc:
            fail_variant(variant, "failed while timed", exc, self.target)
            return []

    def _kernel_floor(self, bare: Variant, result: ShapeResult) -> None:
        if bare.call is None or bare.graph is None:
            result.kernel_method = f"unavailable: bare replay {bare.status} ({bare.reason})"
            return
        try:
            result.kernel_us, result.kernel_method = kernel_time_per_call(
                bare.graph.graph, self.target, self.settings.kernel_replays)
        except Exception as exc:
            fail_variant(bare, "failed while measuring the GPU floor", exc, self.target)
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
            memory.update(measure_pools(self.forward, [inputs for _, inputs in self.samples],
                                        [label for label, _ in self.samples], self.target))
        except Exception as exc:
            fail_variant(Variant("bare_graph"), "failed measuring pool memory", exc, self.target)
            notes.append(f"graph pool memory not measured: {describe(exc)}")
        return memory

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
                "precision": asdict(report.precision),
                "shapes": [asdict(r) for r in report.shapes], "warnings": list(report.warnings)}
