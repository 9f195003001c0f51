"""Random-fusion fuzzing: fuser against eager ATen on generated fusions.

- generator.py: hypothesis strategies for valid fusions (`fuzz_cases(CPU | GPU)`): the
  domain and the sequence of patterns
- patterns.py: the patterns of ops a case is drawn from (each group's ops and their
  domains from the frontend op table, fuser/frontend/registry.py), and the draft case
  they grow
- case.py: a case as data; building it, its inputs in a layout, its runnable repro
- reference.py: the float64 references (eager's roundings, perturbed, comparisons turned)
- check.py: tolerances and the comparison of fuser's outputs against the references
- gemm.py, gemm_check.py: GEMM + pointwise cases (a matmul with random work around it)
  through the GEMM template's matcher and kernels, against eager and float64
- runner.py: one case (`check_case`), hypothesis batches against a time budget
- known.py: bugs found and not yet fixed, each with its strict-xfail test
- __main__.py: `python -m fuser.fuzz --seconds 600 --seed N [--json out.json]`
"""
