"""Session 20, call C: the kernels of one rotary forward+backward (issue 21's shapes,
q/k transposed as transformers makes them), fuser against Liger: name, GPU us, calls."""

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from embedding_bwd_bench import _apply, _cos_sin, _liger  # noqa: E402

B, HQ, HK, T, D = 8, 32, 8, 2048, 128
bf = torch.bfloat16
q = torch.randn(B, T, HQ, D, device="cuda", dtype=bf).transpose(1, 2).requires_grad_(True)
k = torch.randn(B, T, HK, D, device="cuda", dtype=bf).transpose(1, 2).requires_grad_(True)
gq, gk = torch.randn_like(q), torch.randn_like(k)
inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
pos = torch.arange(T, device="cuda")[None].expand(B, T)
cos, sin = _cos_sin(inv, pos, bf)
impls = {"fuser": torch.compile(_apply, backend="fuser")}
lig = _liger()
if lig is not None:
    impls["liger"] = lig
for name, f in impls.items():
    for _ in range(3):
        torch.autograd.grad(f(q, k, cos, sin), (q, k), (gq, gk))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.autograd.grad(f(q, k, cos, sin), (q, k), (gq, gk))
        torch.cuda.synchronize()
    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name][0] += e.device_time / 5
            agg[e.name][1] += 1
    print(f"== {name}: {sum(v[0] for v in agg.values()):.1f} us a step")
    for n, (us, c) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"  {us:8.1f} us  {c // 5:3d} calls  {n[:110]}")
if "fuser" in impls:
    from fuser.dynamo.explain import explain

    print(explain(impls["fuser"]))
