#!/bin/bash
# The GPU test suite (`pytest -m gpu`, CUDA required: a missing GPU fails rather than skips),
# in two shards that each fit one device call (about 9 minutes in one on an H100 with 6-8
# workers, more than a call's 10):
#   bash benchmarks/device/gpu-tests.sh 1   # the long third-party runs: README/docs GPU blocks,
#                                           # the model zoo, the detector (about 4-5 min)
#   bash benchmarks/device/gpu-tests.sh 2   # everything else (about 5 min)
#   bash benchmarks/device/gpu-tests.sh     # all of it, where a call allows
# Workers: WORKERS=N (6). Log: $OUT/r/gpu-tests-at-<commit>[-shard-N].txt
source benchmarks/device/setup.sh
LONG=(tests/test_readme.py tests/runtime/test_gpu_zoo.py tests/runtime/test_gpu_half_and_detection.py)
case "${1:-all}" in
    1) selection=("${LONG[@]}") suffix=-shard-1 ;;
    2) selection=(tests); for path in "${LONG[@]}"; do selection+=(--ignore "$path"); done
       suffix=-shard-2 ;;
    all) selection=(tests) suffix= ;;
    *) echo "gpu-tests.sh: shard is 1, 2 or nothing (all), not '$1'"; exit 2 ;;
esac
LOG="$RESULTS/gpu-tests-at-$COMMIT$suffix.txt"
# Each worker's torch would use every core for CPU work (builds run the model on the CPU):
# 8 workers x 16 threads on 16 cores spun a fixture's build past 150 s at e50bb5b. Share them.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / ${WORKERS:-6} > 0 ? $(nproc) / ${WORKERS:-6} : 1 ))}
# A test stuck this long prints every thread's stack (what a cut-short run otherwise hides).
FAULT_AFTER=${FAULT_AFTER:-240}
started=$(date +%s)
timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider -n "${WORKERS:-6}" --durations=15 \
    -o faulthandler_timeout="$FAULT_AFTER" \
    "${selection[@]}" 2>&1 | tee "$LOG"
status=$?
echo "== pytest -m gpu ${1:-all} exit $status, $(( $(date +%s) - started )) s" | tee -a "$LOG"
exit $status
