"""The suite's Llama at full size, one training step under fuser at batch B (bf16
autocast, fused AdamW as the suite), then fuser.explain written to argv[2]."""
import sys, torch, fuser
from fuser.suite import models
b, out = int(sys.argv[1]), sys.argv[2]
name = sys.argv[3] if len(sys.argv) > 3 else "llama"
m = models.build(name, "full", "cuda")
_, n = models.shape(models.FAMILIES[name], "full", "cuda")
kw = models.batch(name, "full", m, "cuda", 0, dims=(b, n))
c = torch.compile(m, backend="fuser")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
for _ in range(2):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = c(**kw).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
open(out, "w").write(fuser.explain(c))
print(name, "B", b, "loss", float(loss))
