"""Issue 37 item 4 probe: GPU time of one QKAN layer per solver and compiler, side by side.

One QKAN layer [W, W] (reps 2) at batch B: the flash solver (qkan's Triton kernels) eager,
the exact solver eager, and each under torch.compile (inductor, no CUDA graphs of its own),
each captured in a CUDA graph and replayed (median of 5 x 200 replays, CUDA events); with
the kernels launched per call (torch.profiler) and the largest difference from the exact
solver.

    python3 benchmarks/device/qkan_layer_fusion.py > OUT.txt
"""
import json
import sys

import torch
from qkan import QKAN

sys.path.insert(0, "benchmarks/device")
from compiled_routes import gpu_us


def kernels(fn, x):
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(x)
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


rows = []
for width, batch in ((64, 1), (64, 64), (256, 256)):
    x = torch.randn(batch, width, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    layers = {s: QKAN([width, width], reps=2, solver=s, device="cuda", seed=0).eval()
              for s in ("exact", "flash")}
    with torch.no_grad():
        exact = layers["exact"](x)
    for solver, layer in layers.items():
        for mode in ("eager", "inductor"):
            fn = layer if mode == "eager" else torch.compile(layer, dynamic=False)
            try:
                with torch.no_grad():
                    diff = float((fn(x) - exact).abs().max())
                row = {"width": width, "batch": batch, "solver": solver, "mode": mode,
                       "gpu_us": gpu_us(fn, x), "kernels": kernels(fn, x), "max_abs_vs_exact": diff}
            except Exception as exc:
                row = {"width": width, "batch": batch, "solver": solver, "mode": mode,
                       "error": repr(exc)[:300]}
            print(json.dumps(row), flush=True)
            rows.append(row)
torch._dynamo.reset()
