"""Random PyTorch programs through torch.compile(backend="fuser"), against eager.

Where fuser.fuzz draws fusions in fuser's own IR, this draws what a user writes: a
function of tensors, compiled by Dynamo, split by AOTAutograd, rewritten by fuser's graph
passes (views, sums, casts, cross-entropy...) and lowered. It checks those passes, the call
programs and the kernels together, forward and backward.

- builder.py: the program being drawn (inputs, lines, live values and their shapes)
- ops.py, layers.py: the ops a chain is grown from
- blocks.py: transformer programs drawn whole (one seed in five)
- generate.py: `draw_program(seed)`
- noise.py: float64 runs with float32-sized errors at every op (the rounding noise)
- judge.py: eager float64, eager float32, fuser (three calls), aot_eager where fuser is off
- __main__.py: `python -m fuser.fuzz.programs --seconds 600 --seed N [--json out.json]`
"""
