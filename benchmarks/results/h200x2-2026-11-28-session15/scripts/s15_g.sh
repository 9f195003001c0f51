#!/bin/bash
# session 15, call G (2 GPUs): after the direct launches of the scatter-adds and the CE
# scale: GPU 0 the host clock of the suite Llama (B=8) and the step by phase (fuser,
# Inductor, fuser); GPU 1 the host time by piece again and the GPU tests of the changes
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/g
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/g/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 150 python3 -m fuser.dynamo.program.census suite:llama --clock --batch 8 --seq 1024 --steps 10 > $OUT/g/clock_llama_b8.txt 2>&1
  for impl in fuser inductor fuser; do
    timeout 150 python3 .gpu/transition.py llama 8 $impl >> $OUT/g/phases_b8.txt 2>&1
  done ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 60 python3 .gpu/scatter_host.py > $OUT/g/scatter_host.txt 2>&1
  timeout 300 python3 -m pytest -q -o addopts="" tests/test_jit_launch.py tests/test_embedding_backward.py tests/test_scatter_few_rows.py tests/test_index_bounds.py tests/test_cross_entropy_one_pass.py tests/test_ce_aligned.py tests/test_profile.py tests/test_program_census.py > $OUT/g/tests.txt 2>&1 ) &
wait
tail -3 $OUT/g/tests.txt; grep FAILED $OUT/g/tests.txt | head
head -6 $OUT/g/scatter_host.txt; tail -1 $OUT/g/scatter_host.txt
grep -E "fuser_embedding|scale_in_place|programs, all|the step" $OUT/g/clock_llama_b8.txt
grep -E "forward call|step start|fw program|loss.backward|bw program|optimizer" $OUT/g/phases_b8.txt
cd $OUT && tar czf g.tgz g && rm -rf g
