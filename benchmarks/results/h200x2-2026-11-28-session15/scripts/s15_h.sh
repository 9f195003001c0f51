#!/bin/bash
# session 15, call H (2 GPUs): the direct launches checked: the suite's Llama (B=8) eager
# and fuser, parity of every gradient (GPU 0); the GPU tests of jit_launch (GPU 1)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/h
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/h/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 200 python3 -m fuser.suite --size full --impls eager,fuser --models llama --out $OUT/h/suite-llama > $OUT/h/suite-llama.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 120 python3 -m pytest -q -o addopts="" tests/test_jit_launch.py tests/test_cast_groups.py tests/test_cast_groups_adversarial.py > $OUT/h/tests.txt 2>&1 ) &
wait
tail -2 $OUT/h/tests.txt; grep FAILED $OUT/h/tests.txt | head
grep -E "^\| [a-z]" $OUT/h/suite-llama/suite.md; tail -2 $OUT/h/suite-llama.log
cd $OUT && tar czf h.tgz h && rm -rf h
