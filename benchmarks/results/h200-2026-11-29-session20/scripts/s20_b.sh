#!/bin/bash
# session 20, call B (1 GPU): the new tests on a GPU; issue 21's rotary rows timed as GPU
# work (spin-queued, as issue 20's training bench) beside the events-only figure, with
# Liger; ViT's step after the hidden-relayout copy kernel (region.py); the suite's Llama at
# B=16 (issue 21's Llama target)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
mkdir -p $OUT/b
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpus.txt
python3 -c "import torch, triton, transformers, os; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cores', os.cpu_count())" >> $OUT/b/gpus.txt
timeout 120 python3 -m pytest -q -o addopts="" tests/test_hidden_relayout.py tests/test_rotary.py tests/test_profile.py -k "relayout or round_trip or gradient or outside or rotary" > $OUT/b/tests.txt 2>&1
tail -3 $OUT/b/tests.txt
timeout $((330 - SECONDS)) python3 benchmarks/embedding_bwd_bench.py --only rotary --out $OUT/b/rotary.json > $OUT/b/rotary.log 2>&1
grep '"op"' $OUT/b/rotary.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    print(r['op'], '|', r['impl'], '|', r.get('gbps'), 'GB/s', r.get('pct_copy'), '% | wall', r.get('wall_ms'), 'gpu', r.get('ms'), 'host', r.get('host_ms'), r.get('error', '')[:80])
"
grep "copy ceiling" $OUT/b/rotary.log
timeout $((470 - SECONDS)) python3 -m fuser.suite --size full --profile --models vit --out $OUT/b/suite-vit > $OUT/b/suite-vit.log 2>&1
timeout $((585 - SECONDS)) python3 -m fuser.suite --size full --batch 16 --profile --models llama --out $OUT/b/suite-llama16 > $OUT/b/suite-llama16.log 2>&1
rm -f $OUT/b/*/run-*.json.gz $OUT/b/*/profiles/*/run-*.json.gz
cat $OUT/b/suite-*/suite.md | grep -E "^\| [a-z]"
for f in $OUT/b/suite-*.log; do echo "-- $f"; grep -E "FAIL|Error" $f | head -3; tail -n 1 $f; done
cd $OUT && tar czf b.tgz b && rm -rf b
