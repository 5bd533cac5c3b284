#!/bin/bash
# Issue 37's figures on one GPU host (carry .whl only): default mode against compiled mode
# (precompiled graphs shipped by `warm --compiled`, loaded without tracing), side by side in
# one `bench --cold` session per model: fresh processes, empty caches, shipped artifacts,
# bytecode precompiled (as an installed host), 5 runs each. QKAN [64,64,64] x 8 shapes
# (first shape 1x64) and the HQKAN GPT (1x128, 8x128). Then the compiled-mode GPU tests
# (NO_TESTS=1: not; PROFILE=1: one more run per variant under cProfile).
# Files: $OUT/r/cold-{q64,gpt}.{txt,json,png}, warm-*.txt, gpu-compiled-tests.txt
source benchmarks/device/setup.sh
left() { echo $(( ${1} - SECONDS )); }
model() {  # name, build arguments...
    local name=$1; shift
    timeout "$(left 400)" bash -c 'python3 -m qkan_pack build "$@" -o "/tmp/$0" --force \
        && python3 -m qkan_pack warm "/tmp/$0" --compiled' "$name" "$@" > "$RESULTS/warm-$name.txt" 2>&1
    echo "== $name warmed: exit $? at $SECONDS s"; tail -n 3 "$RESULTS/warm-$name.txt"
    timeout "$(left 430)" python3 -m qkan_pack bench "/tmp/$name" --device cuda --cold --runs 5 \
        --variants predictor,compiled --bytecode-cache /tmp/pyc ${PROFILE:+--profile} --json "$RESULTS/cold-$name.json" \
        --plot "$RESULTS/cold-$name.png" > "$RESULTS/cold-$name.txt" 2>&1
    echo "== $name cold: exit $? at $SECONDS s"; cat "$RESULTS/cold-$name.txt"
}
model q64 examples/qkan_mlp.py --config width='[64,64,64]' \
    --shapes 1x64,2x64,4x64,8x64,16x64,32x64,64x64,128x64
model gpt examples/hqkan_gpt.py --shapes 1x128,8x128 --dtype int64
[ -n "$NO_TESTS" ] && exit 0
timeout "$(left 570)" python3 -m pytest -q -p no:cacheprovider -x tests/runtime/test_gpu_compiled.py tests/builder/test_gpu_warm_probe.py \
    tests/runtime/test_precompiled_cpu.py tests/runtime/test_compiled_cpu.py 2>&1 \
    | tail -n 40 > "$RESULTS/gpu-compiled-tests.txt"
echo "== tests exit $? at $SECONDS s"; cat "$RESULTS/gpu-compiled-tests.txt"
