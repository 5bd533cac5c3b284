#!/bin/bash
# Issue 42's serving figure: rows of different requests batched only into shapes proved
# row-independent at build. One model, the same graphs, served two ways side by side:
#   proved   - examples/qkan_mlp.py at 1x2,8x2,32x2 as built (every batch proved independent:
#              single rows from concurrent clients share replays);
#   unproved - a copy whose manifest carries no row verdict (as an artifact built before the
#              proof): each request replays alone in 1x2;
# and a model whose rows depend on each other (dynamic int8 quantisation of its input,
# tests/models/row_models.py), which serve answers one request at a time.
# bench-serve at 8, 32 and 128 clients, 1 replica, JSON route, the same admission bounds for
# all (128 at work, 256 waiting: no 503 at these loads); the figure is req/s at 32.
# About 4 minutes. Files: $OUT/r/rows_{proved,unproved,int8}.json, rows.txt
source benchmarks/device/setup.sh
PROVED=/tmp/rows-proved UNPROVED=/tmp/rows-unproved INT8=/tmp/rows-int8
build_serving_artifact "$PROVED" 1x2,8x2,32x2
cp -r "$PROVED" "$UNPROVED"
python3 - "$UNPROVED/manifest.json" <<'PY'
import json, sys
path = sys.argv[1]
raw = json.load(open(path))
for entry in raw["shapes"]:
    entry.pop("rows", None)
json.dump(raw, open(path, "w"), indent=2)
PY
python3 -m qkan_pack build tests/models/row_models.py --shapes 1x8,8x8,32x8 --config kind=int8 \
    -o "$INT8" > "$RESULTS/build-int8.txt" 2>&1 || { cat "$RESULTS/build-int8.txt"; exit 1; }
bench() {
    local left=$(( 500 - SECONDS ))
    if [ "$left" -lt 60 ]; then echo "== skipped (${left} s left): $*"; return; fi
    timeout --kill-after=60 "$left" python3 -m qkan_pack bench-serve "$@" \
        --processes 8 --seconds 5 --warmup 1 --clients 8,32,128 --no-noop \
        --serve-args '--max-ongoing-requests 128 --max-queued-requests 256'
}
{
    echo "== commit $COMMIT"
    python3 -m qkan_pack inspect "$PROVED" | grep -A4 ' #  inputs'
    python3 -m qkan_pack inspect "$INT8" | grep -A5 ' #  inputs'
    bench "$PROVED" --json "$RESULTS/rows_proved.json"
    echo "== elapsed $SECONDS s"
    bench "$UNPROVED" --json "$RESULTS/rows_unproved.json"
    echo "== elapsed $SECONDS s"
    bench "$INT8" --json "$RESULTS/rows_int8.json"
    echo "== elapsed $SECONDS s"
    python3 - "$RESULTS" <<'PY'
import json, pathlib, sys

results = pathlib.Path(sys.argv[1])
def points(name):
    path = results / f"rows_{name}.json"
    if not path.exists():
        return {}
    return {p["clients"]: p for p in json.loads(path.read_text())["curves"]["model"]}

proved, unproved, int8 = points("proved"), points("unproved"), points("int8")
for clients in sorted(proved):
    a, b = proved[clients], unproved.get(clients)
    line = f"{clients:>4} clients: proved {a['requests_per_s']:>8.0f} req/s ({(a.get('rows_per_replay') or 0):.1f} rows/replay)"
    if b:
        line += f", unproved {b['requests_per_s']:>8.0f} req/s ({(b.get('rows_per_replay') or 0):.1f}), ratio {a['requests_per_s'] / b['requests_per_s']:.2f}x"
    if clients in int8:
        line += f"; int8 model {int8[clients]['requests_per_s']:.0f} req/s ({(int8[clients].get('rows_per_replay') or 0):.1f})"
    print(line)
PY
} 2>&1 | tee "$RESULTS/rows.txt"
