"""Issue 44, item 4: what a predictor's call costs over a bare replay, per shape, against the
1.05 target (run by call-overhead.sh on a GPU host).

Two comparisons per shape, inputs on the device, a synchronize after each call:

- bench's: ``qkan-pack bench`` JSON (the predictor beside a bare graph that bench captures
  itself, in a private pool; each graph's GPU time may differ a little from the other's);
- its own graph's: here, the predictor against a bare replay of the predictor's own graph
  (``Predictor.whole_graph``: ``copy_`` in, replay, ``clone`` out), interleaved in rotating
  blocks. The same graph on both sides: the difference is the call's host work alone. Beside
  it the GPU time per replay of that graph (CUDA events around 200 back-to-back replays),
  to set against bench's floor, the GPU time of bench's own bare graph.

    python3 benchmarks/device/call_overhead.py RESULTS NAME=ARTIFACT ...

reads RESULTS/bench-NAME.json, writes RESULTS/call-overhead.json and prints the table.
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from qkan_pack import Predictor
from qkan_pack.runtime import cpu_model, torch_dtype

TARGET = 1.05
ROUNDS, BLOCK = 30, 100  # per variant: 3,000 timed calls in 30 blocks, order rotating


def device_inputs(predictor: Predictor, index: int) -> list[torch.Tensor]:
    """Random floats, zero integers (valid token ids), on the predictor's device."""
    generator = torch.Generator().manual_seed(index)
    manifest = predictor.manifest
    tensors = []
    for name, shape in manifest.shapes[index].inputs:
        dtype = torch_dtype(manifest.input_dtype(name))
        tensor = (torch.randn(shape, generator=generator).to(dtype) if dtype.is_floating_point
                  else torch.zeros(shape, dtype=dtype))
        tensors.append(tensor.to(predictor.device))
    return tensors


def interleaved(calls: dict[str, object], device: torch.device) -> dict[str, float]:
    """Median latency (us) of each call, host call to result ready, blocks interleaved."""
    for call in calls.values():
        for _ in range(50):
            call()
    torch.cuda.synchronize(device)
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock, sync = time.perf_counter, torch.cuda.synchronize
    for round_ in range(ROUNDS):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            call = calls[name]
            for _ in range(BLOCK):
                started = clock()
                call()
                sync(device)
                samples[name].append(clock() - started)
    return {name: statistics.median(times) * 1e6 for name, times in samples.items()}


def own_graph(predictor: Predictor) -> dict[str, dict[str, float]]:
    """Per shape: the predictor, a bare replay of its own graph, that graph's GPU time."""
    rows = {}
    for index, entry in enumerate(predictor.manifest.shapes):
        graph = predictor.whole_graph(index)
        if graph is None:
            rows[entry.label] = {"note": "not captured whole: no bare replay of its graph"}
            continue
        inputs = device_inputs(predictor, index)
        medians = interleaved({"predictor": lambda: predictor(*inputs),  # noqa: B023
                               "own_replay": lambda: graph.replay_copy(inputs)},  # noqa: B023
                              predictor.device)
        gpu_us = gpu_time_per_replay(graph.graph, predictor.device)
        rows[entry.label] = {"predictor_us": medians["predictor"],
                             "own_replay_us": medians["own_replay"],
                             "over_own_replay": medians["predictor"] / medians["own_replay"],
                             "own_graph_gpu_us": gpu_us}
    return rows


def gpu_time_per_replay(graph: torch.cuda.CUDAGraph, device: torch.device,
                        replays: int = 200) -> float:
    """Microseconds per replay between CUDA events around back-to-back replays (the host
    enqueues a replay faster than these graphs run, so the events see GPU time)."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def bench_rows(path: Path) -> dict[str, dict[str, float | None]]:
    """Per shape from a ``qkan-pack bench --json`` file: predictor, bare replay, ratio, and
    the bare graph's GPU time."""
    report = json.loads(path.read_text())
    rows = {}
    for shape in report["shapes"]:
        variants = shape["variants"]
        predictor, bare = variants.get("predictor", {}), variants.get("bare_graph", {})
        rows[shape["label"]] = {"bench_predictor_us": predictor.get("median_us"),
                                "bench_bare_us": bare.get("median_us"),
                                "bench_over_bare": predictor.get("overhead_vs_bare"),
                                "bench_spread_pct": predictor.get("spread_pct"),
                                "bare_graph_gpu_us": shape.get("kernel_us")}
    return rows


def cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    results = Path(sys.argv[1])
    device = torch.device("cuda")
    record = {"gpu": torch.cuda.get_device_name(device), "cpu": cpu_model() or platform.machine(),
              "torch": torch.__version__, "target": TARGET,
              "method": f"{ROUNDS} blocks x {BLOCK} calls per variant, interleaved; medians",
              "models": {}}
    print(f"{record['gpu']}; {record['cpu']}; torch {record['torch']}")
    header = ("| model | shape | bench: predictor µs | bare µs | predictor / bare | ≤ 1.05 | "
              "own graph: predictor µs | own replay µs | predictor / own replay | "
              "GPU µs own graph | GPU µs bare graph |")
    lines = [header, "|---|---|" + "---:|" * 9]
    for spec in sys.argv[2:]:
        name, artifact = spec.split("=", 1)
        bench_file = results / f"bench-{name}.json"
        rows = bench_rows(bench_file) if bench_file.exists() else {}
        with Predictor.load(artifact, device="cuda", progress=False) as predictor:
            for label, own in own_graph(predictor).items():
                rows.setdefault(label, {}).update(own)
        record["models"][name] = rows
        for label, row in rows.items():
            ratio = row.get("bench_over_bare")
            verdict = "-" if ratio is None else ("yes" if ratio <= TARGET else "NO")
            lines.append(
                f"| {name} | {label} | {cell(row.get('bench_predictor_us'))} | "
                f"{cell(row.get('bench_bare_us'))} | {cell(ratio, 3)} | {verdict} | "
                f"{cell(row.get('predictor_us'))} | {cell(row.get('own_replay_us'))} | "
                f"{cell(row.get('over_own_replay'), 3)} | {cell(row.get('own_graph_gpu_us'))} | "
                f"{cell(row.get('bare_graph_gpu_us'))} |")
    print("\n".join(lines))
    (results / "call-overhead.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
