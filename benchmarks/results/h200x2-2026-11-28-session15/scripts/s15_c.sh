#!/bin/bash
# session 15, call C (2 GPUs): where the GPU idles (the profiler's new gap listing), fuser
# beside Inductor in one process: GPU 0 the suite Llama at B=16, GPU 1 GPT-2 B=16
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/c
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/c/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 400 python3 -m fuser.profile --model suite:llama --batch 16 --compare inductor --out $OUT/c/llama-b16 > $OUT/c/llama-b16.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 400 python3 -m fuser.profile --model gpt2 --compare inductor --out $OUT/c/gpt2 > $OUT/c/gpt2.txt 2>&1 ) &
wait
rm -f $OUT/c/*/run-*.json.gz
for f in $OUT/c/llama-b16.txt $OUT/c/gpt2.txt; do echo "== $f"; grep -E "^\[|^  step |GPU busy|GPU idle|idle stretches|^    .* us at |launches by" $f; done
cd $OUT && tar czf c.tgz c && rm -rf c
