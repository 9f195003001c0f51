#!/bin/bash
# session 15, call E (2 GPUs): issue 21's Llama (B=16) in the suite: eager, Inductor and
# fuser, parity, memory, the profiled step with the corrected categories (GPU 0); the GPU
# tests of today's changed files, then the suite's gpt2 and gemma with profiles (GPU 1)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/e
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/e/gpus.txt
python3 -c "import transformers; print('transformers', transformers.__version__)" >> $OUT/e/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 520 python3 -m fuser.suite --size full --batch 16 --profile --models llama --out $OUT/e/suite-llama-b16 > $OUT/e/suite-llama-b16.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 150 python3 -m pytest -q -o addopts="" tests/test_profile.py tests/test_program_census.py tests/test_cast_groups_adversarial.py tests/test_cast_groups.py > $OUT/e/tests.txt 2>&1
  timeout $((520 - SECONDS)) python3 -m fuser.suite --size full --profile --models gpt2,gemma --out $OUT/e/suite-g1 > $OUT/e/suite-g1.log 2>&1 ) &
wait
rm -f $OUT/e/*/run-*.json.gz $OUT/e/*/profiles/*/run-*.json.gz
tail -2 $OUT/e/tests.txt
cat $OUT/e/suite-*/suite.md 2>/dev/null | grep -E "^\| [a-z]|^- "
grep -h -E "coverage|GPU idle|copies/fills  " $OUT/e/suite-*/profiles/*/profile.txt 2>/dev/null | head -20
tail -3 $OUT/e/suite-*.log
cd $OUT && tar czf e.tgz e && rm -rf e
