#!/bin/bash
# session 20, call A (2 GPUs): the whole model suite at full size (the suite's batches),
# decoders now with use_cache=False (OPT's per-layer cache guards had run 4 of its 12
# layers eagerly), eager, Inductor and fuser, each compiled step profiled (with the
# memory-bound time outside every compiled graph); six models a GPU, each process on its
# own 16 cores and 8 threads
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpus.txt
python3 -c "import torch, triton, transformers, os; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cores', os.cpu_count())" >> $OUT/a/gpus.txt
( export CUDA_VISIBLE_DEVICES=0 FUSER_CACHE_DIR=/tmp/fc0 TRITON_CACHE_DIR=/tmp/tc0 OMP_NUM_THREADS=8
  timeout $((575 - SECONDS)) taskset -c 0-15 python3 -m fuser.suite --size full --profile --models opt,bert,llama,gpt2,vit,mistral --out $OUT/a/suite-g0 > $OUT/a/suite-g0.log 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1 FUSER_CACHE_DIR=/tmp/fc1 TRITON_CACHE_DIR=/tmp/tc1 OMP_NUM_THREADS=8
  timeout $((575 - SECONDS)) taskset -c 16-31 python3 -m fuser.suite --size full --profile --models t5,roberta,qwen2,gemma,gpt-neox,phi --out $OUT/a/suite-g1 > $OUT/a/suite-g1.log 2>&1 ) &
wait
rm -f $OUT/a/*/run-*.json.gz $OUT/a/*/profiles/*/run-*.json.gz
cat $OUT/a/suite-g*/suite.md | grep -E "^\| [a-z]"
grep -h -E "^- " $OUT/a/suite-g*/suite.md
for f in $OUT/a/suite-g*.log; do echo "-- $f"; grep -E "FAIL|Error" $f | head -3; tail -n 1 $f; done
cd $OUT && tar czf a.tgz a && rm -rf a
