#!/bin/bash
# Issue 19's serving figures on one H200 host, each beside the no-op deployment: one replica's
# curve (1-512 clients), four replicas sharing the GPU with a replica SIGKILLed under 128
# clients, and a repeat of one replica at 32 clients. About 6 minutes.
# Files: $OUT/r/serve_{1rep,4rep}.{json,png}, serve_1rep_32_repeat.json, serve.txt
source benchmarks/device/setup.sh
build_serving_artifact
bench() { python3 -m qkan_pack bench-serve /tmp/mlp --processes 8 --seconds 6 --warmup 2 "$@"; }
started=$(date +%s)
{
    echo "== commit $COMMIT"
    bench --json "$RESULTS/serve_1rep.json" --plot "$RESULTS/serve_1rep.png"
    echo "== elapsed $(( $(date +%s) - started )) s"
    bench --clients 32,128,512 --serve-args '--replicas 4 --gpus-per-replica 0.25' \
        --kill-at 3 --kill-clients 128 --json "$RESULTS/serve_4rep.json" --plot "$RESULTS/serve_4rep.png"
    echo "== elapsed $(( $(date +%s) - started )) s"
    bench --clients 32 --json "$RESULTS/serve_1rep_32_repeat.json"
    echo "== elapsed $(( $(date +%s) - started )) s"
} 2>&1 | tee "$RESULTS/serve.txt"
