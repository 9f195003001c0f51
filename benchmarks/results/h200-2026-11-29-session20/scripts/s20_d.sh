#!/bin/bash
# session 20, call D (1 GPU): random programs through torch.compile(backend="fuser")
# against eager after today's region change (_hidden_relayouts), strict (a region that
# fails is an error): fp32 static, bf16 autocast, and symbolic sizes, new seeds
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/d
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/d/gpus.txt
python3 -m fuser.fuzz.programs --device cuda --seconds 200 --seed 20 --json $OUT/d/static.json > $OUT/d/static.log 2>&1
python3 -m fuser.fuzz.programs --device cuda --seconds 110 --seed 21 --amp --json $OUT/d/amp.json > $OUT/d/amp.log 2>&1
python3 -m fuser.fuzz.programs --device cuda --seconds 110 --seed 22 --dynamic --json $OUT/d/dynamic.json > $OUT/d/dynamic.log 2>&1
for f in $OUT/d/*.log; do echo "-- $f"; tail -n 6 $f; done
cd $OUT && tar czf d.tgz d && rm -rf d
