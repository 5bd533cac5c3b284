"""Reference benchmarks on a GPU host: JSON + PNG per model, a one-page summary, the targets.

    PYTHONPATH=. python benchmarks/run_reference.py OUT_DIR [--iters 300] [--skip torch_compile]

Builds into a temporary directory (nothing is written into the repository):
- ``qkan_2_8_2``   QKAN([2,8,2], reps=2) at 1x2, 64x2             (examples/qkan_mlp.py)
- ``qkan_64_r3``   QKAN([64,64,64], reps=3) at 1x64, 256x64       (--config width/reps)
- ``hqkan_gpt``    the HQKAN GPT example at 1x128, 8x128, int64   (examples/hqkan_gpt.py)
- ``pool8``        QKAN([64,64,64], reps=3) at batch 1..128 (8 shapes), for pool memory only
then runs ``qkan-pack bench`` on each (one process, variants interleaved) and measures the
runtime issue's targets: predictor / bare replay <= 1.10x, >= 5x eager at batch 1 (QKAN
[2,8,2] and the GPT at 1x128), and 8 shapes in one pool <= 1.5x the largest shape alone.

OUT_DIR gets at most 8 files, named ``<date>_<gpu>_...``: ``bench_<model>.json`` and ``.png``
for the three models, ``summary.md`` (the one-page table) and ``reference.json`` (targets,
pool memory and the index). Every figure is printed as it is measured; a run cut short
still leaves what was finished.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from qkan_pack import build  # noqa: E402
from qkan_pack.bench import (  # noqa: E402
    SKIPPABLE,
    BenchReport,
    BenchSettings,
    machine_info,
    measure_memory,
    run_bench,
    versions,
)
from qkan_pack.bench_report import render_table, write_json, write_plot  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "qkan_2_8_2": {"source": "qkan_mlp.py", "shapes": "1x2,64x2", "config": {}, "dtype": "float32",
                   "title": "QKAN([2,8,2], reps=2)"},
    "qkan_64_r3": {"source": "qkan_mlp.py", "shapes": "1x64,256x64",
                   "config": {"width": [64, 64, 64], "reps": 3}, "dtype": "float32",
                   "title": "QKAN([64,64,64], reps=3)"},
    "hqkan_gpt": {"source": "hqkan_gpt.py", "shapes": "1x128,8x128", "config": {}, "dtype": "int64",
                  "title": "HQKAN GPT example"},
}
POOL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
POOL_CONFIG = {"width": [64, 64, 64], "reps": 3}
BATCH1 = {"qkan_2_8_2": "1x2", "hqkan_gpt": "1x128"}
TARGET_OVERHEAD, TARGET_SPEEDUP, TARGET_POOL = 1.10, 5.0, 1.5
MiB = 2**20


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("run_reference.py measures CUDA graphs: run it on a GPU host (--device cuda)")
        return 2
    started = time.perf_counter()
    machine = machine_info(device)
    prefix = args.prefix if args.prefix is not None else _prefix(machine)
    settings = BenchSettings(iters=args.iters, repeats=args.repeats, warmup=args.warmup,
                             kernel_replays=args.kernel_replays, skip=tuple(args.skip))
    reports: dict[str, BenchReport] = {}
    index: dict[str, Any] = {"machine": machine, "versions": versions(), "prefix": prefix,
                             "settings": {k: v for k, v in vars(args).items() if k != "out_dir"},
                             "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                             "models": {}, "pool": None, "targets": [], "elapsed_s": {}}
    with tempfile.TemporaryDirectory(prefix="qkan-pack-reference-") as scratch:
        for name in args.models:
            spec = MODELS[name]
            path = _build(Path(scratch) / name, spec["source"], spec["shapes"], spec["config"],
                          spec["dtype"], started)
            _log(started, f"bench {name} ({spec['title']}) on {device}")
            report = run_bench(path, str(device), settings=settings,
                               cold_start=name in args.cold_start,
                               fresh_kernel_cache=args.cold_start_cache == "fresh",
                               cold_start_timeout=args.cold_start_timeout,
                               show_progress=args.progress)
            reports[name] = report
            print(render_table(report), flush=True)
            files = {"json": write_json(report, out / f"{prefix}bench_{name}.json").name,
                     "png": write_plot(report, out / f"{prefix}bench_{name}.png").name}
            index["models"][name] = {"title": spec["title"], "shapes": spec["shapes"],
                                     "config": spec["config"], "files": files}
            index["elapsed_s"][name] = time.perf_counter() - started
            _write_index(out, prefix, index, reports)
        if not args.no_pool:
            shapes = ",".join(f"{b}x64" for b in POOL_BATCHES)
            path = _build(Path(scratch) / "pool8", "qkan_mlp.py", shapes, POOL_CONFIG, "float32",
                          started)
            _log(started, f"graph pool memory, QKAN([64,64,64], reps=3) at {shapes}")
            index["pool"] = measure_memory(path, str(device))
            index["elapsed_s"]["pool"] = time.perf_counter() - started
            print(json.dumps(index["pool"], indent=2), flush=True)
    index["elapsed_s"]["total"] = time.perf_counter() - started
    _write_index(out, prefix, index, reports)
    print(summary_markdown(index, reports), flush=True)
    _log(started, f"done: {out}/{prefix}summary.md")
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="where the JSON, PNG and summary files go")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=300, help="timed calls per variant per repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--kernel-replays", type=int, default=100)
    parser.add_argument("--skip", action="append", default=[], choices=SKIPPABLE,
                        help="leave a variant out (torch_compile compiles for tens of seconds)")
    parser.add_argument("--models", type=lambda s: [m for m in s.split(",") if m],
                        default=list(MODELS), help=f"subset of {','.join(MODELS)}")
    parser.add_argument("--cold-start", type=lambda s: [m for m in s.split(",") if m],
                        default=["qkan_2_8_2"], help="models to cold-start ('' for none)")
    parser.add_argument("--cold-start-cache", choices=("fresh", "inherited"), default="fresh",
                        help="empty Triton/Inductor caches for the cold start (a new host)")
    parser.add_argument("--cold-start-timeout", type=float, default=180.0,
                        help="seconds a cold-start process may take to its first call")
    parser.add_argument("--no-pool", action="store_true", help="skip the 8-shape pool memory")
    parser.add_argument("--prefix", help="file name prefix [default: <date>_<gpu>_]")
    parser.add_argument("--progress", action="store_true", help="progress bars on stderr")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    return args


def _log(started: float, message: str) -> None:
    print(f"[{time.perf_counter() - started:7.1f}s] {message}", flush=True)


def _prefix(machine: dict[str, Any]) -> str:
    gpu = re.sub(r"[^a-z0-9]+", "-", (machine.get("gpu") or "gpu").lower()).strip("-")
    return f"{dt.date.today().isoformat()}_{gpu.removeprefix('nvidia-')}_"


def _build(path: Path, source: str, shapes: str, config: dict[str, Any], dtype: str,
           started: float) -> Path:
    _log(started, f"build {path.name}: examples/{source} {shapes} {config or ''} {dtype}")
    build(ROOT / "examples" / source, shapes, output=path, config=config, dtype=dtype,
          progress_bar=False)
    return path


# -- targets and summary ----------------------------------------------------------------------


def targets(reports: dict[str, BenchReport], pool: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The runtime issue's figures, each with its goal and whether it was met."""
    rows: list[dict[str, Any]] = []
    for name, report in reports.items():
        for shape in report.shapes:
            item = shape.variants.get("predictor")
            bare = shape.variants.get("bare_graph")
            if item is None or item.overhead_vs_bare is None:
                why = bare.reason if bare is not None else "no bare replay"
                rows.append(_row(f"predictor / bare replay, {name} {shape.label}", None,
                                 f"<= {TARGET_OVERHEAD:.2f}x", None, why))
                continue
            rows.append(_row(f"predictor / bare replay, {name} {shape.label}",
                             item.overhead_vs_bare, f"<= {TARGET_OVERHEAD:.2f}x",
                             item.overhead_vs_bare <= TARGET_OVERHEAD,
                             f"{item.median_us:.1f} us vs {bare.median_us:.1f} us; spread "
                             f"{_pct(item.spread_pct)} / {_pct(bare.spread_pct)}"))
    for name, label in BATCH1.items():
        if name not in reports:
            continue
        shape = reports[name].shape(label)
        item, bare = shape.variants["predictor"], shape.variants.get("bare_graph")
        extra = (f"bare replay {bare.speedup_vs_eager:.1f}x" if bare and bare.speedup_vs_eager
                 else "")
        rows.append(_row(f"predictor speedup vs eager, {name} {label}", item.speedup_vs_eager,
                         f">= {TARGET_SPEEDUP:.0f}x",
                         None if item.speedup_vs_eager is None
                         else item.speedup_vs_eager >= TARGET_SPEEDUP, extra))
    if pool and pool.get("shared_over_largest_alone") is not None:
        ratio = pool["shared_over_largest_alone"]
        detail = (f"{pool['shared_pool_bytes'] / MiB:.2f} MiB shared vs "
                  f"{pool['largest_alone_bytes'] / MiB:.2f} MiB for {pool['largest_shape']} alone; "
                  f"one pool per shape {pool['private_pools_bytes'] / MiB:.2f} MiB")
        recorded = pool.get("predictor_shapes", {}).get(pool["largest_shape"])
        if recorded:
            detail += (f"; predictor recorded {pool['predictor_pool_bytes'] / MiB:.2f} MiB = "
                       f"{pool['predictor_pool_bytes'] / recorded:.2f}x its largest shape")
        rows.append(_row("pool memory, 8 shapes (batch 1..128) / largest alone", ratio,
                         f"<= {TARGET_POOL:.1f}x", ratio <= TARGET_POOL, detail))
    return rows


