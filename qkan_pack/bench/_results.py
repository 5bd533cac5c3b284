"""Benchmark settings and results: dataclasses, statistics, ratios, JSON-safe dicts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from ..errors import BenchError
from ..format import PRECISIONS

if TYPE_CHECKING:
    from ._variants import Variant

from ._names import LABELS, SKIPPABLE

#: 4: precision variants (kernel_us, pool_bytes, precision_error); 3: padded calls
#: (vs_exact_call); 2: cold starts apart
SCHEMA = "qkan-pack-bench/4"


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
    #: ``bench --precision``: also the whole model's graph at each of these precisions.
    precisions: tuple[str, ...] = ()

    def check(self) -> None:
        for name in ("iters", "repeats", "warmup", "blocks", "kernel_replays"):
            value = getattr(self, name)
            if value < (0 if name == "warmup" else 1):
                raise BenchError(f"{name} must be at least {0 if name == 'warmup' else 1}, got {value}")
        bad = [name for name in self.skip if name not in SKIPPABLE]
        if bad:
            raise BenchError(f"cannot skip {', '.join(bad)}; skippable variants: "
                             f"{', '.join(SKIPPABLE)}")
        unknown = [name for name in self.precisions if name not in PRECISIONS]
        if unknown:
            raise BenchError(f"unknown precision {', '.join(unknown)}; precisions: "
                             f"{', '.join(PRECISIONS)}")

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
    #: A padded call's median over the exact call's (the predictor at this entry's shape).
    vs_exact_call: float | None = None
    #: Precision variants: GPU time per replay of their graph (us), the graph pool's growth
    #: at capture (bytes), and the largest difference from the float32 references as a share
    #: of each output's scale.
    kernel_us: float | None = None
    pool_bytes: int | None = None
    precision_error: float | None = None


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




def variant_ok(item: VariantResult | None) -> TypeGuard[VariantResult]:
    """Whether a variant ran and was timed (what tables and plots can show)."""
    return item is not None and item.status == "ok" and item.median_us is not None


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


def finish_shape(variants: list[Variant], result: ShapeResult) -> ShapeResult:
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
    exact, padded = result.variants.get("predictor"), result.variants.get("predictor_padded")
    if exact is not None and padded is not None and exact.median_us and padded.median_us:
        padded.vs_exact_call = padded.median_us / exact.median_us
    return result


def _result_of(variant: Variant) -> VariantResult:
    result = VariantResult(name=variant.name, label=LABELS[variant.name], status=variant.status,
                           reason=variant.reason, note=variant.note,
                           first_call_s=variant.first_call_s, warmup_s=variant.warmup_s,
                           max_abs_diff_vs_eager=variant.max_abs_diff,
                           kernel_us=variant.kernel_us, pool_bytes=variant.pool_bytes,
                           precision_error=variant.precision_error)
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


def settings_dict(settings: BenchSettings) -> dict[str, Any]:
    data = asdict(settings)
    data["skip"] = list(settings.skip)
    data["precisions"] = list(settings.precisions)
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
