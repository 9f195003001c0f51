#!/bin/bash
# session 15, call I (1 GPU): the embedding backward's tests on the GPU (direct launches)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/i
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/i/gpus.txt
timeout 150 python3 -m pytest -q -o addopts="" tests/test_embedding_backward.py tests/test_jit_launch.py > $OUT/i/tests.txt 2>&1
tail -2 $OUT/i/tests.txt; grep -E "^FAILED|^E  " $OUT/i/tests.txt | head -20
cd $OUT && tar czf i.tgz i && rm -rf i
