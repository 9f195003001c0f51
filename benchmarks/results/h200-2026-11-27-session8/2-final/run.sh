#!/bin/bash
# session 8 final: GPU checks of the launchers and the leaner call programs, T5/BERT at full size
source .gpu/setup.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpus.txt
python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)" > $OUT/versions.txt
timeout 150 python3 -m pytest -o addopts="" -q tests/test_launchers_gpu.py -k "triton-c or static" 2>&1 | tail -2
timeout 60 python3 .gpu/cg_diag.py 2>&1 | grep -v Warn | tail -6
timeout 100 python3 -m fuser.dynamo.program.census suite:t5 --device cuda > $OUT/census_t5.txt 2>&1; tail -25 $OUT/census_t5.txt
timeout 280 python3 -m fuser.suite --size full --models t5,bert --out $OUT/suite > $OUT/suite.log 2>&1
grep -E "^\| |geomean|Error|error" $OUT/suite.log | head -20
