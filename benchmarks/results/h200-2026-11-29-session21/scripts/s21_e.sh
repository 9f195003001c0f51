#!/bin/bash
# session 21, call E (1 GPU): after the pointwise tile change (1024 elements, one vector
# a thread): the heuristic's regret over the pointwise space (bf16 and fp32), issue 21's
# rotary rows beside torch.compile and Liger, the embedding backward's host time, the
# suite's Llama at B=8
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
S=benchmarks/results/h200-2026-11-29-session21/scripts
mkdir -p $OUT/e
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/e/gpus.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $OUT/e/gpus.txt
timeout 100 python3 -m fuser.bench --ops rope_fwd,rope_bwd,gelu_fwd,gelu_bwd --sweep --sweep-ops rope_fwd,rope_bwd,gelu_fwd,gelu_bwd --baselines compile --out $OUT/e/sweep-bf16 > $OUT/e/sweep-bf16.log 2>&1
timeout 60 python3 -m fuser.bench --ops gelu_fwd,gelu_bwd --dtype fp32 --sweep --sweep-ops gelu_fwd,gelu_bwd --baselines compile --out $OUT/e/sweep-fp32 > $OUT/e/sweep-fp32.log 2>&1
grep -hE "regret|heuristic|compile   |fuser-triton|FAIL" $OUT/e/sweep-*.log | grep -v "cases:" | head -30
timeout 20 python3 $S/s21_scatter_host.py > $OUT/e/scatter_host.txt 2>&1
cat $OUT/e/scatter_host.txt
timeout 130 python3 benchmarks/embedding_bwd_bench.py --only rotary --out $OUT/e/rotary.json > $OUT/e/rotary.log 2>&1
grep '"op"' $OUT/e/rotary.log | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l)
    if 'op' in r and 'impl' in r:
        print(r['op'], '|', r['impl'], '|', r.get('gbps'), 'GB/s', r.get('pct_copy'), '% | wall', r.get('wall_ms'), 'gpu', r.get('ms'), 'host', r.get('host_ms'), r.get('error', '')[:80])
"
timeout $((470 - SECONDS)) python3 -m fuser.suite --size full --profile --models llama --out $OUT/e/suite-llama > $OUT/e/suite-llama.log 2>&1
rm -f $OUT/e/*/run-*.json.gz $OUT/e/*/profiles/*/run-*.json.gz
cat $OUT/e/suite-*/suite.md | grep -E "^\| [a-z]"
tail -n 2 $OUT/e/suite-llama.log
cd $OUT && tar czf e.tgz e && rm -rf e
