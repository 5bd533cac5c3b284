#!/bin/bash
# Issue 36's figures on the GPU host: fp32/tf32/bf16/fp16 graphs side by side
# (`qkan-pack bench --precision`) and `warm --precision auto` (its choice per shape, with the
# timings) for resnet50 (1 and 32 images), a BERT-base-sized encoder (1x128, 16x128), the
# HQKAN GPT (1x128, 8x128) and QKAN [64,64,64] (1x64, 32x64). Each model is bounded so that all
# ends within 9 minutes; the GPU suite is gpu-tests.sh's call.
# Files: $OUT/r/precision-<model>.{txt,json}, warm-<model>.json
source benchmarks/device/setup.sh
started=$(date +%s)
precision() {  # name, seconds, build arguments...
    local name=$1 limit=$2; shift 2
    { timeout "$limit" bash -c '
        python3 -m qkan_pack build "$@" --precision auto --max-error 0.05 -o "/tmp/$0" --force \
        && python3 -m qkan_pack warm "/tmp/$0" --precision auto --json > "$RESULTS/warm-$0.json" \
        && python3 -m qkan_pack bench "/tmp/$0" --precision fp32,tf32,bf16,fp16 --iters 100 \
             --repeats 2 --warmup 10 --skip torch_compile --skip qkan_compile_inference \
             --skip predictor_padded --json "$RESULTS/precision-$0.json"' "$name" "$@"; } \
        > "$RESULTS/precision-$name.txt" 2>&1
    echo "== $name exit $?, $(( $(date +%s) - started )) s" | tee -a "$RESULTS/precision-$name.txt"
}
precision bert_base 170 benchmarks/models/bert_base.py --input input_ids:1x128,16x128:int64 \
    --input attention_mask:1x128,16x128:int64
precision resnet50 150 tests/models/zoo.py --config family='"torchvision"' \
    --config name='"resnet50"' --shapes 1x3x224x224,32x3x224x224
precision hqkan_gpt 100 examples/hqkan_gpt.py --shapes 1x128,8x128 --dtype int64
precision qkan64 80 examples/qkan_mlp.py --config width='[64,64,64]' --shapes 1x64,32x64
echo "total $(( $(date +%s) - started )) s"
