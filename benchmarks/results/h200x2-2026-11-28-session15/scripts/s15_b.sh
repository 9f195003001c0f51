#!/bin/bash
# session 15, call B (2 GPUs): where the call programs' host time goes (FUSER_PROGRAM_CLOCK):
# GPU 0 the suite Llama at B=16 (issue 21's), GPU 1 GPT-2 B=16, ATen call paths, GPU tests
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/b
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 300 python3 -m fuser.dynamo.program.census suite:llama --clock --batch 16 --seq 1024 --steps 10 > $OUT/b/clock_llama_b16.txt 2>&1
  timeout 200 python3 -m fuser.dynamo.program.census suite:llama --clock --batch 8 --seq 1024 --steps 10 > $OUT/b/clock_llama_b8.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 60 python3 .gpu/aten_paths.py > $OUT/b/aten_paths.txt 2>&1
  timeout 120 python3 -m pytest -q -o addopts="" tests/test_cast_groups_adversarial.py tests/test_program_census.py > $OUT/b/tests.txt 2>&1
  timeout 250 python3 -m fuser.dynamo.program.census gpt2 --clock --batch 16 --seq 1024 --steps 10 > $OUT/b/clock_gpt2_b16.txt 2>&1 ) &
wait
tail -2 $OUT/b/tests.txt; cat $OUT/b/aten_paths.txt
for f in $OUT/b/clock_*.txt; do echo "== $f"; grep -v Warning $f | head -45; done
cd $OUT && tar czf b.tgz b && rm -rf b
