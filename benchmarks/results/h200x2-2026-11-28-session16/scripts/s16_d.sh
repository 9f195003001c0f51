#!/bin/bash
# session 16, call D (2 GPUs): the whole model suite at full size (the suite's batches)
# after tidy.py (casts before views, merged repeats), eager, Inductor and fuser, each
# compiled step profiled; six models a GPU, each process on its own 16 cores and 8
# threads (host-bound steps: in call c two processes shared the host's cores)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/d
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpus.txt
python3 -c "import torch, triton, transformers, os; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cores', os.cpu_count())" >> $OUT/d/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0 OMP_NUM_THREADS=8
  timeout 40 taskset -c 0-15 python3 -m pytest -q -o addopts="" tests/test_tidy.py > $OUT/d/tests.txt 2>&1
  timeout $((570 - SECONDS)) taskset -c 0-15 python3 -m fuser.suite --size full --profile --models bert,llama,gpt2,vit,mistral,phi --out $OUT/d/suite-g0 > $OUT/d/suite-g0.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1 OMP_NUM_THREADS=8
  timeout $((570 - SECONDS)) taskset -c 16-31 python3 -m fuser.suite --size full --profile --models t5,roberta,qwen2,gemma,gpt-neox,opt --out $OUT/d/suite-g1 > $OUT/d/suite-g1.log 2>&1 ) &
wait
rm -f $OUT/d/*/run-*.json.gz $OUT/d/*/profiles/*/run-*.json.gz
tail -1 $OUT/d/tests.txt
cat $OUT/d/suite-g*/suite.md | grep -E "^\| [a-z]"
grep -h -E "^- " $OUT/d/suite-g*/suite.md
for f in $OUT/d/suite-g*.log; do echo "-- $f"; grep -E "FAIL|Error" $f | head -3; tail -n 1 $f; done
cd $OUT && tar czf d.tgz d && rm -rf d
