"""The cold-start process of ``qkan-pack bench --cold-start`` (see ``_cold``).

``_cold`` runs this file's text as ``python -c <text> ARGS_JSON`` in a fresh interpreter.
Only the standard library is imported up front, so the first timed stages are the imports
themselves. Mode ``predictor``: ``Predictor.load`` then serve calls. Mode ``torch_compile``:
rebuild the eager model, ``torch.compile(mode="reduce-overhead")``, serve calls until the
latency settles. Both write ``{"stages": [[name, seconds], ...], ...}`` to ``ARGS.out``.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from typing import Any

STAGE_NAMES = {
    "verify": "artifact verification",
    "cuda init": "CUDA init",
    "import": "model source import",
    "build": "model build",
    "weights": "weights",
    "references": "reference inputs",
    "first forward": "first forward (kernel compile)",
    "capture": "graph capture",
    "self-test": "self-test",
}
FAST = 1.5  # a call is "fast" within this factor of the steady-state median


def main() -> None:
    started_wall = time.time()
    args = json.loads(sys.argv[1])
    record: dict[str, Any] = {"stages": [["python start", started_wall - args["launched"]]],
                              "notes": []}
    try:
        if args["mode"] == "predictor":
            _predictor(args, record)
        else:
            _torch_compile(args, record)
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
    try:
        _timed(record, "import qkan", lambda: importlib.import_module("qkan"))
    except ImportError as exc:
        record["notes"].append(f"qkan is not importable here ({exc})")
    _timed(record, "import qkan_pack", lambda: importlib.import_module("qkan_pack.runtime"))
    return torch


def _inputs(torch: Any, manifest: Any) -> list[Any]:
    """Host tensors for the first manifest shape: random floats, zero integers (valid ids)."""
    from qkan_pack.runtime import torch_dtype

    generator = torch.Generator().manual_seed(0)
    entry = manifest.shapes[0]
    tensors = []
    for name, shape in entry.inputs:
        dtype = torch_dtype(manifest.input_dtype(name))
        if dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            tensors.append(torch.zeros(shape, dtype=dtype))
    return tensors


def _serve(record: dict[str, Any], args: dict[str, Any], torch: Any, call: Any,
           first_stage: str) -> None:
    """Timed calls (host in, host out, synchronized); first call, settling, steady median."""
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
    record["stages"].append([first_stage, latencies[0]])
    if fast > 0:
        record["stages"].append([f"calls 2..{fast + 1} until fast", sum(latencies[1:fast + 1])])
    record["total_s"] = walls[0]
    record["fast_total_s"] = walls[fast]
    record["calls_to_fast"] = fast + 1
    record["steady_us"] = steady * 1e6
    record["latencies_us"] = [t * 1e6 for t in latencies]


def _predictor(args: dict[str, Any], record: dict[str, Any]) -> None:
    torch = _imports(record)
    from qkan_pack.runtime import Predictor

    started = time.perf_counter()
    predictor = Predictor.load(args["path"], device=args["device"],
                               config_overrides=args["overrides"], progress=False)
    load_s = time.perf_counter() - started
    report = predictor.report
    for name, seconds in report.stages.items():
        record["stages"].append([STAGE_NAMES.get(name, name), seconds])
    record["stages"].append(["load, other", max(0.0, load_s - sum(report.stages.values()))])
    inputs = _inputs(torch, predictor.manifest)
    _serve(record, args, torch, lambda: predictor(*inputs), "first call")
    record["load"] = {"capture_policy": report.capture_policy, "kernel_cache": report.kernel_cache,
                      "solvers": list(report.solvers), "load_to_ready_s": report.load_to_ready_seconds,
                      "policies": [r.policy for r in report.shapes]}
    predictor.close()


def _torch_compile(args: dict[str, Any], record: dict[str, Any]) -> None:
    torch = _imports(record)
    from qkan_pack.runtime import flatten, read_artifact, rebuild_model

    device = torch.device(args["device"])
    artifact = _timed(record, STAGE_NAMES["verify"], lambda: read_artifact(args["path"]))
    if device.type == "cuda":
        _timed(record, STAGE_NAMES["cuda init"],
               lambda: (torch.cuda.init(), torch.empty(0, device=device)))
        torch.cuda.set_device(device)  # Triton launches on the current device
    stages: dict[str, float] = {}
    config = {**artifact.manifest.model.config, **args["overrides"]}
    model = rebuild_model(artifact, device, config, stages)
    for name, seconds in stages.items():
        record["stages"].append([STAGE_NAMES.get(name, name), seconds])
    compiled = _timed(record, "torch.compile()", lambda: torch.compile(
        model, mode="reduce-overhead", dynamic=False))
    inputs = _inputs(torch, artifact.manifest)

    def call() -> list[Any]:
        with torch.no_grad():
            out = compiled(*[x.to(device) for x in inputs])
        return [leaf.to("cpu") for leaf in flatten(out)]

    _serve(record, args, torch, call, "first call (compile + warm-up run)")


if __name__ == "__main__":
    main()
