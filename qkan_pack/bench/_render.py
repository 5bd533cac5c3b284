"""A ``BenchReport`` as a terminal table and a JSON file (plots: ``_plot``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._names import VARIANTS
from ._results import BenchReport, ShapeResult, VariantResult

MiB = 2**20
_COLUMNS = (f"  {'variant':<24}{'median':>9}{'p90':>9}{'p99':>9}{'spread':>8}{'calls/s':>10}"
            f"{'vs eager':>10}{'vs bare':>9}{'vs kernel':>11}")


def render_table(report: BenchReport) -> str:
    """The report for a terminal: one block per shape, then memory and notes."""
    versions = report.versions
    machine = report.machine
    where = report.device + (f" ({machine['gpu']})" if machine.get("gpu") else
                             f" ({machine.get('cpu')}, {machine.get('cpu_count')} cores)")
    settings = report.settings
    lines = [
        f"qkan-pack bench: {report.artifact['path']} ({report.artifact['model']}) on {where}",
        f"torch {versions.get('torch')}, triton {versions.get('triton') or '-'}, "
        f"qkan {versions.get('qkan') or '-'}, qkan-pack {versions.get('qkan_pack')}; "
        f"{report.created}",
        f"{settings['iters']} calls x {settings['repeats']} repeats per variant, "
        f"{settings['interleaving']}; latency = {settings['latency']}; times in us",
    ]
    for shape in report.shapes:
        lines += ["", *_shape_block(shape)]
    lines += ["", *_legend(report)]
    if report.memory:
        lines += ["", *_memory_block(report.memory)]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _shape_block(shape: ShapeResult) -> list[str]:
    floor = (f"GPU kernel time per call {shape.kernel_us:.1f} us ({shape.kernel_method})"
             if shape.kernel_us else (shape.kernel_method or "no GPU kernel floor (CPU)"))
    lines = [f"shape {shape.label} · {floor}", _COLUMNS]
    for name in VARIANTS:
        item = shape.variants.get(name)
        if item is not None:
            lines.append(_variant_row(item))
    return lines


def _variant_row(item: VariantResult) -> str:
    if item.status != "ok" or item.median_us is None:
        return f"  {item.label:<24}{item.status}: {item.reason}"
    row = (f"  {item.label:<24}{item.median_us:>9.1f}{item.p90_us:>9.1f}{item.p99_us:>9.1f}"
           f"{_pct(item.spread_pct):>8}{_num(item.throughput_cps):>10}"
           f"{_ratio(item.speedup_vs_eager):>10}{_ratio(item.overhead_vs_bare):>9}"
           f"{_ratio(item.ratio_to_kernel):>11}")
    if item.warmup_s is not None and item.name in ("torch_compile", "qkan_compile_inference"):
        row += f"   warm-up {item.warmup_s:.2f}s (first call {item.first_call_s:.2f}s)"
    if item.vs_exact_call is not None:
        row += f"   {item.vs_exact_call:.3f}x the exact call ({item.note})"
    if item.precision_error is not None:
        row += f"   error {item.precision_error:.2g} of scale vs the float32 references"
        if item.kernel_us is not None:
            row += f"; GPU {item.kernel_us:.1f} us/call"
        if item.pool_bytes is not None:
            row += f"; pool {item.pool_bytes / MiB:.2f} MiB"
    elif item.max_abs_diff_vs_eager is not None and item.max_abs_diff_vs_eager > 1e-3:
        row += f"   max |diff| vs eager {item.max_abs_diff_vs_eager:.2e}"
    return row


def _legend(report: BenchReport) -> list[str]:
    return [
        "spread: max-min of the repeat medians over their min (larger than a difference = noise)",
        "calls/s: pipelined, one synchronize after all calls; vs eager: speedup (eager median / "
        "median);",
        "vs bare: overhead over bare torch.cuda.CUDAGraph replay with copy_ in and clone out; "
        "vs kernel: median over the GPU time per call (the physical floor)",
    ]


def _memory_block(memory: dict[str, Any]) -> list[str]:
    lines = ["GPU memory of captured graphs:"]
    if "shared_pool_bytes" in memory:
        ratio = memory.get("shared_over_largest_alone")
        lines += [
            f"  one shared pool, all shapes   {memory['shared_pool_bytes'] / MiB:>9.2f} MiB",
            f"  one private pool per shape    {memory['private_pools_bytes'] / MiB:>9.2f} MiB "
            f"(sum over shapes)",
            f"  largest shape ({memory['largest_shape']}) alone {memory['largest_alone_bytes'] / MiB:>9.2f}"
            f" MiB; shared / largest alone = {_ratio(ratio)}",
        ]
    per_shape = ", ".join(f"{k} {v / MiB:.2f}" for k, v in memory["predictor_shapes"].items())
    lines.append(f"  predictor (recorded at load)  {memory['predictor_pool_bytes'] / MiB:>9.2f} MiB "
                 f"(per shape: {per_shape})")
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


# -- files ---------------------------------------------------------------------------------------


def write_json(report: BenchReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2, allow_nan=False) + "\n")
    return path
