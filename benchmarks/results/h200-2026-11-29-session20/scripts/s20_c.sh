#!/bin/bash
# session 20, call C (1 GPU): call B again with the fix of _hidden_relayouts (call B's
# fuser rows ran regions on ATen after an IndexError), plus the kernels of fuser's and
# Liger's rotary step in transformers' transposed layout
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
mkdir -p $OUT/c
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/c/gpus.txt
python3 -c "import torch, triton, transformers, os; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cores', os.cpu_count())" >> $OUT/c/gpus.txt
timeout 150 python3 -m pytest -q -o addopts="" tests/test_hidden_relayout.py tests/test_rotary.py tests/test_tidy.py tests/test_profile.py > $OUT/c/tests.txt 2>&1
tail -3 $OUT/c/tests.txt
timeout 100 python3 benchmarks/results/h200-2026-11-29-session20/scripts/s20_rope_kernels.py > $OUT/c/rope_kernels.txt 2>&1
head -40 $OUT/c/rope_kernels.txt
timeout $((330 - SECONDS)) python3 benchmarks/embedding_bwd_bench.py --only rotary --out $OUT/c/rotary.json > $OUT/c/rotary.log 2>&1
grep '"op"' $OUT/c/rotary.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if 'op' in r and 'impl' in r:
        print(r['op'], '|', r['impl'], '|', r.get('gbps'), 'GB/s', r.get('pct_copy'), '% | wall', r.get('wall_ms'), 'gpu', r.get('ms'), 'host', r.get('host_ms'), r.get('error', '')[:80])
"
grep "copy ceiling" $OUT/c/rotary.log
timeout $((450 - SECONDS)) python3 -m fuser.suite --size full --profile --models vit --out $OUT/c/suite-vit > $OUT/c/suite-vit.log 2>&1
timeout $((585 - SECONDS)) python3 -m fuser.suite --size full --batch 16 --profile --models llama --out $OUT/c/suite-llama16 > $OUT/c/suite-llama16.log 2>&1
rm -f $OUT/c/*/run-*.json.gz $OUT/c/*/profiles/*/run-*.json.gz
cat $OUT/c/suite-*/suite.md | grep -E "^\| [a-z]"
for f in $OUT/c/suite-*.log; do echo "-- $f"; grep -E "FAIL|Error|fell back|falls back" $f | head -3; tail -n 1 $f; done
cd $OUT && tar czf c.tgz c && rm -rf c