def _row(what: str, value: float | None, goal: str, met: bool | None, detail: str) -> dict[str, Any]:
    return {"target": what, "value": value, "goal": goal, "met": met, "detail": detail}


def summary_markdown(index: dict[str, Any], reports: dict[str, BenchReport]) -> str:
    machine, vers = index["machine"], index["versions"]
    settings = index["settings"]
    lines = [
        f"# qkan-pack reference benchmarks: {machine.get('gpu')}, {index['created'][:10]}",
        "",
        f"torch {vers.get('torch')} · triton {vers.get('triton')} · qkan {vers.get('qkan')} · "
        f"qkan-pack {vers.get('qkan_pack')} · Python {machine.get('python')} · CUDA "
        f"{machine.get('cuda')} · host CPU {machine.get('cpu')} ({machine.get('cpu_count')} cores)",
        "",
        f"Latency = host call to result ready (`torch.cuda.synchronize()` after each call), median "
        f"of {settings['repeats']} x {settings['iters']} calls per variant, variants interleaved "
        "round-robin in one process; p90 in parentheses; µs. GPU kernel = GPU time per call of "
        "back-to-back bare replays (the floor).",
        "",
        "| model | shape | eager | predictor | bare replay | qkan.compile_inference | "
        "torch.compile r-o | GPU kernel | predictor / bare | predictor vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, report in reports.items():
        for shape in report.shapes:
            v = shape.variants
            cells = [_cell(v.get(n)) for n in ("eager", "predictor", "bare_graph",
                                               "qkan_compile_inference", "torch_compile")]
            pred = v["predictor"]
            lines.append(f"| {index['models'][name]['title']} | {shape.label} | " + " | ".join(cells)
                         + f" | {_us(shape.kernel_us)} | {_x(pred.overhead_vs_bare)} | "
                         f"{_x(pred.speedup_vs_eager)} |")
    lines += ["", "## Targets (runtime issue)", "", "| target | figure | goal | met | detail |",
              "|---|---|---|---|---|"]
    for row in index["targets"]:
        met = {True: "yes", False: "**NO**", None: "n/a"}[row["met"]]
        lines.append(f"| {row['target']} | {_x(row['value'])} | {row['goal']} | {met} | "
                     f"{row['detail']} |")
    lines += _throughput_section(index, reports)
    lines += _memory_section(index, reports)
    lines += _warmup_section(index, reports)
    lines += _cold_section(reports)
    failed = [(name, s.label, item.label, item.reason) for name, r in reports.items()
              for s in r.shapes for item in s.variants.values() if item.status != "ok"]
    if failed:
        lines += ["", "## Not measured", ""]
        lines += [f"- {name} {label} {variant}: {reason}" for name, label, variant, reason in failed]
    lines += ["", f"Files: {', '.join(f for m in index['models'].values() for f in m['files'].values())}; "
              f"run time {index['elapsed_s'].get('total', 0):.0f} s."]
    return "\n".join(lines) + "\n"


def _throughput_section(index: dict[str, Any], reports: dict[str, BenchReport]) -> list[str]:
    lines = ["", "## Pipelined throughput (calls/s, one synchronize at the end)", "",
             "| model | shape | eager | predictor | bare replay | qkan.compile_inference | "
             "torch.compile r-o |", "|---|---|---|---|---|---|---|"]
    for name, report in reports.items():
        for shape in report.shapes:
            cells = []
            for n in ("eager", "predictor", "bare_graph", "qkan_compile_inference", "torch_compile"):
                item = shape.variants.get(n)
                ok = item is not None and item.throughput_cps
                cells.append(f"{item.throughput_cps:,.0f}" if ok else "-")
            lines.append(f"| {index['models'][name]['title']} | {shape.label} | " + " | ".join(cells)
                         + " |")
    return lines


def _memory_section(index: dict[str, Any], reports: dict[str, BenchReport]) -> list[str]:
    lines = ["", "## Graph memory (MiB)", "",
             "| model | shapes | one shared pool | one pool per shape (sum) | predictor recorded |",
             "|---|---|---|---|---|"]
    rows = [(index["models"][n]["title"], index["models"][n]["shapes"], r.memory)
            for n, r in reports.items()]
    if index.get("pool"):
        rows.append(("QKAN([64,64,64], reps=3)", ",".join(f"{b}x64" for b in POOL_BATCHES),
                     index["pool"]))
    for title, shapes, memory in rows:
        if not memory or "shared_pool_bytes" not in memory:
            continue
        lines.append(f"| {title} | {shapes} | {memory['shared_pool_bytes'] / MiB:.2f} | "
                     f"{memory['private_pools_bytes'] / MiB:.2f} | "
                     f"{memory['predictor_pool_bytes'] / MiB:.2f} |")
    return lines


def _warmup_section(index: dict[str, Any], reports: dict[str, BenchReport]) -> list[str]:
    lines = ["", "## Warm-up in the benchmark process (s)", "",
             "| model | shape | predictor load-to-ready (all shapes) | qkan.compile_inference first "
             "call | torch.compile first call | torch.compile warm-up total |",
             "|---|---|---|---|---|---|"]
    for name, report in reports.items():
        for shape in report.shapes:
            qk = shape.variants.get("qkan_compile_inference")
            tc = shape.variants.get("torch_compile")
            lines.append(f"| {index['models'][name]['title']} | {shape.label} | "
                         f"{report.load.get('load_to_ready_s', 0):.2f} | {_s(qk, 'first_call_s')} | "
                         f"{_s(tc, 'first_call_s')} | {_s(tc, 'warmup_s')} |")
    return lines


def _cold_section(reports: dict[str, BenchReport]) -> list[str]:
    lines: list[str] = []
    for name, report in reports.items():
        cold = report.cold_start
        if not cold:
            continue
        runs = [(k, cold[k]) for k in ("predictor", "torch_compile") if cold.get(k)]
        lines += ["", f"## Cold start: {name} at {cold['shape']}, kernel caches {cold['kernel_cache']}",
                  "", "| stage (s) | " + " | ".join(k for k, _ in runs) + " |",
                  "|---|" + "---|" * len(runs)]
        stages: list[str] = []
        for _, run in runs:
            stages += [s for s, _ in run.get("stages", []) if s not in stages]
        for stage in stages:
            cells = [dict(run.get("stages", [])).get(stage) for _, run in runs]
            lines.append(f"| {stage} | " + " | ".join("" if c is None else f"{c:.3f}" for c in cells)
                         + " |")
        for key, title in (("total_s", "**launch to first result**"),
                           ("fast_total_s", "**launch to first fast call**"),
                           ("steady_us", "steady call (µs)")):
            cells = [run.get(key) for _, run in runs]
            lines.append(f"| {title} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
                         + " |")
        lines += [f"- {k} failed: {run['error']}" for k, run in runs if run.get("error")]
    return lines


def _write_index(out: Path, prefix: str, index: dict[str, Any],
                 reports: dict[str, BenchReport]) -> None:
    index["targets"] = targets(reports, index["pool"])
    (out / f"{prefix}reference.json").write_text(json.dumps(_clean(index), indent=2) + "\n")
    if reports:
        (out / f"{prefix}summary.md").write_text(summary_markdown(index, reports))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _cell(item: Any) -> str:
    if item is None:
        return "-"
    if item.status != "ok" or item.median_us is None:
        return item.status
    return f"{item.median_us:.1f} ({item.p90_us:.1f})"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _s(item: Any, key: str) -> str:
    value = getattr(item, key, None) if item is not None and item.status == "ok" else None
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
