"""Eager flash-solver QKAN forwards for compute-sanitizer's memcheck (out-of-bounds reads).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        python3 benchmarks/memcheck_flash.py

Without the caching allocator every tensor is its own cudaMalloc, so a kernel that reads past
the end of a tensor is caught even where the bytes after it happen to be mapped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from qkan_mlp import build_model

CASES = (([2, 8, 2], 2, (1, 64)), ([64, 64, 64], 3, (1, 256)))


def main() -> None:
    with torch.no_grad():
        for width, reps, batches in CASES:
            model = build_model(width=width, reps=reps, device="cuda").eval()
            for batch in batches:
                x = torch.randn(batch, width[0], device="cuda")
                out = model(x)
                torch.cuda.synchronize()
                print(f"QKAN({width}, reps={reps}) batch {batch}: {tuple(out.shape)} ok", flush=True)


if __name__ == "__main__":
    main()
