#!/bin/bash
# One GPU replica's CPU time per request against the no-op's (benchmarks/serve_replica_cpu.py),
# three interleaved pairs at 16 clients: the ratio issue 19's 0.9x target is about, free of
# the load generator's share of the host. About 4 minutes.
# Files: $OUT/r/replica-cpu.{txt,json}
source benchmarks/device/setup.sh
build_serving_artifact
python3 benchmarks/serve_replica_cpu.py /tmp/mlp --serve-args '--device cuda' --pairs 3 \
    --json "$RESULTS/replica-cpu.json" 2>&1 | tee "$RESULTS/replica-cpu.txt"
