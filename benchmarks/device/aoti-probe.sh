#!/bin/bash
# Issue 44 item 3 probe (carry .whl): AOTInductor packages of QKAN [64,64,64] 1x64 and the
# HQKAN GPT 1x128 made from the precompiled route's traced graph, loaded in fresh processes by
# torch's C++ loader alone, checked against eager, captured in a CUDA graph; beside the current
# form's (standalone_compile) fresh-process load. MODELS="q64" or "gpt" (default both).
# Files: $OUT/r/aoti-probe.txt
source benchmarks/device/setup.sh
P=/tmp/aoti; mkdir -p $P
{
python3 -c "import torch, inspect; print(torch.__version__); print(torch._C._aoti.AOTIModelPackageLoader.__init__.__doc__)"
which g++ gcc; g++ --version | head -1
for m in ${MODELS:-q64 gpt}; do
    TORCHINDUCTOR_CACHE_DIR=$P/ind-$m timeout 240 python3 benchmarks/device/aoti_probe.py make $m $P 2>&1 | tail -n 4
    for i in 1 2 3; do
        TORCHINDUCTOR_CACHE_DIR=$P/fresh-$m-$i python3 benchmarks/device/aoti_probe.py load $m $P 2>&1 | tail -n 3
        TORCHINDUCTOR_CACHE_DIR=$P/freshbin-$m-$i python3 benchmarks/device/aoti_probe.py loadbin $m $P 2>&1 | tail -n 2
    done
done
} > "$RESULTS/aoti-probe.txt" 2>&1
cat "$RESULTS/aoti-probe.txt"
