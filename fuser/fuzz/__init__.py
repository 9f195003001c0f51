"""Random-fusion fuzzing: fuser against eager ATen on generated fusions.

- generator.py: hypothesis strategies for valid fusions (`fuzz_cases(CPU | GPU)`)
- case.py: a case as data; building it, its inputs in a layout, its runnable repro
- check.py: references (eager, float64, perturbed) and the comparison
- runner.py: one case (`check_case`), hypothesis batches against a time budget
- known.py: bugs found and not yet fixed, each with its strict-xfail test
- __main__.py: `python -m fuser.fuzz --seconds 600 --seed N [--json out.json]`
"""
