#!/bin/bash
# session 21, call D (1 GPU): the pointwise schedule space of the rotary kernels (the
# bench's eager reference now in float32, as the fusion computes), and random programs
# on the GPU after the tangent-strides change (every backward's tangents traced anew)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/d
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpus.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $OUT/d/gpus.txt
timeout 240 python3 -m fuser.bench --ops rope_fwd,rope_bwd --hidden 64,128 --sweep --sweep-ops rope_fwd,rope_bwd --baselines eager,compile --out $OUT/d/sweep > $OUT/d/sweep.log 2>&1
grep -vE "cases:|^\s*$" $OUT/d/sweep.log | grep -E "fuser-|compile|eager|regret|worst|best|FAIL" | head -30
python3 - <<'PY' > $OUT/d/sweep_table.txt 2>&1
import json, collections, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/d/sweep/results.jsonl")]
by = collections.defaultdict(list)
for r in rows:
    if r["impl"].startswith("sweep-") and r.get("ms"):
        by[(r["op"], r["shape"])].append((r["ms"], r.get("schedule", "")))
for k, v in by.items():
    v.sort()
    print(k)
    for ms, s in v[:8]:
        print(f"   {ms*1e3:7.1f} us  {s}")
PY
cat $OUT/d/sweep_table.txt
timeout $((560 - SECONDS)) python3 -m fuser.fuzz.programs --device cuda --seconds $((500 - SECONDS)) --seed 23000000 --amp --json $OUT/d/fuzz_amp.json > $OUT/d/fuzz_amp.txt 2>&1
tail -5 $OUT/d/fuzz_amp.txt
cd $OUT && tar czf d.tgz d && rm -rf d
