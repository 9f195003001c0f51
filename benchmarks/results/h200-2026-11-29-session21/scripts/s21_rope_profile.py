"""Session 21, call A: the kernels of one rotary forward+backward with cos/sin from
positions (issue 21's bar), q/k contiguous or (argument `transposed`) as transformers makes
them, for fuser, Inductor and Liger: GPU us a step, by kernel, and fuser's explain."""

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
from embedding_bwd_bench import _apply, _cos_sin, _liger  # noqa: E402

B, HQ, HK, T, D = 8, 32, 8, 2048, 128
bf = torch.bfloat16
LAYOUT = sys.argv[1] if len(sys.argv) > 1 else "contiguous"
q = torch.randn(B, T, HQ, D, device="cuda", dtype=bf).transpose(1, 2)
k = torch.randn(B, T, HK, D, device="cuda", dtype=bf).transpose(1, 2)
if LAYOUT == "contiguous":
    q, k = q.contiguous(), k.contiguous()
q.requires_grad_(True)
k.requires_grad_(True)
print("layout", LAYOUT, "q strides", q.stride())
gq, gk = torch.randn_like(q), torch.randn_like(k)
inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
pos = torch.arange(T, device="cuda")[None].expand(B, T)


def from_positions(q, k, inv, pos):
    c, s = _cos_sin(inv, pos, q.dtype)
    return _apply(q, k, c, s)


impls = {
    "fuser": torch.compile(from_positions, backend="fuser"),
    "inductor": torch.compile(from_positions),
}
lig = _liger()
if lig is not None:
    impls["liger"] = lambda q, k, inv, pos: lig(q, k, *_cos_sin(inv, pos, q.dtype))
for name, f in impls.items():
    for _ in range(3):
        torch.autograd.grad(f(q, k, inv, pos), (q, k), (gq, gk))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.autograd.grad(f(q, k, inv, pos), (q, k), (gq, gk))
        torch.cuda.synchronize()
    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name][0] += e.device_time / 5
            agg[e.name][1] += 1
    print(f"== {name}: {sum(v[0] for v in agg.values()):.1f} us a step")
    for n, (us, c) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"  {us:8.1f} us  {c // 5:3d} calls  {n[:110]}")
from fuser.dynamo.explain import explain  # noqa: E402

print(explain(impls["fuser"], source=True))
