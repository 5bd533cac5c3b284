"""Quick side-by-side probe on a GPU: eager vs Predictor vs bare CUDA-graph replay.

    PYTHONPATH=. python benchmarks/probe_runtime.py

Prints median host-call-to-result-ready latency (synchronize after each call) for a few
reference models, interleaved round-robin, plus Triton cache facts used to design `warm`.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from qkan_pack import Predictor, build
from qkan_pack.artifact import read_artifact
from qkan_pack.loading import rebuild_model

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("qkan[2,8,2] r2", "qkan_mlp.py", "1x2,64x2", {}, "float32"),
    ("qkan[64,64,64] r3", "qkan_mlp.py", "1x64,256x64", {"width": [64, 64, 64], "reps": 3}, "float32"),
    ("hqkan-gpt", "hqkan_gpt.py", "1x128,8x128", {}, "int64"),
]


def bare_graph(model: torch.nn.Module, sample: torch.Tensor):
    static = sample.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = model(static)

    def call(x: torch.Tensor) -> torch.Tensor:
        static.copy_(x)
        graph.replay()
        return out.clone()

    return call


def timed(fn, x, iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    iters = int(os.environ.get("PROBE_ITERS", "300"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, source, shapes, config, dtype in CASES:
            path = Path(tmp) / source.replace(".py", "") / name.replace(" ", "_")
            build(ROOT / "examples" / source, shapes, output=path, config=config, dtype=dtype)
            predictor = Predictor.load(path, device="cuda")
            print(predictor.report, flush=True)
            eager = rebuild_model(read_artifact(path), torch.device("cuda"),
                                  dict(predictor.manifest.model.config))
            for entry in predictor.manifest.shapes:
                shape = entry.inputs[0][1]
                x = (torch.randint(0, 256, shape, device="cuda") if dtype == "int64"
                     else torch.randn(shape, device="cuda"))
                bare = bare_graph(eager, x)

                def eager_call(t, _m=eager):
                    with torch.no_grad():
                        return _m(t)

                variants = {"eager": eager_call, "predictor": predictor, "bare": bare}
                samples = {k: [] for k in variants}
                for fn in variants.values():
                    timed(fn, x, 20)
                for _ in range(5):
                    for key, fn in variants.items():
                        samples[key] += timed(fn, x, iters // 5)
                med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
                print(f"{name:<20}{entry.label:<8} eager {med['eager']:8.1f}us  predictor "
                      f"{med['predictor']:7.1f}us  bare {med['bare']:7.1f}us  "
                      f"pred/bare {med['predictor'] / med['bare']:.3f}  "
                      f"eager/pred {med['eager'] / med['predictor']:.2f}x", flush=True)
            predictor.close()
    try:
        import triton

        cache = triton.knobs.cache.dir if hasattr(triton, "knobs") else None
        print("triton", triton.__version__, "cache dir", cache, file=sys.stderr)
        if cache and os.path.isdir(cache):
            files = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs]
            print("triton cache files", len(files), "bytes", sum(os.path.getsize(f) for f in files))
            kinds = {}
            for f in files:
                ext = os.path.splitext(f)[1]
                kinds[ext] = kinds.get(ext, 0) + 1
            print("by extension", kinds)
    except Exception as exc:  # probe only
        print("triton probe failed", exc)
    print("inductor cache", os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "torch", torch.__version__)


if __name__ == "__main__":
    main()
