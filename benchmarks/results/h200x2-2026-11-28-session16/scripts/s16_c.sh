#!/bin/bash
# session 16, call C (2 GPUs): the whole model suite at full size (the suite's batches),
# eager, Inductor and fuser, each compiled step profiled; six models a GPU
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/c
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/c/gpus.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $OUT/c/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0
  timeout 60 python3 -m pytest -q -o addopts="" tests/test_unit_dims.py tests/test_call_program_edges.py > $OUT/c/tests.txt 2>&1
  timeout $((575 - SECONDS)) python3 -m fuser.suite --size full --profile --models llama,gpt2,bert,vit,mistral,phi --out $OUT/c/suite-g0 > $OUT/c/suite-g0.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1
  timeout $((575 - SECONDS)) python3 -m fuser.suite --size full --profile --models qwen2,gemma,gpt-neox,opt,roberta,t5 --out $OUT/c/suite-g1 > $OUT/c/suite-g1.log 2>&1 ) &
wait
rm -f $OUT/c/*/run-*.json.gz $OUT/c/*/profiles/*/run-*.json.gz
tail -1 $OUT/c/tests.txt
cat $OUT/c/suite-g*/suite.md | grep -E "^\| [a-z]"
grep -h -E "^- " $OUT/c/suite-g*/suite.md
for f in $OUT/c/suite-g*.log; do echo "-- $f"; grep -E "FAIL|Error|error" $f | head -5; tail -n 1 $f; done
cd $OUT && tar czf c.tgz c && rm -rf c
