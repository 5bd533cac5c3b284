"""Where `warm --compiled`'s time goes on a GPU host (issue 44 item 3): each shape's graph of
QKAN [64,64,64] traced and made into an AOTInductor package by qkan-pack's own route, with the
time of each step (trace, export + compile + package, the library check, the throw-away
probe, the load here), torch's own per-phase compile times, and the compiler commands' wall
time (cProfile, the 40 calls of most cumulative time). Variants, one per process:

  route  the route as it ships (the compiler script at one lasting path: torch's precompiled
         headers, keyed by the compiler's path, made by the first package, reused after)
  nopch  a temporary compiler script per package, without precompiled headers (the route
         before the lasting path)
  o0     the route with the wrapper compiled at -O0 (aot_inductor.compile_wrapper_opt_level)

  python3 benchmarks/device/aoti_compile_time.py ARTIFACT route|nopch|o0 [N_SHAPES]
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

import torch

from qkan_pack.runtime import _aoti, _precompiled, read_artifact, rebuild_model


def timed(name, fn, log):
    def run(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            log.append((name, time.perf_counter() - t))
    return run


def main() -> None:
    path, variant = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    device = os.environ.get("DEVICE", "cuda")
    artifact = read_artifact(path)
    model = rebuild_model(artifact, torch.device(device), artifact.manifest.model.config)
    log: list[tuple[str, float]] = []
    if variant == "nopch":
        _aoti._lasting_link_dir = lambda compiler, library: None
    if variant == "o0":
        from torch._inductor import config
        config.aot_inductor.compile_wrapper_opt_level = "O0"
    _aoti.check_package = timed("check", _aoti.check_package, log)
    _aoti.probe_package = timed("probe (child load + run)", _aoti.probe_package, log)
    _aoti._open = timed("load here", _aoti._open, log)
    import torch._inductor as inductor
    inductor.aoti_compile_and_package = timed(
        "aoti_compile_and_package", inductor.aoti_compile_and_package, log)
    for shape in artifact.manifest.shapes[:count]:
        (_, dims), = shape.inputs
        x = torch.randn(dims, device=device)
        log.clear()
        t = time.perf_counter()
        gm, example, _ = _precompiled.trace_graph(model, model.forward, [x])
        traced = time.perf_counter() - t
        profile = cProfile.Profile()
        t = time.perf_counter()
        profile.enable()
        _aoti.compile_aoti(gm, example, device)
        profile.disable()
        total = time.perf_counter() - t
        steps = ", ".join(f"{name} {s:.1f} s" for name, s in log)
        print(f"[{variant}] shape {shape.label}: trace {traced:.1f} s, "
              f"compile_aoti {total:.1f} s ({steps})", flush=True)
        stats = io.StringIO()
        pstats.Stats(profile, stream=stats).sort_stats("cumulative").print_stats(40)
        lines = [line for line in stats.getvalue().splitlines() if "(" in line]
        print("\n".join("    " + line[:200] for line in lines), flush=True)
    from torch._dynamo.utils import compile_times
    print(f"[{variant}] torch's compile times (all shapes):")
    print(compile_times(repr="str", aggregate=True))


if __name__ == "__main__":
    main()
