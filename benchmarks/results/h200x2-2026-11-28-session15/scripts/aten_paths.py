"""Host cost of one ATen call by each path a call program could take (session 15)."""
import time
import torch

aten = torch.ops.aten
dev = "cuda"
a = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
b = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
c = torch.empty(64, 64, device=dev, dtype=torch.bfloat16)
x32 = torch.randn(64, 64, device=dev)
N = 3000


def bench(name, fn):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(N):
        fn()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    print(f"{name:<58} {(t1 - t0) / N / 1e3:7.2f} us")


mm_op = aten.mm.default
mm_raw = aten.mm.default._op
cases = [
    ("aten.mm.default(a, b)  [OpOverload.__call__]", lambda: mm_op(a, b)),
    ("aten.mm.default._op(a, b)", lambda: mm_raw(a, b)),
    ("torch.mm(a, b)", lambda: torch.mm(a, b)),
    ("torch.mm(a, b, out=c)", lambda: torch.mm(a, b, out=c)),
    ("aten._to_copy.default(x32, dtype=bf16)", lambda: aten._to_copy.default(x32, dtype=torch.bfloat16)),
    ("x32.to(bf16)", lambda: x32.to(torch.bfloat16)),
    ("aten.view.default(a, [4096])", lambda: aten.view.default(a, [4096])),
    ("a.view(4096)", lambda: a.view(4096)),
    ("a.as_strided((64, 64), (1, 64))", lambda: a.as_strided((64, 64), (1, 64))),
    ("torch.empty_strided((64,64),(64,1))", lambda: torch.empty_strided((64, 64), (64, 1), device=dev, dtype=torch.bfloat16)),
    ("_empty_strided_cuda", lambda: torch._C._dynamo.guards._empty_strided_cuda((64, 64), (64, 1), torch.bfloat16)),
    ("_reinterpret_tensor", lambda: torch._C._dynamo.guards._reinterpret_tensor(a, (64, 64), (1, 64), 0)),
    ("a.data_ptr()", lambda: a.data_ptr()),
]
for mode in ("plain", "no_grad", "autocast"):
    print(f"-- {mode}")
    ctx = {"plain": torch.enable_grad, "no_grad": torch.no_grad,
           "autocast": lambda: torch.autocast("cuda", dtype=torch.bfloat16)}[mode]
    with ctx():
        for name, fn in cases:
            bench(name, fn)
