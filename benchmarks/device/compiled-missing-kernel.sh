#!/bin/bash
# The GPU suite at 1571b4c: a fresh precompiled load of the HQKAN GPT compiles qkan's
# _pz_encoding_kernel, which `warm --compiled` did not ship. Keeps both sides' cache entries
# of that kernel (benchmarks/device/compiled_missing_kernel.py). About 2 minutes.
# Files: $OUT/r/pz/{shipped,fresh}/*, pz.txt
source benchmarks/device/setup.sh
timeout 300 python3 benchmarks/device/compiled_missing_kernel.py 2>&1 | tee "$RESULTS/pz.txt"
