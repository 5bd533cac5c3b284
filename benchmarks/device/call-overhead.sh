#!/bin/bash
# Issue 44, item 4 (carry .whl only): a predictor's call against a bare replay, per shape,
# against the 1.05 target. QKAN [2,8,2] at 1x2,64x2, QKAN [64,64,64] at 1x64 and the HQKAN
# GPT at 1x128: `qkan-pack bench` with the predictor and the bare replay (and eager, which
# bench always runs; the other variants skipped), then benchmarks/device/call_overhead.py:
# bench's pred/bare per shape against 1.05, beside the predictor against a bare replay of its
# own graph (the same GPU work: the call's host overhead alone) and both graphs' GPU time.
# Then the call-plan GPU tests (tests/runtime/test_gpu_calls.py; NO_TESTS=1: not).
# Files: $OUT/r/bench-{mlp,q64,gpt}.{txt,json}, build-*.txt, call-overhead.{txt,json},
# gpu-calls-tests.txt
source benchmarks/device/setup.sh
left() { echo $(( ${1} - SECONDS )); }
lscpu | grep -E 'Model name|^CPU\(s\)|MHz' | head -n 4
model() {  # name, build arguments...
    local name=$1; shift
    timeout "$(left 360)" python3 -m qkan_pack build "$@" -o "/tmp/$name" --force \
        > "$RESULTS/build-$name.txt" 2>&1
    echo "== $name built: exit $? at $SECONDS s"; tail -n 2 "$RESULTS/build-$name.txt"
    timeout "$(left 420)" python3 -m qkan_pack bench "/tmp/$name" --device cuda --iters 1000 \
        --repeats 3 --warmup 50 --skip predictor_padded --skip qkan_compile_inference \
        --skip torch_compile --json "$RESULTS/bench-$name.json" > "$RESULTS/bench-$name.txt" 2>&1
    echo "== $name bench: exit $? at $SECONDS s"; cat "$RESULTS/bench-$name.txt"
}
model mlp examples/qkan_mlp.py --shapes 1x2,64x2
model q64 examples/qkan_mlp.py --config 'width=[64,64,64]' --shapes 1x64
model gpt examples/hqkan_gpt.py --shapes 1x128 --dtype int64
timeout "$(left 570)" python3 benchmarks/device/call_overhead.py "$RESULTS" mlp=/tmp/mlp \
    q64=/tmp/q64 gpt=/tmp/gpt 2>&1 | tee "$RESULTS/call-overhead.txt"
echo "== call overhead: exit ${PIPESTATUS[0]} at $SECONDS s"
[ -n "$NO_TESTS" ] && exit 0
timeout "$(left 590)" python3 -m pytest -q -p no:cacheprovider tests/runtime/test_gpu_calls.py \
    2>&1 | tail -n 30 > "$RESULTS/gpu-calls-tests.txt"
echo "== tests exit ${PIPESTATUS[0]} at $SECONDS s"; cat "$RESULTS/gpu-calls-tests.txt"
