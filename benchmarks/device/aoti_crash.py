"""Issue 44 item 3, diagnosis: does an AOTInductor package load on this host's torch?

On the H100 (torch 2.11+cu130) loading a package that qkan-pack's prototype made segfaulted
(`benchmarks/results/2026-12-07_h100_aoti-compiled-mode/`). This takes qkan-pack out of it:
plain torch, a tiny model, each step in a process of its own so that a crash is one line of
the report, not the end of the run.

    python3 aoti_crash.py make DIR [--no-precompile-headers]   # DIR/model.pt2
    python3 aoti_crash.py load DIR official|single|threaded     # a fresh process
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

#: Where the model runs: the device's GPU (``AOTI_DEVICE=cpu`` tries the script on a CPU).
DEVICE = os.environ.get("AOTI_DEVICE", "cuda")


def tiny_model() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8)).to(DEVICE).eval()


def make(directory: Path, precompile_headers: bool) -> None:
    import torch

    torch.manual_seed(0)
    model = tiny_model()
    example = (torch.randn(4, 64, device=DEVICE),)
    started = time.perf_counter()
    exported = torch.export.export(model, example, strict=False)
    configs = {} if precompile_headers else {"aot_inductor.precompile_headers": False}
    path = torch._inductor.aoti_compile_and_package(
        exported, package_path=str(directory / "model.pt2"), inductor_configs=configs)
    torch.save({"x": example[0].cpu(), "want": model(*example).detach().cpu()},
               directory / "io.pt")
    print(f"made {path} in {time.perf_counter() - started:.1f} s "
          f"({Path(path).stat().st_size} bytes; precompile_headers={precompile_headers})")


def load(directory: Path, how: str) -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.init()
    io = torch.load(directory / "io.pt")
    x = io["x"].to(DEVICE)
    path = str(directory / "model.pt2")
    started = time.perf_counter()
    print(f"loading ({how}) ...", flush=True)
    if how == "official":
        run = torch._inductor.aoti_load_package(path)
        got = run(x)
    else:
        single = how == "single"
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", single, 1,
                                                       0 if single and DEVICE == "cuda" else -1)
        print(f"constructed in {time.perf_counter() - started:.3f} s", flush=True)
        got = loader.boxed_run([x.clone()])[0]
    error = (got.cpu() - io["want"]).abs().max().item()
    print(f"loaded and ran ({how}) in {time.perf_counter() - started:.3f} s; max error {error:.2e}")
    if how == "single" and DEVICE == "cuda":  # what the runtime does: replay in a CUDA graph
        static = x.clone()
        loader.boxed_run([static])  # warm-up outside capture (constants, cubins)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = loader.boxed_run([static])[0]
        graph.replay()
        torch.cuda.synchronize()
        print(f"captured and replayed: max error {(out.cpu() - io['want']).abs().max().item():.2e}")


if __name__ == "__main__":
    step, where = sys.argv[1], Path(sys.argv[2])
    where.mkdir(parents=True, exist_ok=True)
    if step == "make":
        make(where, "--no-precompile-headers" not in sys.argv)
    else:
        load(where, sys.argv[3])
