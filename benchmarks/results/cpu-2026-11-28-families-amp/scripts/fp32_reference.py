import sys, torch
sys.path.insert(0, "benchmarks")
import families as F
from fuser.dynamo import FuserBackend
import fuser
spec = F.BY_NAME[sys.argv[1]]
base = F.build(spec, torch.float32)
import copy
res = {}
for be in ("ref", "eager", "fuser"):
    torch._dynamo.reset()
    m = copy.deepcopy(base).train()
    fb = FuserBackend(strict=True, check=(len(sys.argv) > 2))
    f = m if be in ("eager", "ref") else torch.compile(m, backend=fb)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=be != "ref"):
        out = f(**F.inputs(spec, m, seed=1, labels=True))
    out.loss.backward()
    res[be] = (out.loss.item(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
r = res["ref"][1]
for be in ("eager", "fuser"):
    g = res[be][1]
    errs = [(g[n]-r[n]).norm().item()/(r[n].norm().item()+1e-12) for n in r]
    print(be, "loss", res[be][0], "vs fp32", res["ref"][0], "grad err vs fp32: max %.2e median %.2e" % (max(errs), sorted(errs)[len(errs)//2]))
