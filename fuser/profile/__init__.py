"""Where the milliseconds of a training step go: a step profiler for fuser and Inductor.

    p = fuser.profile(step)                      # step(): one whole training step
    print(p.table())                             # time budget, categories, every kernel
    cmp = fuser.profile(step, compare=step2)     # a second backend, lined up
    python -m fuser.profile --compare inductor   # GPT-2 124M, fuser vs Inductor

Modules, in pipeline order: capture (run the steps under torch.profiler), events (read
the trace), regions (fuser's fused regions and their kernels), classify (categories,
bytes, FLOPs), analyse (a StepProfile from the steps), report (tables, JSON), compare
(two profiles lined up), plot (stacked bars), models (the CLI's training steps).
"""

from fuser.profile.compare import Comparison, compare
from fuser.profile.profiler import load_run, profile, save_run
from fuser.profile.report import Row, StepProfile

__all__ = ["Comparison", "Row", "StepProfile", "compare", "load_run", "profile", "save_run"]
