"""Where does a cold ``Predictor.load`` spend its time? cProfile of a fresh process.

    PYTHONPATH=. python benchmarks/profile_cold_load.py ARTIFACT [--kernels auto|off]

Run it with an empty TRITON_CACHE_DIR to see a new host's first load.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args()
    started = time.perf_counter()
    import qkan  # noqa: F401  (imported by the model source; timed here, not in the load)
    import torch

    import qkan_pack

    print(f"imports {time.perf_counter() - started:.3f}s")
    profiler = cProfile.Profile()
    profiler.enable()
    predictor = qkan_pack.Predictor.load(args.artifact, device="cuda", kernels=args.kernels)
    profiler.disable()
    torch.cuda.synchronize()
    print(predictor.report)
    buffer = io.StringIO()
    stats = pstats.Stats(profiler, stream=buffer).sort_stats("cumulative")
    stats.print_stats(args.top)
    print(buffer.getvalue())


if __name__ == "__main__":
    main()
