# ruff: noqa: E501, E702  (a record of the script as it was run)
"""cProfile of a suite model's steady training steps (fuser vs Inductor): where the host time goes."""

import cProfile
import io
import pstats
import sys
import time

import torch

from fuser.suite import models as suite
from fuser.suite.run import compiled

name, impl = sys.argv[1], sys.argv[2]
m = suite.build(name, "full", "cuda")
kw = suite.batch(name, "full", m, "cuda", 1)
sm, _ = compiled(m, impl)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = sm(**kw).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(4):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(5):
    step()
torch.cuda.synchronize()
print(f"{name} {impl}: {(time.perf_counter() - t0) / 5 * 1e3:.1f} ms/step unprofiled")
pr = cProfile.Profile()
pr.enable()
for _ in range(3):
    step()
torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
ps = pstats.Stats(pr, stream=s)
ps.sort_stats("tottime").print_stats(35)
ps.sort_stats("cumulative").print_stats(45)
print(s.getvalue())
