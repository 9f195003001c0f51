#!/bin/bash
# session 16, call E (one H200): today's changed tests on the GPU, final code
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p $OUT/e
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/e/gpus.txt
timeout 170 python3 -m pytest -q -o addopts="" tests/test_tidy.py tests/test_cast_groups.py tests/test_middle_sums.py tests/test_unit_dims.py tests/test_cat_views.py tests/test_call_program_edges.py tests/test_scatter_few_rows.py tests/test_index_bounds.py > $OUT/e/tests.txt 2>&1
grep -E "passed|failed|FAILED" $OUT/e/tests.txt | tail -12
