"""Cross-entropy forward+backward under torch.compile: fuser's one-pass op against its
old path (log_softmax + nll_loss), Inductor and eager, on a GPU, L2 flushed.

    python benchmarks/ce_one_pass.py [--rows 8192 32768] [--vocab 32000 50257] [--upcast]

GB/s counts one read of the bf16 logits and one write of the bf16 gradient (4 bytes an
element), as issue 20 does. `--scale` multiplies the loss by 0.5 first (the in-place
scaling pass is then taken and counted in the time).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import fuser  # noqa: F401  (registers backend="fuser")
from fuser.config import config


def _time(fn, x, t, flush, reps=30) -> float:
    times = []
    for _ in range(reps + 3):
        flush.zero_()
        x.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x, t).backward()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[3:])[len(times[3:]) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 50257])
    ap.add_argument("--upcast", action="store_true", help="F.cross_entropy(logits.float(), t)")
    ap.add_argument("--scale", action="store_true", help="loss * 0.5 before backward")
    args = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def f(x, t):
        loss = F.cross_entropy(x.float() if args.upcast else x, t)
        return loss * 0.5 if args.scale else loss

    for rows in args.rows:
        for v in args.vocab:
            x = torch.randn(rows, v, device="cuda", dtype=torch.bfloat16).requires_grad_()
            t = torch.randint(0, v, (rows,), device="cuda")
            gb = 4 * rows * v / 1e9
            for name, one_pass, backend in (
                ("eager", True, None),
                ("inductor", True, "inductor"),
                ("fuser-old", False, "fuser"),
                ("fuser", True, "fuser"),
            ):
                torch._dynamo.reset()
                config.one_pass_cross_entropy = one_pass
                fn = f if backend is None else torch.compile(f, backend=backend)
                ms = _time(fn, x, t, flush)
                print(f"{rows}x{v} {name:10s} {ms:7.3f} ms {gb / ms * 1e3:7.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
