#!/bin/bash
# Issue 44 item 3, diagnosis (carry nothing; plain torch): does an AOTInductor package of a
# tiny Linear model load on this host's torch, by torch's official loader and by the C++
# class qkan-pack's prototype used (single-threaded on cuda:0, and threaded), with and
# without precompiled headers; a crashing load gets a native backtrace (cuda-gdb) and the
# extracted library's dependencies. Each step in its own process, bounded. About 4 minutes.
# Files: $OUT/r/aoti-crash.txt
RESULTS="${OUT:?run this through the device tool, which sets OUT}/r"
mkdir -p "$RESULTS"
HERE=benchmarks/device
step() {  # seconds, label, command...
    local limit=$1 label=$2; shift 2
    echo "== $label"
    timeout "$limit" "$@" 2>&1 | grep -v "Warning\|warnings.warn" | tail -n 25
    echo "== $label: exit ${PIPESTATUS[0]} at $SECONDS s"
}
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda);
print(torch._C._aoti.AOTIModelPackageLoader.__init__.__doc__)"
    for variant in headers no-headers; do
        dir=/tmp/aoti-$variant
        flag=$([ "$variant" = no-headers ] && echo --no-precompile-headers)
        step 150 "make ($variant)" python3 -X faulthandler $HERE/aoti_crash.py make "$dir" $flag
        for how in official single threaded; do
            TORCH_CPP_LOG_LEVEL=INFO step 60 "load $how ($variant)" \
                python3 -X faulthandler $HERE/aoti_crash.py load "$dir" "$how"
        done
    done
    unzip -l /tmp/aoti-headers/model.pt2 | tail -n 12
    so=$(mkdir -p /tmp/aoti-x && cd /tmp/aoti-x && unzip -oq /tmp/aoti-headers/model.pt2 && find . -name '*.so' | head -n 1)
    [ -n "$so" ] && (cd /tmp/aoti-x && ldd "$so"; readelf -d "$so" | grep -i "needed\|rpath\|runpath")
    if command -v cuda-gdb > /dev/null; then
        step 120 "backtrace (single, headers)" cuda-gdb -q -batch -ex run -ex bt --args \
            python3 $HERE/aoti_crash.py load /tmp/aoti-headers single
    fi
} > "$RESULTS/aoti-crash.txt" 2>&1
cat "$RESULTS/aoti-crash.txt"
