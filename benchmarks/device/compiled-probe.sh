#!/bin/bash
# Issue 37 probes on one GPU host (carry .whl only): compiled routes that load without tracing
# (compiled_routes.py), one QKAN layer per solver/compiler (qkan_layer_fusion.py), and where the
# default cold start's time goes (bench --cold --profile, QKAN [64,64,64] x 8 shapes, shipped
# kernels). Files: $OUT/r/routes/*, qkan-layer.txt, cold-q64*.{txt,json}
source benchmarks/device/setup.sh
python3 -c "import torch, torch.compiler as c; print('load_compiled_function', hasattr(c, 'load_compiled_function'))"
timeout 90 python3 benchmarks/device/qkan_layer_fusion.py 2>&1 | tee "$RESULTS/qkan-layer.txt"
echo "== elapsed $SECONDS s"
timeout 330 python3 benchmarks/device/compiled_routes.py "$RESULTS/routes" 2>&1 | grep -v Warning | tee "$RESULTS/routes.txt"
echo "== elapsed $SECONDS s"
rm -f "$RESULTS"/routes/*.bin "$RESULTS"/routes/*.pt2
Q=/tmp/q64
timeout 150 bash -c "python3 -m qkan_pack build examples/qkan_mlp.py --config width='[64,64,64]' \
    --shapes 1x64,2x64,4x64,8x64,16x64,32x64,64x64,128x64 -o $Q > $RESULTS/q64-build.txt 2>&1 \
  && python3 -m qkan_pack warm $Q >> $RESULTS/q64-build.txt 2>&1 \
  && python3 -m qkan_pack bench $Q --device cuda --cold --runs 5 --profile --json $RESULTS/cold-q64.json" \
  > "$RESULTS/cold-q64.txt" 2>&1
echo "== elapsed $SECONDS s"
tail -n 80 "$RESULTS/cold-q64.txt"
