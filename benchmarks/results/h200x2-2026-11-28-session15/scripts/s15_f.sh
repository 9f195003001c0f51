#!/bin/bash
# session 15, call F (2 GPUs): issue 19's harnesses on today's code (GPU 0: gpt2_bench
# B=16 at V=50257 and V=50304; GPU 1: nanoGPT B=16), the host time of the embedding
# backward and the CE scale by piece, the GPU tests of today's test fixes
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/f
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/f/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 220 python3 benchmarks/gpt2_bench.py --impls eager,inductor,fuser --out $OUT/f/gpt2_b16.jsonl --profile-steps 0 > $OUT/f/gpt2_b16.txt 2>&1
  timeout 220 python3 benchmarks/gpt2_bench.py --impls eager,inductor,fuser --vocab 50304 --out $OUT/f/gpt2_b16_v50304.jsonl --profile-steps 0 > $OUT/f/gpt2_b16_v50304.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 60 python3 .gpu/scatter_host.py > $OUT/f/scatter_host.txt 2>&1
  timeout 120 python3 -m pytest -q -o addopts="" tests/test_profile.py tests/test_program_census.py > $OUT/f/tests.txt 2>&1
  timeout 220 python3 benchmarks/nanogpt_bench.py --out $OUT/f/nanogpt_b16.jsonl > $OUT/f/nanogpt_b16.txt 2>&1 ) &
wait
tail -1 $OUT/f/tests.txt
head -8 $OUT/f/scatter_host.txt; grep -A12 "Ordered by" $OUT/f/scatter_host.txt | tail -10; tail -1 $OUT/f/scatter_host.txt
for f in $OUT/f/gpt2_b16.txt $OUT/f/gpt2_b16_v50304.txt $OUT/f/nanogpt_b16.txt; do echo "== $f"; grep -E "ms/step|speedup_vs_ind|memory_vs_ind|FAIL|parity\"" $f | tail -8; done
cd $OUT && tar czf f.tgz f && rm -rf f
