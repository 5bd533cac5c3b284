#!/bin/bash
# Issue 44 item 3: where `warm --compiled`'s AOTInductor time goes on this GPU host
# (aoti_compile_time.py beside this file): QKAN [64,64,64] at 1x64,2x64,4x64, each shape
# traced and packaged by the route as it ships (precompiled headers made once), then by the
# route before it (no precompiled headers), then at -O0. About 6 minutes.
#   SHAPES=N (3) shapes per variant; VARIANTS="route nopch o0"
# Files: $OUT/r/aoti-compile-time.txt
source benchmarks/device/setup.sh
python3 -m qkan_pack build examples/qkan_mlp.py --config 'width=[64,64,64]' \
    --shapes 1x64,2x64,4x64,8x64 -o /tmp/q64t > "$RESULTS/build-q64t.txt" 2>&1 || { cat "$RESULTS/build-q64t.txt"; exit 1; }
{
    g++ --version | head -n 1; nproc
    for variant in ${VARIANTS:-route nopch o0}; do
        left=$(( 560 - SECONDS ))
        [ "$left" -lt 60 ] && { echo "== $variant skipped ($left s left)"; continue; }
        timeout "$left" python3 benchmarks/device/aoti_compile_time.py /tmp/q64t "$variant" "${SHAPES:-3}" 2>&1 \
            | grep -v "Warning\|warn(" 
        echo "== $variant: exit ${PIPESTATUS[0]} at $SECONDS s"
    done
} > "$RESULTS/aoti-compile-time.txt" 2>&1
cat "$RESULTS/aoti-compile-time.txt"
