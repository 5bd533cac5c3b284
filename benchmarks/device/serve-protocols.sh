#!/bin/bash
# Issue 35's protocol figures on one GPU host: the Open Inference Protocol's binary HTTP and
# gRPC against the JSON route (POST /), side by side on one server per run, at 8-512 clients:
# 1 replica (with the no-op, JSON only), 64-row requests (JSON against binary), 4 replicas on
# 0.25 GPU each. Targets: binary HTTP >= 0.9x the JSON route's req/s; a 64-row request >= 3x
# the JSON route's rows/s (the last lines set 64-row rows/s against 1-row JSON's). Each run
# gets what is left of 8 minutes; a run that would not fit is skipped. About 7 minutes.
# Needs tritonclient carried in .whl (README.md beside this file); without it the gRPC
# protocol is left out and the rest still runs.
# Files: $OUT/r/protocols_{1rep,1rep_64rows,4rep}.json, protocols.txt
source benchmarks/device/setup.sh
ARTIFACT=/tmp/mlp64
build_serving_artifact "$ARTIFACT" 1x2,8x2,32x2,64x2
PROTOCOLS=json,oip-binary,oip-grpc
if ! python3 -c "import tritonclient.grpc" > "$RESULTS/tritonclient.txt" 2>&1; then
    PROTOCOLS=json,oip-binary
fi
# One run, bounded by what is left of 480 s since the script started (SIGTERM: bench-serve
# stops its server and keeps nothing of that run), skipped when under a minute is left.
bench() {
    local left=$(( 480 - SECONDS ))
    if [ "$left" -lt 60 ]; then echo "== skipped (${left} s left): $*"; return; fi
    timeout --kill-after=90 "$left" python3 -m qkan_pack bench-serve "$ARTIFACT" \
        --processes 8 --seconds 4 --warmup 1 --clients 8,32,128,512 "$@"
}
{
    echo "== commit $COMMIT"
    [ "$PROTOCOLS" = json,oip-binary ] && echo "== oip-grpc left out: $(tail -n 1 "$RESULTS/tritonclient.txt")"
    bench --protocol "$PROTOCOLS" --json "$RESULTS/protocols_1rep.json"
    echo "== elapsed $SECONDS s"
    bench --protocol json,oip-binary --rows-per-request 64 --no-noop \
        --json "$RESULTS/protocols_1rep_64rows.json"
    echo "== elapsed $SECONDS s"
    bench --protocol "$PROTOCOLS" --no-noop --serve-args '--replicas 4 --gpus-per-replica 0.25' \
        --json "$RESULTS/protocols_4rep.json"
    echo "== elapsed $SECONDS s"
    python3 - "$RESULTS" <<'PY'
import json, pathlib, sys

results = pathlib.Path(sys.argv[1])
def model_points(name):
    path = results / name
    return json.loads(path.read_text())["curves"]["model"] if path.exists() else []

single = {p["clients"]: p for p in model_points("protocols_1rep.json") if p["protocol"] == "json"}
for point in model_points("protocols_1rep_64rows.json"):
    base = single.get(point["clients"])
    if base and base["rows_per_s"]:
        print(f"64-row {point['protocol']:<10} at {point['clients']:>3} clients: "
              f"{point['rows_per_s']:>10.0f} rows/s, {point['rows_per_s'] / base['rows_per_s']:.2f}x "
              f"the 1-row JSON route's {base['rows_per_s']:.0f}")
PY
} 2>&1 | tee "$RESULTS/protocols.txt"
