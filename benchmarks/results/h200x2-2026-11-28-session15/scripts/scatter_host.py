"""Session 15: the host time of fuser's embedding backward (scatter_add_rows) on a GPU,
by piece, and a cProfile of it."""
import cProfile
import pstats
import time

import torch

from fuser.runtime import scatter as sc

src = torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16)
idx = torch.randint(0, 32000, (16, 1024), device="cuda")
flat = idx.reshape(-1)


def host(name, fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    print(f"{name:<44} {(t1 - t0) / n / 1e3:8.1f} us host a call")


host("scatter_add_rows (embedding backward)", lambda: sc.scatter_add_rows(src, idx, 32000))
host("torch.sort(stable)", lambda: torch.sort(flat, stable=True))
s, _ = torch.sort(flat, stable=True)
ids = torch.arange(32001, device="cuda")
host("torch.searchsorted", lambda: torch.searchsorted(s, ids))
host("torch.empty (32000x768 bf16)", lambda: torch.empty((32000, 768), dtype=torch.bfloat16, device="cuda"))
print("plan:", sc.plan_for(src, idx, 32000, torch.bfloat16))
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    sc.scatter_add_rows(src, idx, 32000)
pr.disable()
torch.cuda.synchronize()
st = pstats.Stats(pr)
st.sort_stats("tottime")
st.print_stats(25)

from fuser.dynamo.ce_scale import scale_in_place  # noqa: E402

g = torch.randn(16384, 32000, device="cuda", dtype=torch.bfloat16)
one = torch.ones((), device="cuda")
host("scale_in_place (CE gradient, upstream 1)", lambda: scale_in_place(g, one))
