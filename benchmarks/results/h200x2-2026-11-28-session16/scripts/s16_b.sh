#!/bin/bash
# session 16, call B (2 GPUs): the suite's Llama and GPT-2 at B=16 (eager, Inductor, fuser,
# profiled) with today's code (GPU 0, after the GPU tests of today's changes and the
# Llama's full-size explain) and with session 15's code (.gpu/base via base_run.py, GPU 1)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/b
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpus.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $OUT/b/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 150 python3 -m pytest -q -o addopts="" tests/test_middle_sums.py tests/test_unit_dims.py tests/test_cat_views.py tests/test_call_program.py tests/test_call_program_edges.py > $OUT/b/tests.txt 2>&1
  timeout 100 python3 .gpu/llama_explain.py 16 $OUT/b/llama_b16_explain.txt > $OUT/b/llama_explain.log 2>&1
  for m in llama gpt2; do
    timeout $((560 - SECONDS)) python3 -m fuser.suite --size full --batch 16 --profile --models $m --out $OUT/b/new-$m-b16 > $OUT/b/new-$m-b16.log 2>&1
  done ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  for m in llama gpt2; do
    timeout $((560 - SECONDS)) python3 .gpu/base_run.py fuser.suite --size full --batch 16 --profile --models $m --out $OUT/b/base-$m-b16 > $OUT/b/base-$m-b16.log 2>&1
  done ) &
wait
rm -f $OUT/b/*/run-*.json.gz $OUT/b/*/profiles/*/run-*.json.gz
tail -2 $OUT/b/tests.txt; grep -h "fuser from" $OUT/b/base-*.log
for d in new-llama base-llama new-gpt2 base-gpt2; do echo "== $d"; grep -E "^\| (llama|gpt2)" $OUT/b/$d-b16/suite.md; grep -h -E "fused-op coverage|copies/fills  |GPU idle" $OUT/b/$d-b16/profiles/*-fuser/profile.txt; done
grep -c "ATen fallback" $OUT/b/llama_b16_explain.txt; grep -A1 "ATen fallback" $OUT/b/llama_b16_explain.txt | sort | uniq -c | head
for f in $OUT/b/*.log; do echo "-- $f"; tail -n 2 $f; done
cd $OUT && tar czf b.tgz b && rm -rf b
