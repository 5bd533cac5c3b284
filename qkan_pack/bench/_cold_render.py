"""The cold-start report (``_cold.run_cold``) as a terminal table and a PNG."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._cold import STAGES
from ._plot import new_axes, save_png

STAGE_LABELS = {
    "python start": "interpreter start",
    "import torch": "import torch",
    "import qkan_pack": "import qkan_pack.runtime",
    "verify": "artifact verification",
    "kernel cache": "shipped kernels (match, copy)",
    "import": "model source import (qkan...)",
    "cuda init": "CUDA init (wait)",
    "build": "model build",
    "weights": "weights",
    "references": "reference inputs",
    "first forward": "first forward (kernels)",
    "reference self-test": "reference self-test",
    "padding self-test": "padding self-test",
    "precision gate": "precision gate",
    "replay baseline": "eager replay baseline",
    "compile": "compiled code (load or compile)",
    "capture": "graph capture",
    "self-test": "replay self-test",
    "load, other": "load, other",
    "first call": "first call -> first result",
}
VARIANT_LABELS = {"predictor": "predictor", "compiled": "compiled mode",
                  "torch_compile": "torch.compile r-o"}
TOP_PACKAGES = 8


def render_cold(report: Mapping[str, Any]) -> str:
    """Stages (median of the runs), headline, imports by package, module states, profile."""
    variants = report["variants"]
    machine = report.get("machine", {})
    where = report["device"] + (f" ({machine['gpu']})" if machine.get("gpu") else "")
    lines = [
        f"cold start: {report['artifact']['path']} ({report['artifact']['model']}) on {where}",
        f"{report['settings']['runs']} fresh process(es) per variant; caches {report['caches']}",
        *_bytecode_cache(report),
        "seconds, median over runs; host tensor in, host tensor out, first manifest shape",
        "",
        f"  {'stage':<34}" + "".join(f"{VARIANT_LABELS[v]:>20}" for v in variants),
    ]
    for stage in STAGES:
        cells = [s.get("stages_s", {}).get(stage) for s in variants.values()]
        if any(c for c in cells):
            lines.append(f"  {STAGE_LABELS[stage]:<34}" + "".join(_cell(c) for c in cells))
    lines += _headline(variants)
    lines += _steady(variants)
    lines += _imports(variants)
    for name, summary in variants.items():
        lines += _variant_notes(name, summary)
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)


def _bytecode_cache(report: Mapping[str, Any]) -> list[str]:
    cache = report.get("bytecode_cache")
    if not cache:
        return []
    return [f"bytecode: every module on the import path compiled into {cache['path']} first "
            f"({cache['seconds']:.1f} s, not counted), processes run with PYTHONPYCACHEPREFIX there"]


#: Modules compiled from source in a start, beyond which the report says so loudly.
MANY_COMPILED = 50


def _bytecode_note(label: str, bytecode: Mapping[str, Any] | None) -> list[str]:
    """How much of the start was Python compiling sources it had no .pyc for."""
    if not bytecode:
        return []
    by_package = ", ".join(f"{k} {v}" for k, v in bytecode["by_package"].items())
    line = (f"  {label}: bytecode: {bytecode['compiled_here']} of {bytecode['modules']} modules "
            f"compiled from source in the process" + (f" ({by_package})" if by_package else ""))
    if bytecode["compiled_here"] >= MANY_COMPILED:
        line += ("; this host has no .pyc for them, so every start pays for compiling -- "
                 "--bytecode-cache DIR measures a host installed with bytecode")
    return [line]


def _cell(value: float | None, digits: int = 3) -> str:
    return f"{value:>20.{digits}f}" if value is not None else f"{'-':>20}"


def _headline(variants: Mapping[str, Any]) -> list[str]:
    rows = [("process start -> first result", "total_s"),
            ("  over import torch", "over_import_torch_s")]
    lines = []
    for title, key in rows:
        cells = []
        for summary in variants.values():
            value = summary.get(key)
            cells.append(f"{value['median']:>8.3f} [{value['min']:.2f}-{value['max']:.2f}]"
                         .rjust(20) if value else f"{'-':>20}")
        lines.append(f"  {title:<34}" + "".join(cells))
    for title, key, digits in (("first call (us)", "first_call_us", 1),
                               ("steady call, median (us)", "steady_us", 1),
                               ("calls until fast", "calls_to_fast", 0)):
        lines.append(f"  {title:<34}" + "".join(_cell(s.get(key), digits) for s in variants.values()))
    return lines


def _steady(variants: Mapping[str, Any]) -> list[str]:
    """After the first result, inputs on the device: the goal-2 figures."""
    rows = [("device call, median (us)", "predictor_us"),
            ("bare replay of its graph (us)", "bare_replay_us"),
            ("  predictor / bare replay", "predictor_over_bare"),
            ("GPU time per call (us)", "gpu_us")]
    if not any(s.get("steady") for s in variants.values()):
        return []
    lines = ["", f"steady state at {next(s['steady']['shape'] for s in variants.values() if s.get('steady'))}"
                 ", inputs on the device (median over runs):"]
    for title, key in rows:
        lines.append(f"  {title:<34}" + "".join(
            _cell((s.get("steady") or {}).get(key), 3 if key == "predictor_over_bare" else 1)
            for s in variants.values()))
    today = (variants.get("predictor", {}).get("steady") or {}).get("gpu_us")
    compiled = (variants.get("compiled", {}).get("steady") or {}).get("gpu_us")
    if today and compiled:
        lines.append(f"  compiled / today's graph, GPU time per call: {compiled / today:.3f}x")
    return lines


def _imports(variants: Mapping[str, Any]) -> list[str]:
    lines = ["", "imports by top-level package (exclusive -X importtime seconds, median; whichever "
                 "stage imported them):"]
    for name, summary in variants.items():
        imports = summary.get("imports_s") or {}
        top = list(imports.items())[:TOP_PACKAGES]
        rest = sum(list(imports.values())[TOP_PACKAGES:])
        shown = ", ".join(f"{package} {seconds:.3f}" for package, seconds in top)
        lines.append(f"  {VARIANT_LABELS[name]}: {shown}, others {rest:.3f} "
                     f"(all {sum(imports.values()):.3f})")
    return lines


def _variant_notes(name: str, summary: Mapping[str, Any]) -> list[str]:
    label = VARIANT_LABELS[name]
    lines = [f"  {label} failed: {error}" for error in summary.get("errors", [])]
    if summary.get("modules"):
        states = ", ".join(f"{k} {v}" for k, v in summary["modules"].items())
        lines.append(f"  {label}: modules after the first result: {states}")
    lines += _bytecode_note(label, summary.get("bytecode"))
    load = summary.get("load") or {}
    if load:
        lines.append(f"  {label}: kernels: {load.get('kernel_cache')}; compiled: "
                     f"{load.get('compiled')}")
        lines += [f"  {label}: warning: {w}" for w in load.get("warnings", [])]
    if summary.get("profile"):
        lines += ["", f"profile of one extra {label} run (cProfile: load + first call; not "
                      "timed above), top by cumulative time:"]
        lines += [f"  {row['cumtime_s']:>8.3f}s cum {row['tottime_s']:>8.3f}s own "
                  f"{row['calls']:>7}x  {row['function']}" for row in summary["profile"]["cumulative"]]
        lines += ["", "  top by own time:"]
        lines += [f"  {row['tottime_s']:>8.3f}s own {row['calls']:>7}x  {row['function']}"
                  for row in summary["profile"]["tottime"][:15]]
    if summary.get("profile_error"):
        lines.append(f"  {label}: the profiled run failed: {summary['profile_error']}")
    return lines


def write_cold_plot(report: Mapping[str, Any], path: str | Path) -> Path:
    """One stacked bar per variant (median seconds per stage), each run's total as a dot."""
    variants = {n: s for n, s in report["variants"].items() if s.get("stages_s")}
    figure, axes = new_axes(12.0, 2.6 + 0.8 * max(1, len(variants)))
    colours = _stage_colours()
    for row, summary in enumerate(variants.values()):
        left = 0.0
        for stage in STAGES:
            width = summary["stages_s"].get(stage, 0.0)
            if width > 0:
                axes.barh(row, width, left=left, color=colours[stage], edgecolor="white",
                          linewidth=0.5, label=STAGE_LABELS[stage] if row == 0 else None)
                left += width
        totals = [r["total_s"] for r in summary["runs"] if r.get("total_s") is not None]
        axes.plot(totals, [row] * len(totals), "k|", markersize=14,
                  label="each run's total" if row == 0 else None)
    axes.set_yticks(range(len(variants)), [VARIANT_LABELS[n] for n in variants])
    axes.set_xlabel("seconds from process start (median per stage; | = each run's total)")
    machine = report.get("machine", {})
    axes.set_title(f"cold start, {Path(report['artifact']['path']).name} on "
                   f"{machine.get('gpu') or machine.get('cpu')}, {report['created'][:10]}\n"
                   f"torch {report.get('versions', {}).get('torch')}; caches: "
                   f"{'emptied' if report['settings']['fresh_caches'] else 'kept'}", fontsize=9)
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes.grid(axis="x", alpha=0.3)
    return save_png(figure, path)


def _stage_colours() -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    return {stage: palette(index % 20) for index, stage in enumerate(STAGES)}
