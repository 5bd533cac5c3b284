"""One fresh process of ``qkan-pack bench --cold`` (driven by ``_cold``).

``_cold`` runs this file's text as ``python -X importtime -c <text> ARGS_JSON`` in a new
interpreter with empty kernel caches. Only the standard library is imported before the
first timed stage, so the stages are: interpreter start, ``import torch``, ``import
qkan_pack.runtime``, then the load's own stages (``predictor.report.stages``: verification,
CUDA init, model source import -- qkan and its dependencies are imported there, by the
model source, as in production --, build, weights, first forward, compile, capture,
self-test), then the first call: process start -> first result is the headline. Calls
continue until their latency settles (is the first call as fast as steady state?).

Modes: ``predictor`` (``Predictor.load``, ``compiled`` from the arguments) and
``torch_compile`` (the eager model under ``torch.compile(mode="reduce-overhead")``, for
comparison). With ``profile`` the load and first call run under cProfile and the top
entries are reported (cProfile slows Python code: a profiled run is never timed).
Results go to ``ARGS.out`` as JSON; the import breakdown is parsed by ``_cold`` from stderr.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from typing import Any

FAST = 1.5  # a call is "fast" within this factor of the steady-state median
PROFILE_LINES = 30


def main() -> None:
    started_wall = time.time()
    args = json.loads(sys.argv[1])
    record: dict[str, Any] = {"stages": [["python start", started_wall - args["launched"]]],
                              "notes": []}
    try:
        if args["mode"] == "torch_compile":
            _torch_compile(args, record)
        else:
            _predictor(args, record)
    except BaseException as exc:
        text = str(exc).strip()
        record["error"] = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        _write(args, record)
        raise
    _write(args, record)


def _write(args: dict[str, Any], record: dict[str, Any]) -> None:
    with open(args["out"], "w", encoding="utf-8") as handle:
        json.dump(record, handle)


def _timed(record: dict[str, Any], name: str, fn: Any) -> Any:
    started = time.perf_counter()
    value = fn()
    record["stages"].append([name, time.perf_counter() - started])
    return value


def _imports(record: dict[str, Any]) -> Any:
    torch = _timed(record, "import torch", lambda: importlib.import_module("torch"))
    _timed(record, "import qkan_pack", lambda: importlib.import_module("qkan_pack.runtime"))
    return torch


def _inputs(torch: Any, manifest: Any) -> list[Any]:
    """Host tensors for the first manifest shape: random floats, zero integers (valid ids)."""
    from qkan_pack.runtime import torch_dtype

    generator = torch.Generator().manual_seed(0)
    tensors = []
    for name, shape in manifest.shapes[0].inputs:
        dtype = torch_dtype(manifest.input_dtype(name))
        if dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            tensors.append(torch.zeros(shape, dtype=dtype))
    return tensors


def _serve(record: dict[str, Any], args: dict[str, Any], torch: Any, call: Any) -> None:
    """Timed calls (host in, host out, synchronized): first result, settling, steady median."""
    device = torch.device(args["device"])
    latencies, walls = [], []
    for _ in range(max(2, args["calls"])):
        started = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        latencies.append(time.perf_counter() - started)
        walls.append(time.time() - args["launched"])
    steady = statistics.median(latencies[-max(1, len(latencies) // 3):])
    fast = next(i for i, t in enumerate(latencies) if t <= FAST * steady or i == len(latencies) - 1)
    record["stages"].append(["first call", latencies[0]])
    record["total_s"] = walls[0]
    record["fast_total_s"] = walls[fast]
    record["calls_to_fast"] = fast + 1
    record["first_call_us"] = latencies[0] * 1e6
    record["steady_us"] = steady * 1e6


def _profiled(args: dict[str, Any], record: dict[str, Any], fn: Any) -> Any:
    """``fn()``, under cProfile when asked (top entries by cumulative and own time)."""
    if not args.get("profile"):
        return fn()
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    value = profiler.runcall(fn)
    stats = pstats.Stats(profiler)
    record["profile"] = {order: _top(stats, order) for order in ("cumulative", "tottime")}
    return value


def _top(stats: Any, order: str) -> list[dict[str, Any]]:
    key = {"cumulative": 3, "tottime": 2}[order]
    rows = sorted(stats.stats.items(), key=lambda item: item[1][key], reverse=True)
    return [{"calls": calls, "tottime_s": own, "cumtime_s": cumulative,
             "function": f"{file}:{line}({name})"}
            for (file, line, name), (_, calls, own, cumulative, _) in rows[:PROFILE_LINES]]


def _predictor(args: dict[str, Any], record: dict[str, Any]) -> None:
    torch = _imports(record)
    from qkan_pack.runtime import Predictor

    def load_and_first_call() -> Any:
        started = time.perf_counter()
        predictor = Predictor.load(args["path"], device=args["device"], progress=False,
                                   config_overrides=args["overrides"],
                                   compiled=args.get("compiled", "off"))
        load_s = time.perf_counter() - started
        for name, seconds in predictor.report.stages.items():
            record["stages"].append([name, seconds])
        record["stages"].append(["load, other", max(0.0, load_s - sum(
            predictor.report.stages.values()))])
        inputs = _inputs(torch, predictor.manifest)
        _serve(record, args, torch, lambda: predictor(*inputs))
        return predictor

    predictor = _profiled(args, record, load_and_first_call)
    if torch.device(args["device"]).type == "cuda" and not args.get("profile"):
        record["steady"] = _steady_state(torch, predictor, args["calls"])
    report = predictor.report
    record["load"] = {"kernel_cache": report.kernel_cache, "compiled": report.compiled,
                      "capture_policy": report.capture_policy, "solvers": list(report.solvers),
                      "policies": [r.policy for r in report.shapes],
                      "warnings": list(report.warnings),
                      "load_to_ready_s": report.load_to_ready_seconds}
    record["modules"] = _module_states()
    record["bytecode"] = bytecode_use(args["launched"])
    predictor.close()


def _steady_state(torch: Any, predictor: Any, calls: int) -> dict[str, Any]:
    """After the first result, at the first shape, inputs on the device: the predictor's call
    latency, the bare replay of its own graph (``copy_`` in, replay, ``clone`` out) and the
    graph's GPU time per call (CUDA events behind a sleep kernel, as ``bench``'s floor)."""
    from qkan_pack.bench._timing import kernel_time_per_call

    device = predictor.device
    inputs = [x.to(device) for x in _inputs(torch, predictor.manifest)]
    graph = predictor.whole_graph(0)
    steady: dict[str, Any] = {"shape": predictor.manifest.shapes[0].label,
                              "predictor_us": _median_us(torch, device, calls * 10,
                                                         lambda: predictor(*inputs))}
    if graph is None:
        steady["note"] = "the first shape is not captured whole: no bare replay or GPU time"
        return steady
    steady["bare_replay_us"] = _median_us(torch, device, calls * 10,
                                          lambda: graph.replay_copy(inputs))
    steady["gpu_us"], steady["gpu_method"] = kernel_time_per_call(graph.graph, device, 200)
    steady["predictor_over_bare"] = steady["predictor_us"] / steady["bare_replay_us"]
    return steady


def _median_us(torch: Any, device: Any, count: int, call: Any) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def _module_states() -> dict[str, str]:
    """Whether the heavy modules a served model does not need ran in this process."""
    from qkan_pack.runtime import module_state

    return {name: module_state(name)
            for name in ("qkan", "sympy", "matplotlib", "matplotlib.pyplot", "triton")}


def _torch_compile(args: dict[str, Any], record: dict[str, Any]) -> None:
    torch = _imports(record)
    from qkan_pack.runtime import flatten, read_artifact, rebuild_model

    device = torch.device(args["device"])
    artifact = _timed(record, "verify", lambda: read_artifact(args["path"]))
    if device.type == "cuda":
        _timed(record, "cuda init", lambda: (torch.cuda.init(), torch.empty(0, device=device)))
        torch.cuda.set_device(device)  # Triton launches on the current device
    stages: dict[str, float] = {}
    config = {**artifact.manifest.model.config, **args["overrides"]}
    model = rebuild_model(artifact, device, config, stages)
    record["stages"] += [[name, seconds] for name, seconds in stages.items()]
    compiled = _timed(record, "compile", lambda: torch.compile(
        model, mode="reduce-overhead", dynamic=False))
    inputs = _inputs(torch, artifact.manifest)

    def call() -> list[Any]:
        with torch.no_grad():
            out = compiled(*[x.to(device) for x in inputs])
        return [leaf.to("cpu") for leaf in flatten(out)]

    _profiled(args, record, lambda: _serve(record, args, torch, call))
    record["bytecode"] = bytecode_use(args["launched"])


def bytecode_use(launched: float) -> dict[str, Any]:
    """How many of this process's Python modules had no bytecode cache to read: their .pyc
    (where ``importlib`` looks, ``PYTHONPYCACHEPREFIX`` included) is missing, or was written
    after launch -- either way this process compiled the source, a cost that a host
    installed with bytecode (pip's default) does not pay. Per top-level package."""
    import importlib.util
    import os
    from collections import Counter

    compiled: Counter[str] = Counter()
    total = 0
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not (spec is not None and spec.has_location and isinstance(origin, str)
                and origin.endswith(".py")):
            continue
        total += 1
        try:
            fresh = os.stat(importlib.util.cache_from_source(origin)).st_mtime >= launched
        except (OSError, ValueError, NotImplementedError):
            fresh = True
        if fresh:
            compiled[name.partition(".")[0]] += 1
    return {"modules": total, "compiled_here": sum(compiled.values()),
            "by_package": dict(compiled.most_common(8)), "prefix": sys.pycache_prefix}


if __name__ == "__main__":
    main()
