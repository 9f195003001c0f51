#!/bin/bash
# session 16, call A (2 GPUs): the suite's Llama at B=16 (eager, Inductor, fuser, profiled)
# with today's code (GPU 0, after the GPU tests of today's changes) and with session 15's
# code (.gpu/base, GPU 1, after the full-size explain of today's code)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpus.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $OUT/a/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 150 python3 -m pytest -q -o addopts="" tests/test_middle_sums.py tests/test_unit_dims.py tests/test_cat_views.py tests/test_rotary.py tests/test_check_flag.py > $OUT/a/tests.txt 2>&1
  timeout $((555 - SECONDS)) python3 -m fuser.suite --size full --batch 16 --profile --models llama --out $OUT/a/new-llama-b16 > $OUT/a/new-llama-b16.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout 120 python3 .gpu/llama_explain.py 16 $OUT/a/llama_b16_explain.txt > $OUT/a/llama_explain.log 2>&1
  export PYTHONPATH=$PWD/.gpu/base FUSER_CACHE_DIR=/tmp/fc2
  python3 -c "import fuser; print(fuser.__file__)" > $OUT/a/base_path.txt 2>&1
  timeout $((555 - SECONDS)) python3 -m fuser.suite --size full --batch 16 --profile --models llama --out $OUT/a/base-llama-b16 > $OUT/a/base-llama-b16.log 2>&1 ) &
wait
rm -f $OUT/a/*/run-*.json.gz $OUT/a/*/profiles/*/run-*.json.gz
tail -2 $OUT/a/tests.txt; cat $OUT/a/base_path.txt
for d in new base; do echo "== $d"; grep -E "^\| llama" $OUT/a/$d-llama-b16/suite.md; done
grep -h -E "coverage|GPU idle|copies/fills  " $OUT/a/*/profiles/*/profile.txt 2>/dev/null | head -20
grep -n "ATen fallback" -A1 $OUT/a/llama_b16_explain.txt | head -20
tail -3 $OUT/a/*.log
cd $OUT && tar czf a.tgz a && rm -rf a
