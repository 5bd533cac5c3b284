"""A predictor call's host work around the replay, measured on a CPU.

A CPU has no CUDA graphs, so each predictor here is served by a ``GraphRunner`` whose graphs
are stand-ins: CPU static buffers and a replay that does nothing. A predictor's call and a
bare replay of the same buffers (``copy_`` in, replay, ``clone`` out: bench's bare graph) then
do the same tensor work, and the difference between them is the Python around it: what a
call adds to a bare replay on a GPU host before the replay is launched, on this CPU.

Each package named (default ``qkan_pack``) is timed in the same process, interleaved: blocks
of calls, the variants in rotating order, the median of the blocks' per-call times. To set
one commit against another, export the older one under another name first:

    git archive OLD qkan_pack | tar -x -C /tmp/old && mv /tmp/old/qkan_pack /tmp/old/qkan_pack_old
    qkan-pack build examples/qkan_mlp.py --shapes 1x2,64x2 -o /tmp/mlp
    PYTHONPATH=/tmp/old:. python benchmarks/call_overhead_cpu.py /tmp/mlp qkan_pack_old qkan_pack
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch


class NoReplay:
    """A captured graph's stand-in: replaying it does nothing."""

    def replay(self) -> None:
        pass


def stand_in_predictor(package: str, artifact: str, **options: Any) -> tuple[Any, list[Any]]:
    """A CPU predictor of ``package`` served by a GraphRunner over ``NoReplay`` graphs."""
    runtime = importlib.import_module(f"{package}.runtime")
    runners = importlib.import_module(f"{package}.runtime._runners")
    capture = importlib.import_module(f"{package}.runtime._capture")
    if hasattr(runners, "stream_id"):  # releases that queried the stream through it
        runners.stream_id = lambda index: 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pad_batch
        predictor = runtime.Predictor.load(artifact, device="cpu", progress=False, **options)
    runner = runners.GraphRunner(predictor._model, predictor._model, torch.device("cpu"))
    runner._current_stream = lambda: 0  # CPU torch has no CUDA streams: one stand-in stream
    runner._last_stream_id = 0
    graphs = []
    for index, entry in enumerate(predictor.manifest.shapes):
        inputs = [torch.randn(shape) for _, shape in entry.inputs]
        with torch.no_grad():
            outputs = [predictor._model(*inputs).clone()]
        graphs.append(capture.ShapeGraph(NoReplay(), inputs, outputs))
        runner._full[index] = graphs[-1]
    predictor._runner = runner
    return predictor, graphs


def variants(artifact: str, packages: list[str]) -> dict[str, Callable[[], Any]]:
    x, rows5 = torch.randn(1, 2), torch.randn(5, 2)
    array = x.numpy().copy()
    calls: dict[str, Callable[[], Any]] = {}
    graphs: list[Any] = []
    for package in packages:
        copied, graphs = stand_in_predictor(package, artifact)
        aliased, _ = stand_in_predictor(package, artifact, copy_outputs=False)
        padded, _ = stand_in_predictor(package, artifact, pad_batch=True)
        calls[f"{package}: predictor(x)"] = lambda p=copied: p(x)
        calls[f"{package}: predictor(x), copy_outputs=False"] = lambda p=aliased: p(x)
        calls[f"{package}: predictor(x=x)"] = lambda p=copied: p(x=x)
        calls[f"{package}: predictor(numpy array)"] = lambda p=copied: p(array)
        calls[f"{package}: predictor(5x2), padded to 64x2"] = lambda p=padded: p(rows5)
    graph = graphs[0]
    static, result = graph.static_inputs[0], graph.static_outputs[0]

    def bare_without_copy_out() -> torch.Tensor:
        static.copy_(x)
        graph.graph.replay()
        return result

    calls["bare: copy_ in, replay, clone out"] = lambda: graph.replay_copy([x])
    calls["bare: copy_ in, replay (no copy out)"] = bare_without_copy_out
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", help="examples/qkan_mlp.py built at 1x2,64x2")
    parser.add_argument("packages", nargs="*", default=["qkan_pack"])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=1000)
    args = parser.parse_args()
    calls = variants(args.artifact, args.packages)
    names = list(calls)
    for name in names:  # a signature's first call takes the general path: not timed
        for _ in range(100):
            calls[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            call = calls[name]
            started = time.perf_counter_ns()
            for _ in range(args.block):
                call()
            samples[name].append((time.perf_counter_ns() - started) / args.block)
    print(f"{args.rounds} blocks x {args.block} calls per variant, interleaved; ns per call: "
          "median [quartiles] and fastest of the blocks (on a shared host the fastest blocks "
          "are the ones nothing else interrupted)")
    for name in names:
        low, _, high = statistics.quantiles(samples[name], n=4)
        print(f"{statistics.median(samples[name]):8.0f} [{low:6.0f}-{high:6.0f}] "
              f"{min(samples[name]):8.0f}  {name}")


if __name__ == "__main__":
    main()
