"""LayerNorm / residual+LayerNorm / RMSNorm forward+backward through torch.compile(backend=
"fuser") on a GPU: gradients against eager fp32, then GPU time (triton.testing.do_bench, L2
flushed) beside eager and Inductor, and the kernels fuser chose.

    python benchmarks/inner_outer_check.py [--backend triton|cuda] [--H 768,1024,1600,4096]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from fuser.dynamo.explain import explain


def make(kind: str, H: int):
    def step(x, w, b, r, dy, dh):
        h = x + r if kind == "resid" else x
        y = F.rms_norm(h, (H,), w) if kind == "rms" else F.layer_norm(h, (H,), w, b)
        torch.autograd.backward(
            [y, h] if kind == "resid" else [y], [dy, dh][: 1 + (kind == "resid")]
        )

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="triton")
    p.add_argument("--H", default="768,1024,1600,2048,4096,8192")
    p.add_argument("--rows", type=int, default=8192)
    a = p.parse_args()
    import fuser.config

    fuser.config.config.backend = a.backend
    for kind in ("ln", "resid", "rms"):
        for H in map(int, a.H.split(",")):
            torch._dynamo.reset()
            M, dt = a.rows, torch.bfloat16
            leaves = [
                torch.randn(M, H, device="cuda", dtype=dt),
                torch.randn(H, device="cuda", dtype=dt),
                torch.randn(H, device="cuda", dtype=dt),
                torch.randn(M, H, device="cuda", dtype=dt),
            ]
            dy, dh = (
                torch.randn(M, H, device="cuda", dtype=dt),
                torch.randn(M, H, device="cuda", dtype=dt),
            )
            step = make(kind, H)
            fns = {
                "fuser": torch.compile(step, backend="fuser"),
                "eager": step,
                "inductor": torch.compile(step),
            }
            ts = {k: [t.clone().requires_grad_() for t in leaves] for k in fns}
            ref = [t.float().requires_grad_() for t in leaves]
            step(*ref, dy.float(), dh.float())
            for k, fn in fns.items():
                fn(*ts[k], dy, dh)
            errs = [
                ((g.grad.float() - r.grad).abs().max() / r.grad.abs().max().clamp(min=1)).item()
                for g, r in zip(ts["fuser"], ref)
                if r.grad is not None
            ]
            nbytes = (8 if kind == "resid" else 5) * M * H * 2
            row = []
            for k, fn in fns.items():
                ms = do_bench(
                    lambda fn=fn, t=ts[k], dy=dy, dh=dh: fn(*t, dy, dh), warmup=25, rep=200
                )
                row.append(f"{k} {ms * 1e3:.1f} us {nbytes / ms / 1e6:.0f} GB/s")
            print(f"{kind} H={H} [{a.backend}] rel err max {max(errs):.2e} | " + " | ".join(row))
    print(explain(brief=True))


if __name__ == "__main__":
    main()
