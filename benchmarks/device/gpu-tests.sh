#!/bin/bash
# The GPU test suite (`pytest -m gpu`, CUDA required: a missing GPU fails rather than skips).
# About 8 minutes on one H100 with 6 workers (WORKERS=N). Log: $OUT/r/gpu-tests-at-<commit>.txt
source benchmarks/device/setup.sh
started=$(date +%s)
timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider -n "${WORKERS:-6}" --durations=15 2>&1 | tee "$RESULTS/gpu-tests-at-$COMMIT.txt"
status=$?
echo "== pytest -m gpu exit $status, $(( $(date +%s) - started )) s" | tee -a "$RESULTS/gpu-tests-at-$COMMIT.txt"
exit $status
