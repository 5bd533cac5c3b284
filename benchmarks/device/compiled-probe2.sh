#!/bin/bash
# Issue 37, second probe (carry .whl only): inductor's standalone_compile (dynamo's graph
# compiled once, loaded in fresh processes without tracing), plain and aot-bundled, for
# QKAN [64,64,64] 1x64 and the HQKAN GPT 1x128; run 0 of each load without Triton's cache,
# runs 1-3 with the compile's Triton cache (what warm ships), run 3 profiled.
# Files: $OUT/r/routes2.txt, routes2/compiled_routes.json, routes2/*.prof.txt
source benchmarks/device/setup.sh
python3 - <<'PY' 2>&1 | tee "$RESULTS/torch-api.txt"
import torch, torch._dynamo.eval_frame as e
print("torch", torch.__version__)
print("OptimizedModule.aot_compile", hasattr(e.OptimizedModule, "aot_compile"), "_aot_compile", hasattr(e.OptimizedModule, "_aot_compile"))
try:
    import torch._dynamo.aot_compile as a; print("torch._dynamo.aot_compile", [n for n in dir(a) if not n.startswith("_")][:20])
except ImportError as exc:
    print("no torch._dynamo.aot_compile", exc)
print("load_compiled_function", hasattr(torch.compiler, "load_compiled_function"))
import inspect, torch._inductor as i
print("standalone_compile", inspect.signature(i.standalone_compile))
PY
ROUTES=standalone,standalone_aot timeout 420 python3 benchmarks/device/compiled_routes.py "$RESULTS/routes2" 2>&1 \
    | grep -v Warning | tee "$RESULTS/routes2.txt"
echo "== elapsed $SECONDS s"
rm -rf "$RESULTS"/routes2/*.bin "$RESULTS"/routes2/*-triton
