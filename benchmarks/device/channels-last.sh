#!/bin/bash
# Issue 44, item 2 (carry .whl only): reduced precision on convolutions, NCHW against
# channels-last. resnet50 (torchvision, on the device) at batch 32, built with --precision
# auto: `qkan-pack bench --precision fp32,bf16,fp16` times each precision's whole-model graph
# in both layouts side by side (fp32 is torch's default, cuDNN TF32 convolutions: the
# baseline), then the ratios against the 1.8x target (bf16 and fp16, each layout, to the
# default fp32 NCHW graph; medians of host call to result, and GPU time per replay); then
# `warm --precision auto` (its choice among precision x layout, with every timing), then the
# channels-last GPU tests (NO_TESTS=1: not). Each step bounded so that all ends by 9 minutes.
# Files: $OUT/r/cl-build.txt, cl-bench.{txt,json}, cl-ratios.{txt,json}, cl-warm.{txt,json},
# cl-tests.txt
source benchmarks/device/setup.sh
left() { echo $(( ${1} - SECONDS )); }
ARTIFACT=/tmp/resnet50-b32
timeout "$(left 300)" python3 -m qkan_pack build tests/models/zoo.py \
    --config family='"torchvision"' --config name='"resnet50"' --shapes 32x3x224x224 \
    --precision auto --max-error 0.05 -o "$ARTIFACT" --force > "$RESULTS/cl-build.txt" 2>&1
echo "== built: exit $? at $SECONDS s"; tail -n 4 "$RESULTS/cl-build.txt"
timeout "$(left 420)" python3 -m qkan_pack bench "$ARTIFACT" --device cuda \
    --precision fp32,bf16,fp16 --iters 100 --repeats 2 --warmup 10 --skip torch_compile \
    --skip qkan_compile_inference --skip predictor_padded --json "$RESULTS/cl-bench.json" \
    > "$RESULTS/cl-bench.txt" 2>&1
echo "== bench: exit $? at $SECONDS s"; cat "$RESULTS/cl-bench.txt"
python3 - "$RESULTS" <<'EOF' 2>&1 | tee "$RESULTS/cl-ratios.txt"
import json, sys
from pathlib import Path
results = Path(sys.argv[1])
TARGET = 1.8
bench = json.loads((results / "cl-bench.json").read_text())
ratios = {"target": TARGET, "baseline": "precision_fp32 (default fp32: cuDNN TF32, NCHW)",
          "device": bench["device"], "machine": bench["machine"], "shapes": {}}
def ratio(a, b):
    return a / b if a and b else None
def shown(value, form):
    return "-" if value is None else format(value, form)
for shape in bench["shapes"]:
    variants = shape["variants"]
    base = variants["precision_fp32"]
    rows = ratios["shapes"][shape["label"]] = {}
    print(f"{shape['label']}: fp32 NCHW {shown(base['median_us'], '.0f')} us "
          f"(GPU {shown(base['kernel_us'], '.0f')} us); target {TARGET}x")
    for name, item in variants.items():
        if not name.startswith("precision_"):
            continue
        if item["status"] != "ok":
            print(f"  {item['label']:<26} {item['status']}: {item['reason']}")
            continue
        latency = ratio(base["median_us"], item["median_us"])
        gpu = ratio(base["kernel_us"], item["kernel_us"])
        rows[name] = {"median_us": item["median_us"], "kernel_us": item["kernel_us"],
                      "vs_fp32": latency, "gpu_vs_fp32": gpu, "error": item["precision_error"]}
        verdict = "" if name == "precision_fp32" or latency is None else (
            "  meets" if latency >= TARGET else "  below")
        print(f"  {item['label']:<26} {shown(item['median_us'], '>8.0f')} us  "
              f"{shown(latency, '.2f')}x (GPU {shown(gpu, '.2f')}x)  "
              f"error {shown(item['precision_error'], '.2g')}{verdict}")
(results / "cl-ratios.json").write_text(json.dumps(ratios, indent=2))
EOF
timeout "$(left 540)" python3 -m qkan_pack warm "$ARTIFACT" --precision auto \
    --json > "$RESULTS/cl-warm.json" 2> "$RESULTS/cl-warm.txt"
echo "== warm: exit $? at $SECONDS s"; cat "$RESULTS/cl-warm.txt"
[ -n "$NO_TESTS" ] && exit 0
timeout "$(left 590)" python3 -m pytest -q -p no:cacheprovider \
    tests/runtime/test_gpu_precision_layout.py \
    "tests/bench/test_bench_precision.py::test_gpu_bench_times_channels_last_graphs_beside_contiguous_ones" \
    2>&1 | tail -n 30 > "$RESULTS/cl-tests.txt"
echo "== tests exit ${PIPESTATUS[0]} at $SECONDS s"; cat "$RESULTS/cl-tests.txt"
