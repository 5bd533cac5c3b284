#!/bin/bash
# Issue 37's and 44's (item 3) figures on one GPU host (carry .whl only): default mode against
# compiled mode (precompiled graphs shipped by `warm --compiled`, loaded without tracing: since
# issue 44 AOTInductor packages run by torch's C++ loader), side by side in one `bench --cold`
# session per model: fresh processes, empty caches, shipped artifacts, bytecode precompiled
# (as an installed host), 5 runs each. QKAN [64,64,64] x 8 shapes (first shape 1x64) and the
# HQKAN GPT (1x128, 8x128). After each warm, each shipped AOTInductor package's wrapper library
# says whether it links the shared libstdc++ (readelf: a static one crashed the process that
# loaded it; warm now refuses those), and one fresh load says which form it runs and which of
# the compiler's modules it imported. Then the compiled-mode GPU tests.
#   MODELS="q64" or "gpt" (default both; one model per call fits the 10-minute call best;
#   with the tests, one model: MODELS=gpt bash ... runs the GPT and then the tests),
#   NO_TESTS=1: no tests; PROFILE=1: one more run per variant under cProfile;
#   QKAN_PACK_AOTI=0: the forms before issue 44 (standalone_compile's), for comparison.
# Files: $OUT/r/cold-{q64,gpt}.{txt,json,png}, warm-*.txt, gpu-compiled-tests.txt
source benchmarks/device/setup.sh
MODELS=${MODELS:-q64 gpt}
FORM=${QKAN_PACK_AOTI:+-inductor}
left() { echo $(( ${1} - SECONDS )); }
model() {  # name, warm deadline (s), bench deadline (s), build arguments...
    local name=$1 warm_by=$2 bench_by=$3; shift 3
    timeout "$(left "$warm_by")" bash -c 'python3 -m qkan_pack build "$@" -o "/tmp/$0" --force \
        && python3 -m qkan_pack warm "/tmp/$0" --compiled' "$name" "$@" > "$RESULTS/warm-$name$FORM.txt" 2>&1
    echo "== $name warmed: exit $? at $SECONDS s"; tail -n 3 "$RESULTS/warm-$name$FORM.txt"
    python3 - "/tmp/$name" <<'PY' 2>&1 | tail -n 12
import pathlib, subprocess, sys, tempfile, zipfile
for package in sorted(pathlib.Path(sys.argv[1], "kernels").glob("*-precompiled/*.pt2")):
    with zipfile.ZipFile(package) as archive, tempfile.TemporaryDirectory() as scratch:
        for name in (n for n in archive.namelist() if n.endswith(".so")):
            needed = subprocess.run(["readelf", "-d", archive.extract(name, scratch)],
                                    capture_output=True, text=True).stdout
            print(package.name, name.rsplit("/", 1)[-1][:16], "needs libstdc++.so.6:",
                  "[libstdc++.so.6]" in needed)
PY
    TORCHINDUCTOR_CACHE_DIR=/tmp/probe-$name TRITON_CACHE_DIR=/tmp/probe-$name-triton python3 -c '
import sys, time
t = time.perf_counter()
from qkan_pack import Predictor
p = Predictor.load(sys.argv[1], device="cuda", compiled="shipped")
heavy = ("torch._dynamo", "torch._inductor", "sympy", "networkx", "jinja2")
print(f"fresh load {time.perf_counter() - t:.2f} s; compiled: {p.report.compiled}")
from qkan_pack.runtime import module_state
print("imported:", [m for m in heavy if module_state(m) == "imported"])
' "/tmp/$name" 2>&1 | tail -n 4
    timeout "$(left "$bench_by")" python3 -m qkan_pack bench "/tmp/$name" --device cuda --cold --runs 5 \
        --variants predictor,compiled --bytecode-cache /tmp/pyc ${PROFILE:+--profile} --json "$RESULTS/cold-$name$FORM.json" \
        --plot "$RESULTS/cold-$name$FORM.png" > "$RESULTS/cold-$name$FORM.txt" 2>&1
    echo "== $name cold: exit $? at $SECONDS s"; cat "$RESULTS/cold-$name$FORM.txt"
}
# deadlines (s since start): both models share one call; one model alone gets the call, or
# (tests wanted) leaves the tests 260 s
case "$MODELS" in *q64*gpt*) q_warm=240 q_bench=300 g_warm=420 g_bench=480 ;;
                  *) if [ -n "$NO_TESTS" ]; then q_warm=470 q_bench=585; else q_warm=220 q_bench=310; fi
                     g_warm=$q_warm g_bench=$q_bench ;; esac
[[ " $MODELS " == *" q64 "* ]] && model q64 "$q_warm" "$q_bench" examples/qkan_mlp.py \
    --config width='[64,64,64]' --shapes 1x64,2x64,4x64,8x64,16x64,32x64,64x64,128x64
[[ " $MODELS " == *" gpt "* ]] && model gpt "$g_warm" "$g_bench" examples/hqkan_gpt.py \
    --shapes 1x128,8x128 --dtype int64
[ -n "$NO_TESTS" ] && exit 0
timeout "$(left 570)" python3 -m pytest -q -p no:cacheprovider -n 6 tests/runtime/test_gpu_compiled.py tests/builder/test_gpu_warm_probe.py \
    tests/runtime/test_aoti_cpu.py tests/runtime/test_precompiled_cpu.py tests/runtime/test_compiled_cpu.py 2>&1 \
    | tail -n 40 > "$RESULTS/gpu-compiled-tests.txt"
echo "== tests exit $? at $SECONDS s"; cat "$RESULTS/gpu-compiled-tests.txt"
