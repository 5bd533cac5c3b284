#!/bin/bash
# Issue 43's repository figure: a model repository of 10 artifacts (examples/qkan_mlp.py at
# 1x2,8x2,32x2, each its own model m1..m10, version 1) served by one `qkan-pack serve REPO`,
# every model under load at once, against m1 served alone by a second server, side by side
# (bench-serve REPO: at each client count alone, all and one back to back, 2 rounds, each
# figure the median). 1 replica per model on the one GPU; JSON route; the figure is
# all / alone at each count (target >= 0.9). About 7 minutes: 10 builds, two servers, 2
# rounds of 3 x 3 points of 5 s. Files: $OUT/r/repository.{json,png}, repository.txt
source benchmarks/device/setup.sh
REPO=/tmp/repo
{
    echo "== commit $COMMIT"
    python3 benchmarks/build_repository.py examples/qkan_mlp.py 1x2,8x2,32x2 "$REPO" --models 10
    echo "== built at $SECONDS s"
    timeout --kill-after=60 $(( 560 - SECONDS )) python3 -m qkan_pack bench-serve "$REPO" \
        --processes 8 --seconds 5 --warmup 1 --clients 32,128,512 --rounds 2 \
        --serve-args '--device cuda' \
        --json "$RESULTS/repository.json" --plot "$RESULTS/repository.png"
    echo "== elapsed $SECONDS s"
} 2>&1 | tee "$RESULTS/repository.txt"
