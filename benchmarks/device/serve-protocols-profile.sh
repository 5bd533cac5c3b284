#!/bin/bash
# Where one replica's CPU goes per protocol (issue 43 item 3): for each of the JSON route,
# binary HTTP and gRPC, one `bench-serve` run at 32 clients (1 replica, --split-cpus), with
# py-spy sampling the replica for 6 s of its steady load. About 2 minutes.
# Needs py-spy carried: its static binary, stripped and xz-compressed, at .tools/py-spy.xz
# (benchmarks/device/README.md; the whole carry must stay under 64 MiB).
# Files: $OUT/r/profile-<protocol>.raw (py-spy's collapsed stacks), profile-<protocol>.txt
# and .json (bench-serve's table and results), profile-summary.txt
# (benchmarks/profile_stacks.py over the three).
source benchmarks/device/setup.sh
ARTIFACT=/tmp/mlp64
build_serving_artifact "$ARTIFACT" 1x2,8x2,32x2,64x2
SPY=/tmp/py-spy
xz -dc .tools/py-spy.xz > "$SPY" && chmod +x "$SPY" \
    || { echo "no .tools/py-spy.xz: carry .tools with py-spy's static binary, xz-compressed"; exit 2; }
for protocol in ${PROTOCOLS:-json oip-binary oip-grpc}; do
    python3 -m qkan_pack bench-serve "$ARTIFACT" --protocol "$protocol" --clients 32 \
        --processes 8 --seconds 12 --warmup 2 --no-noop --split-cpus "${SPLIT_CPUS:-0-7:8-15}" \
        --json "$RESULTS/profile-$protocol.json" > "$RESULTS/profile-$protocol.txt" 2>&1 &
    bench=$!
    replica=
    for _ in $(seq 90); do
        replica=$(pgrep -f '^ray::ServeReplica' | head -1)  # Ray's title for the actor
        [ -n "$replica" ] && break
        sleep 1
    done
    # The load is on once the replica spends over half a CPU for a second (bench-serve's
    # table, written to a file, comes only at its end); the timed part starts 2 s later.
    for _ in $(seq 90); do
        [ -r "/proc/$replica/stat" ] || break
        before=$(awk '{print $14 + $15}' "/proc/$replica/stat")
        sleep 1
        after=$(awk '{print $14 + $15}' "/proc/$replica/stat" 2>/dev/null || echo "$before")
        [ $(( after - before )) -gt $(( $(getconf CLK_TCK) / 2 )) ] && break
    done
    sleep 3
    "$SPY" record --pid "$replica" --duration 6 --rate 250 --format raw --nonblocking \
        -o "$RESULTS/profile-$protocol.raw" > "$RESULTS/profile-$protocol.spy.txt" 2>&1
    wait "$bench"
    echo "== $protocol (replica $replica)"
    tail -n 3 "$RESULTS/profile-$protocol.txt"
done
shopt -s nullglob
raw=("$RESULTS"/profile-*.raw)
[ ${#raw[@]} -gt 0 ] || { echo "no profile was recorded (profile-*.spy.txt says why)"; exit 1; }
python3 benchmarks/profile_stacks.py "${raw[@]}" | tee "$RESULTS/profile-summary.txt"
