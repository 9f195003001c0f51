#!/bin/bash
# session 21, call C (1 GPU): where the Llama step's host time goes (the call programs'
# clock, beside GPT-2's), and the pointwise schedule space around the rotary kernels
# (every tile and warp count timed: the heuristic's regret)
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/c
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/c/gpus.txt
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $OUT/c/gpus.txt
timeout 280 python3 -m fuser.bench --ops rope_fwd,rope_bwd,gelu_fwd,gelu_bwd --sweep --sweep-ops rope_fwd,rope_bwd,gelu_fwd,gelu_bwd --baselines eager,compile --out $OUT/c/sweep > $OUT/c/sweep.log 2>&1
grep -vE "cases:|^\s*$" $OUT/c/sweep.log | grep -E "fuser-|compile|eager|regret|worst|best" | head -30
timeout $((450 - SECONDS)) python3 -m fuser.dynamo.program.census suite:llama --clock --batch 8 --seq 1024 > $OUT/c/census-llama.txt 2>&1
head -45 $OUT/c/census-llama.txt
timeout $((580 - SECONDS)) python3 -m fuser.dynamo.program.census suite:gpt2 --clock --batch 8 --seq 1024 > $OUT/c/census-gpt2.txt 2>&1
head -30 $OUT/c/census-gpt2.txt
cd $OUT && tar czf c.tgz c && rm -rf c
