#!/bin/bash
# Issues 35 and 43's protocol figures on one GPU host: the Open Inference Protocol's binary
# HTTP and gRPC against the JSON route (POST /), side by side on one server per run, at 8-512
# clients: 1 replica (with the no-op, JSON only), 64-row requests (JSON against binary), 4
# replicas on 0.25 GPU each. Targets (issue 43): binary HTTP >= 1.0x and gRPC >= 0.9x the
# JSON route's req/s at every load, each with p99 <= 1.2x the JSON route's; a 64-row binary
# request >= 3x the 1-row JSON route's rows/s. The last lines set each point against them,
# with rows per replay per protocol (every replica's, from GET /metrics) and the CPU each
# part (replicas, HAProxy, Ray's other processes, the clients) spent per request. Each run
# gets what is left of 8 minutes; a run that would not fit is skipped. About 7 minutes.
# NO_ROWS=1 leaves the 64-row run out (about 5 minutes then); ONE_REPLICA=1 leaves the
# 4-replica run and the no-op out; FOUR_ONLY=1 runs the 4-replica run alone (with NO_ROWS=1:
# one call for each replica count); CLIENTS=32,128 measures only those loads (about 2 minutes
# with both); ROUND_COUNT=N takes each point's median over N rounds (3; 5 fits one replica
# count per call); POINT_SECONDS=S measures each round of a point for S seconds (2; one
# replica count with ROUND_COUNT=5 and POINT_SECONDS=4 takes about 7 minutes); SPLIT_CPUS=0-7:8-15
# runs the server on the first CPUs and the client processes on the others
# (bench-serve --split-cpus); PROTOCOLS=json,oip-binary compares those alone (two thirds of
# the time: ROUND_COUNT=7 with POINT_SECONDS=4 fits one replica count per call).
# Needs tritonclient carried in .whl (README.md beside this file); without it the gRPC
# protocol is left out and the rest still runs.
# Files: $OUT/r/protocols_{1rep,1rep_64rows,4rep}.json, protocols.txt
source benchmarks/device/setup.sh
ARTIFACT=/tmp/mlp64
build_serving_artifact "$ARTIFACT" 1x2,8x2,32x2,64x2
PROTOCOLS=${PROTOCOLS:-json,oip-binary,oip-grpc}
if [[ $PROTOCOLS == *oip-grpc* ]] \
        && ! python3 -c "import tritonclient.grpc" > "$RESULTS/tritonclient.txt" 2>&1; then
    PROTOCOLS=json,oip-binary
    GRPC_LEFT_OUT=1
fi
# One run, bounded by what is left of 480 s since the script started (SIGTERM: bench-serve
# stops its server and keeps nothing of that run), skipped when under a minute is left.
# The protocol runs take each point's median over 3 rounds of 2 s, the protocols alternated
# (one 4-s run per point moved the ratios by 10-30% between runs of the same tree).
bench() {
    local left=$(( 480 - SECONDS ))
    if [ "$left" -lt 60 ]; then echo "== skipped (${left} s left): $*"; return; fi
    timeout --kill-after=90 "$left" python3 -m qkan_pack bench-serve "$ARTIFACT" \
        --processes 8 --clients "${CLIENTS:-8,32,128,512}" ${SPLIT_CPUS:+--split-cpus "$SPLIT_CPUS"} "$@"
}
ROUNDS="--rounds ${ROUND_COUNT:-3} --seconds ${POINT_SECONDS:-2} --warmup 0.5"
{
    echo "== commit $COMMIT"
    [ -n "$GRPC_LEFT_OUT" ] && echo "== oip-grpc left out: $(tail -n 1 "$RESULTS/tritonclient.txt")"
    if [ -z "$FOUR_ONLY" ]; then
        bench --protocol "$PROTOCOLS" $ROUNDS ${ONE_REPLICA:+--no-noop} --json "$RESULTS/protocols_1rep.json"
        echo "== elapsed $SECONDS s"
    fi
    if [ -z "$NO_ROWS" ]; then
        bench --protocol json,oip-binary --rows-per-request 64 --no-noop --seconds 4 --warmup 1 \
            --json "$RESULTS/protocols_1rep_64rows.json"
        echo "== elapsed $SECONDS s"
    fi
    if [ -z "$ONE_REPLICA" ]; then
        bench --protocol "$PROTOCOLS" $ROUNDS --no-noop \
            --serve-args '--replicas 4 --gpus-per-replica 0.25' --json "$RESULTS/protocols_4rep.json"
        echo "== elapsed $SECONDS s"
    fi
    python3 - "$RESULTS" <<'PY'
import json, pathlib, sys

results = pathlib.Path(sys.argv[1])
#: Issue 43: req/s against the JSON route's at the same load, and p99 at most 1.2x its.
TARGETS = {"oip-binary": 1.0, "oip-grpc": 0.9}

def report(name):
    path = results / name
    return json.loads(path.read_text()) if path.exists() else {}

def model_points(name):
    return report(name).get("curves", {}).get("model", [])

for run in ("protocols_1rep.json", "protocols_4rep.json"):
    points = model_points(run)
    ranges = report(run).get("ratio_ranges", {})
    base = {p["clients"]: p for p in points if p["protocol"] == "json"}
    for point in points:
        json_point = base.get(point["clients"])
        line = (f"{run[10:-5]:<5} {point['protocol']:<10} at {point['clients']:>3} clients: "
                f"{point['requests_per_s']:>8.0f} req/s, p99 {point['p99_ms']:>7.2f} ms, "
                f"{point['rows_per_replay'] or 0:>5.2f} rows/replay")
        cpu = point.get("cpu_us_per_request") or {}
        line += " (CPU us/request: " + ", ".join(f"{role} {cpu[role]:.0f}" for role in (
            "replicas", "haproxy", "ray", "clients") if role in cpu) + ")"
        if point["protocol"] in TARGETS and json_point and json_point["requests_per_s"]:
            ratio = point["requests_per_s"] / json_point["requests_per_s"]
            p99 = point["p99_ms"] / json_point["p99_ms"] if json_point["p99_ms"] else 0.0
            met = ratio >= TARGETS[point["protocol"]] and p99 <= 1.2
            spread = ranges.get(point["protocol"], {}).get(str(point["clients"]))
            rounds = f" [rounds {spread[0]:.2f}-{spread[1]:.2f}]" if spread else ""
            line += (f"; {ratio:.2f}x JSON's req/s{rounds} (target {TARGETS[point['protocol']]}x), "
                     f"p99 {p99:.2f}x (target <= 1.2x): {'met' if met else 'NOT met'}")
        print(line)

single = {p["clients"]: p for p in model_points("protocols_1rep.json") if p["protocol"] == "json"}
for point in model_points("protocols_1rep_64rows.json"):
    base = single.get(point["clients"])
    if base and base["rows_per_s"]:
        ratio = point["rows_per_s"] / base["rows_per_s"]
        print(f"64-row {point['protocol']:<10} at {point['clients']:>3} clients: "
              f"{point['rows_per_s']:>10.0f} rows/s, {ratio:.2f}x the 1-row JSON route's "
              f"{base['rows_per_s']:.0f}" + (f" (target 3x: {'met' if ratio >= 3 else 'NOT met'})"
                                            if point["protocol"] == "oip-binary" else ""))
PY
} 2>&1 | tee "$RESULTS/protocols.txt"
