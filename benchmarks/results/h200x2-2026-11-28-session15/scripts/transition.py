"""Session 15: host time of a training step by phase, fuser on the suite Llama (B=16):
Dynamo/AOT before the forward program, the program, after it, the backward's start
(autograd engine, AOT prologue), the backward program, after it, the optimizer."""
import sys
import time

import torch

from fuser.dynamo.program import CallProgram
from fuser.suite import models as suite
from fuser.suite.run import compiled

family, batch, impl = sys.argv[1], int(sys.argv[2]), sys.argv[3]
marks = []
orig = CallProgram.__call__


def call(self, args):
    t0 = time.perf_counter_ns()
    out = orig(self, args)
    marks.append((self.name[:12], t0, time.perf_counter_ns()))
    return out


CallProgram.__call__ = call
model = suite.build(family, "full", "cuda", 0)
kw = suite.batch(family, "full", model, "cuda", 1, dims=(batch, 1024))
step_model, _ = compiled(model, impl)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
rows, coarse = [], []
for i in range(13):
    marks.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = step_model(**kw).loss
    t1 = time.perf_counter_ns()
    loss.backward()
    t2 = time.perf_counter_ns()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter_ns()
    torch.cuda.synchronize()
    t4 = time.perf_counter_ns()
    if i >= 3:
        coarse.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0])
    if i >= 3 and len(marks) == 2:
        (_, f0, f1), (_, b0, b1) = marks
        rows.append([f0 - t0, f1 - f0, t1 - f1, b0 - t1, b1 - b0, t2 - b1, t3 - t2, t4 - t3, t4 - t0])
def _m(rs, j):
    return f"{sum(r[j] for r in rs) / len(rs) / 1e6:.3f}"


names = ["step start -> fw program", "fw program", "fw program -> loss returned",
         "loss.backward() -> bw program", "bw program", "bw program -> backward returned",
         "optimizer step + zero_grad", "synchronize (GPU still busy)", "step (wall)"]
print(f"{impl} {family} B={batch}: forward call {_m(coarse, 0)}, backward call {_m(coarse, 1)}, "
      f"optimizer {_m(coarse, 2)}, sync {_m(coarse, 3)}, step {_m(coarse, 4)} ms")
if not rows:
    sys.exit(0)
print(f"{family} B={batch}: host time by phase, mean of {len(rows)} steps (ms)")
for j, n in enumerate(names):
    vals = sorted(r[j] / 1e6 for r in rows)
    print(f"  {n:<34} {sum(vals) / len(vals):7.3f}  (min {vals[0]:.3f}, max {vals[-1]:.3f})")
