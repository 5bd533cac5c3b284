#!/bin/bash
# Issue 32 item 9's replica-loss figure on the GPU host: 4 replicas sharing the GPU (0.25 each)
# under 128 keep-alive clients, one replica SIGKILLed every 18 s, 12 times (each kill once every
# replica serves again; at least 10 fit), HAProxy's log captured. The figure: requests failed of
# all (goal: 0 of at least 200,000), and how HAProxy retried those in flight on a killed replica.
# About 6 minutes.
# Files: $OUT/r/kill-loop.{json,txt}, haproxy.summary.json (every request line counted by
# status, termination state and retries), haproxy.log (the lines of retried or failed requests,
# health checks and reloads)
source benchmarks/device/setup.sh
build_serving_artifact
LOG_PORT=5514
python3 benchmarks/haproxy_log.py "$LOG_PORT" "$RESULTS/haproxy" &
logger=$!
started=$(date +%s)
{
    echo "== commit $COMMIT"
    RAY_SERVE_HAPROXY_LOG_TARGET="127.0.0.1:$LOG_PORT" python3 -m qkan_pack bench-serve /tmp/mlp \
        --clients 128 --seconds 3 --warmup 1 --no-noop --processes 8 \
        --serve-args '--replicas 4 --gpus-per-replica 0.25' \
        --kill-at 5 --kills 12 --kill-every 18 --kill-clients 128 --json "$RESULTS/kill-loop.json"
    echo "== elapsed $(( $(date +%s) - started )) s"
} 2>&1 | tee "$RESULTS/kill-loop.txt"
kill -TERM "$logger"
wait "$logger"
python3 - "$RESULTS" <<'EOF' | tee -a "$RESULTS/kill-loop.txt"
import json, sys
kill = json.load(open(f"{sys.argv[1]}/kill-loop.json"))["kill"]
log = json.load(open(f"{sys.argv[1]}/haproxy.summary.json"))
print("kills at (s):", [k["at_s"] for k in kill["killed"]], "late (s):", [k["late_s"] for k in kill["killed"]])
print("client statuses:", kill["point"]["statuses"])
print("HAProxy request lines:", log["total"], log["requests"])
print("retries per request:", log["retries"])
EOF
