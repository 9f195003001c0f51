"""Session 21: host time of fuser's embedding backward and of its parts (the census put
one call at ~0.8 ms of host time in the Llama step, B=8): each timed as 200 calls queued
without a synchronization, us a call (the GPU runs behind)."""

import time

import torch

from fuser.runtime import scatter

V, H, N = 32000, 768, 8192
g = torch.Generator(device="cuda").manual_seed(0)
grad = torch.randn(N, H, device="cuda", dtype=torch.bfloat16, generator=g)
ids = torch.randint(0, V, (N,), device="cuda", generator=g)
flat = ids.reshape(-1)


def host_us(fn, n: int = 200) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * t / n


parts = {
    "embedding_backward (all)": lambda: scatter.embedding_backward(grad, ids, V, -1, False),
    "torch.sort(stable)": lambda: torch.sort(flat, stable=True),
    "torch.searchsorted": lambda: torch.searchsorted(
        flat, scatter._row_ids(V + 1, flat.dtype, flat.device)
    ),
    "plan_for": lambda: scatter.plan_for(grad, ids, V, grad.dtype),
    "torch.empty [V, H]": lambda: torch.empty((V, H), dtype=grad.dtype, device="cuda"),
    "poll": scatter.poll,
    "aten embedding_dense_backward": lambda: torch.ops.aten.embedding_dense_backward(
        grad, ids, V, -1, False
    ),
}
for name, fn in parts.items():
    print(f"{name:32s} {host_us(fn):8.1f} us a call (host)")
