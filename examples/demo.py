"""`make demo`: build examples/qkan_mlp.py into artifacts/, load it, predict, print a table."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from qkan_pack import Predictor, build

ROOT = Path(__file__).resolve().parent.parent
SHAPES = "1x2,64x2"


def main() -> None:
    target = ROOT / "artifacts" / "qkan_mlp"
    result = build(ROOT / "examples" / "qkan_mlp.py", SHAPES, output=target, force=True)
    print(f"built {result.path}  digest {result.digest}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with Predictor.load(target, device=device, expected_digest=result.digest) as predictor:
        print(f"loaded on {predictor.device} in {predictor.report.load_to_ready_seconds:.2f}s "
              f"(policy: {predictor.report.capture_policy})")
        print(f"\n{'input':<8}{'output':<10}{'first row of output':<32}{'median latency':>16}")
        for entry in predictor.manifest.shapes:
            shape = entry.inputs[0][1]
            x = torch.randn(shape)
            y = predictor(x)
            latency = _median_latency(predictor, x)
            row = ", ".join(f"{v:+.4f}" for v in y[0].tolist())
            print(f"{entry.label:<8}{'x'.join(map(str, y.shape)):<10}{row:<32}"
                  f"{latency * 1e6:>13.1f} us")
    if device == "cpu":
        print("\nThis host has no CUDA: the predictor ran eagerly. CUDA graphs need a GPU; on a "
              "GPU host Predictor.load(path, device='cuda') captures one graph per shape "
              "before returning, and every call is a copy-in, one graph replay, and a copy-out.")


def _median_latency(predictor: Predictor, x: torch.Tensor, repeats: int = 50) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        predictor(x)
        if predictor.device.type == "cuda":
            torch.cuda.synchronize(predictor.device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    main()
