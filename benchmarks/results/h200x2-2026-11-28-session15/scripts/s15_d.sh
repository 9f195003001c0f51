#!/bin/bash
# session 15, call D (2 GPUs): host time of a training step by phase (.gpu/transition.py),
# fuser and Inductor, the suite Llama at B=16 (GPU 0) and B=8 (GPU 1), alternating
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/d
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpus.txt
for g in 0 1; do
  ( export CUDA_VISIBLE_DEVICES=$g FUSER_CACHE_DIR=/tmp/fc$g TRITON_CACHE_DIR=/tmp/tc$g
    b=$([ $g = 0 ] && echo 16 || echo 8)
    for impl in fuser inductor fuser; do
      timeout 200 python3 .gpu/transition.py llama $b $impl >> $OUT/d/phases_b$b.txt 2>&1
    done ) &
done
wait
cat $OUT/d/phases_b*.txt | grep -v -i warn
cd $OUT && tar czf d.tgz d && rm -rf d
