#!/bin/bash
# session 15, call A (2 GPUs): baselines. GPU 0: issue 20's training kernels, every impl
# (Liger carried). GPU 1: session 14's unverified GPU tests, a layout fuzz campaign (both
# backends), then the issue-21 Llama (B=16) against Inductor.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpus.txt
python3 -c "import torch, triton, transformers, liger_kernel; print(torch.__version__, triton.__version__, transformers.__version__)" >> $OUT/a/gpus.txt 2>&1
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 540 python3 -m fuser.bench --suite training --impls eager,compile,liger,fuser-triton,fuser-cuda --time-limit 470 --out $OUT/a/training > $OUT/a/training.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 150 python3 -m pytest -q -o addopts="" tests/test_cast_groups.py tests/test_cast_groups_adversarial.py tests/test_flatten.py tests/test_fuzz_found_layout.py tests/test_call_program.py > $OUT/a/tests.txt 2>&1
  timeout 100 python3 -m fuser.fuzz --focus layout --seconds 70 --seed 15 --backends triton,cuda --json $OUT/a/fuzz.json > $OUT/a/fuzz.txt 2>&1
  timeout $((560 - SECONDS)) python3 -m fuser.profile --model suite:llama --batch 16 --compare inductor --out $OUT/a/llama-b16 > $OUT/a/llama-b16.txt 2>&1 ) &
wait
rm -f $OUT/a/*/run-*.json.gz
tail -3 $OUT/a/tests.txt; tail -4 $OUT/a/fuzz.txt
grep -E "^  step |GPU busy|GPU idle|copies/fills  |coverage" $OUT/a/llama-b16.txt | head -12
python3 -m fuser.bench.report $OUT/a/training/results.jsonl 2>&1 | tail -60
cd $OUT && tar czf a.tgz a && rm -rf a
