#!/bin/bash
# session 21, call B (1 GPU): after the outer-product rewrite, the sibling merge and the
# tangent strides: GPU tests, the rotary step's kernels (both layouts), issue 21's rotary
# rows, more hand-written variants (q and k in one launch), the suite's Llama at B=8
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
S=benchmarks/results/h200-2026-11-29-session21/scripts
mkdir -p $OUT/b
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/b/gpus.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $OUT/b/gpus.txt
timeout 150 python3 -m pytest -q -o addopts="" -p no:logging tests/test_rotary_angles.py tests/test_rotary.py tests/test_hidden_relayout.py > $OUT/b/tests.txt 2>&1
tail -3 $OUT/b/tests.txt
timeout 60 python3 $S/s21_rope_profile.py contiguous > $OUT/b/rope_profile_contiguous.txt 2>&1
timeout 60 python3 $S/s21_rope_profile.py transposed > $OUT/b/rope_profile_transposed.txt 2>&1
grep -E "^==|calls|^layout" $OUT/b/rope_profile_*.txt | head -60
timeout 100 python3 $S/s21_rope_variants.py > $OUT/b/rope_variants.txt 2>&1
grep -v Warn $OUT/b/rope_variants.txt
timeout $((420 - SECONDS)) python3 benchmarks/embedding_bwd_bench.py --only rotary --out $OUT/b/rotary.json > $OUT/b/rotary.log 2>&1
grep '"op"' $OUT/b/rotary.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if 'op' in r and 'impl' in r:
        print(r['op'], '|', r['impl'], '|', r.get('gbps'), 'GB/s', r.get('pct_copy'), '% | wall', r.get('wall_ms'), 'gpu', r.get('ms'), 'host', r.get('host_ms'), r.get('error', '')[:80])
"
grep "copy ceiling" $OUT/b/rotary.log
timeout $((585 - SECONDS)) python3 -m fuser.suite --size full --profile --models llama --out $OUT/b/suite-llama > $OUT/b/suite-llama.log 2>&1
rm -f $OUT/b/*/run-*.json.gz $OUT/b/*/profiles/*/run-*.json.gz
cat $OUT/b/suite-*/suite.md | grep -E "^\| [a-z]"
tail -n 2 $OUT/b/suite-llama.log
cd $OUT && tar czf b.tgz b && rm -rf b
