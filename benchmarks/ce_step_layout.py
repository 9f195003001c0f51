"""The GPT-2 step's cross-entropy, forward + backward, by the logits' layout: fuser against
Inductor and eager on a GPU, L2 flushed, CUDA events, median of the repeats.

    PYTHONPATH=. python benchmarks/ce_step_layout.py            # ~1-2 min on an H100
    PYTHONPATH=. python benchmarks/ce_step_layout.py --rows 16384 --vocab 50257

`F.cross_entropy(logits.float(), t)` then `.backward()`, bf16 logits, for two layouts:
- padded: the logits are the first V columns of rows padded to a multiple of 64 (what
  pad_mm.py leaves of the lm head: `base[:, :V]` with base [N, V'] requiring grad), so
  the backward also pads the gradient back to V' columns, as the step's does;
- contiguous: [N, V] logits that are the compiled function's input.
Implementations: eager, Inductor, fuser, and "fuser-oldgrad": fuser with the one-pass
gradient in contiguous rows, the layout before ce_op.py's aligned rows (the same run's
A/B of that change). The row kernel fuser chose is printed beside its time (its vector
and the gradient's row stride).

GB/s counts one read of the bf16 logits and one write of the bf16 gradient, 4 bytes an
element, over the whole forward + backward time; "copy" is a device-to-device copy of
1 GiB measured in the same run (read + write), the ceiling.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import fuser.dynamo.ce_rewrite as ce_rewrite
from fuser.dynamo import FuserBackend

DEVICE = "cuda"


def _median_ms(step: Callable[[], None], flush: torch.Tensor, reps: int) -> float:
    times = []
    for i in range(reps + 3):
        flush.zero_()  # evicts the previous repeat's data from the 50 MB L2
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _copy_gbps(flush: torch.Tensor) -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(a)
    ms = _median_ms(lambda: b.copy_(a), flush, 20)
    return 2 * a.numel() / ms / 1e6


@contextlib.contextmanager
def _old_gradient_layout() -> Iterator[None]:
    """fuser with the gradient in contiguous rows: every logits taken for a graph input's
    (ce_rewrite.py then keeps eager's layout), as before the aligned rows."""
    keep = ce_rewrite._graph_input
    ce_rewrite._graph_input = lambda n: True
    try:
        yield
    finally:
        ce_rewrite._graph_input = keep


def _row_kernel(b: FuserBackend) -> str:
    """The fuser forward's widest kernel: its schedule and the gradient's row stride."""
    kernels = [k for c in b.captures for k in c.graphs[0].kernels] if b.captures else []
    if not kernels:
        return "no fused kernel"
    k = max(kernels, key=lambda k: k.spec.rows * k.spec.cols)
    outs = [a.row_stride for a in k.spec.full_args() if a.is_output]
    return f"{k.schedule.short()}, gradient row stride {outs}"


def _case(rows: int, v: int, layout: str, impls: list[str], flush, copy, reps) -> None:  # noqa: ANN001
    width = -(-v // 64) * 64 if layout == "padded" else v
    g = torch.Generator(device=DEVICE).manual_seed(0)
    base = (torch.randn(rows, width, device=DEVICE, generator=g) * 2).to(torch.bfloat16)
    base.requires_grad_(True)
    t = torch.randint(0, v, (rows,), device=DEVICE, generator=g)

    def f(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = x[:, :v] if layout == "padded" else x
        return F.cross_entropy(logits.float(), t)

    want_loss = f(base, t)
    want_loss.backward()
    want = base.grad.float()
    gb = 4 * rows * v / 1e9
    for name in impls:
        if name == "fuser-oldgrad" and layout == "contiguous":
            continue  # a graph input's gradient keeps contiguous rows either way
        torch._dynamo.reset()
        b = FuserBackend() if name.startswith("fuser") else None
        old = _old_gradient_layout() if name == "fuser-oldgrad" else contextlib.nullcontext()
        with old:
            fn = {"eager": f, "inductor": torch.compile(f, backend="inductor")}.get(name)
            fn = fn or torch.compile(f, backend=b)
            base.grad = None
            loss = fn(base, t)  # compiles here (and the backward at its first call)
            loss.backward()
        err = (base.grad.float() - want).abs().max().item()
        err = max(err, abs(loss.item() - want_loss.item()))

        def step(fn: Callable = fn) -> None:
            base.grad = None
            fn(base, t).backward()

        ms = _median_ms(step, flush, reps)
        rate = gb / ms * 1e3
        note = f"  {_row_kernel(b)}" if b is not None else ""
        print(
            f"{rows}x{v} {layout:10s} {name:13s} {ms:7.3f} ms {rate:6.0f} GB/s "
            f"({rate / copy:4.0%} of copy)  max err {err:.1e}{note}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--vocab", type=int, nargs="+", default=[50257, 32000])
    ap.add_argument("--layouts", nargs="+", default=["padded", "contiguous"])
    ap.add_argument("--impls", nargs="+", default=["eager", "inductor", "fuser", "fuser-oldgrad"])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEVICE)
    copy = _copy_gbps(flush)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy {copy:.0f} GB/s")
    for rows in args.rows:
        for v in args.vocab:
            for layout in args.layouts:
                _case(rows, v, layout, args.impls, flush, copy, args.reps)


if __name__ == "__main__":
    main()
