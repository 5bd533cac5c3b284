#!/bin/bash
# Issue 36 on the GPU host: the GPU suite (all of `pytest -m gpu`, the precision tests among
# them), then fp32/tf32/bf16/fp16 graphs side by side (`qkan-pack bench --precision`) and
# `warm --precision auto` for resnet50 (1 and 32 images) and a BERT-base-sized encoder
# (1x128, 16x128). Files: $OUT/r/gpu-tests-at-<commit>.txt, precision-<model>.{txt,json},
# warm-<model>.json
source benchmarks/device/setup.sh
started=$(date +%s)
timeout ${SUITE_S:-400} python3 -m pytest -m gpu -n ${WORKERS:-8} --durations=15 -q -p no:cacheprovider \
    2>&1 | tail -60 > "$RESULTS/gpu-tests-at-$COMMIT.txt"
echo "== pytest exit ${PIPESTATUS[0]}, $(( $(date +%s) - started )) s" >> "$RESULTS/gpu-tests-at-$COMMIT.txt"
tail -4 "$RESULTS/gpu-tests-at-$COMMIT.txt"
precision() {  # name, build arguments...
    local name=$1; shift
    { python3 -m qkan_pack build "$@" --precision auto --max-error 0.05 -o "/tmp/$name" --force \
      && python3 -m qkan_pack warm "/tmp/$name" --precision auto --json > "$RESULTS/warm-$name.json" \
      && python3 -m qkan_pack bench "/tmp/$name" --precision fp32,tf32,bf16,fp16 --iters 100 \
           --repeats 2 --warmup 10 --skip torch_compile --skip qkan_compile_inference \
           --skip predictor_padded --json "$RESULTS/precision-$name.json"; } \
        > "$RESULTS/precision-$name.txt" 2>&1
    echo "== $name exit $?, $(( $(date +%s) - started )) s" | tee -a "$RESULTS/precision-$name.txt"
}
precision resnet50 tests/models/zoo.py --config family='"torchvision"' --config name='"resnet50"' \
    --shapes 1x3x224x224,32x3x224x224
precision bert_base benchmarks/models/bert_base.py --input input_ids:1x128,16x128:int64 \
    --input attention_mask:1x128,16x128:int64
echo "total $(( $(date +%s) - started )) s"
