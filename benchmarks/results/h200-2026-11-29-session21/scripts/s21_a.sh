#!/bin/bash
# session 21, call A (1 GPU): hand-written rotary kernels (how to read a broadcast input and
# a rotate_half), the kernels of the from-positions rotary step (fuser, Inductor, Liger)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
S=benchmarks/results/h200-2026-11-29-session21/scripts
mkdir -p $OUT/a
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/a/gpus.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $OUT/a/gpus.txt
timeout 200 python3 $S/s21_rope_variants.py > $OUT/a/rope_variants.txt 2>&1
cat $OUT/a/rope_variants.txt | grep -v Warn
timeout 150 python3 $S/s21_rope_profile.py > $OUT/a/rope_profile.txt 2>&1
grep -E "^==|calls" $OUT/a/rope_profile.txt | head -60
