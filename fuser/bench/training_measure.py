"""How the training suite times, checks and counts one implementation of one case.

The timed region (identical for every implementation): one `step`, i.e. the forward call
`outs = fn(*args)` and, where the case has a backward, `torch.autograd.grad(outs, leaves,
upstream)`: the backward of every output into every differentiated input, its gradients
returned rather than accumulated into `.grad` (what a layer below would receive; this
also keeps AccumulateGrad's copy of a peer's gradient that aliases its input, as Liger's
cross-entropy does, out of the figure). Nothing is zeroed or filled inside it: the
inputs and upstream gradients are made once per case. Outside it, before each repeat:
the implementation's setup (only Liger's cross-entropy has one: it writes its gradient
over the logits, which are put back), then an L2 flush (measure._flush_l2), then a GPU
spin (torch.cuda._sleep) long enough for the host to enqueue the whole step behind it,
so the CUDA events around the step time the GPU's work, not Python's launch overhead.
A host synchronization inside an implementation's step (Liger's backward compares the
upstream gradient with 1 on the host) is not hidden: that wait is counted, as a user
would see it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from fuser.bench.measure import _flush_l2
from fuser.bench.training import Inputs
from fuser.ir.dtypes import dtype_of
from fuser.ir.evaluate import tolerance

Tensors = list[torch.Tensor]
SPIN_HZ = 1.98e9  # an H100 SXM's boost clock: cycles of torch.cuda._sleep per second
COMPARE_CHUNK = 2**26  # elements compared at once (no full fp32 copy of a 4G-element grad)


def leaves(inp: Inputs) -> Inputs:
    """`inp` with its differentiated arguments made leaves that require grad."""
    args = [a.detach().requires_grad_(True) if i in inp.wrt else a for i, a in enumerate(inp.args)]
    return Inputs(args, inp.wrt, inp.grad_outputs)


def upcast(inp: Inputs) -> Inputs:
    """fp32 copies of the floating-point inputs (the same values): the reference's."""

    def up(t: torch.Tensor) -> torch.Tensor:
        return t.detach().float() if t.is_floating_point() else t

    grads = [up(g) for g in inp.grad_outputs] if inp.grad_outputs is not None else None
    return leaves(Inputs([up(a) for a in inp.args], inp.wrt, grads))


def step(fn: Callable[..., object], inp: Inputs) -> Tensors:
    """The timed region: forward, then the backward of every output into `inp.wrt`.
    Returns the outputs followed by the gradients."""
    outs = fn(*inp.args)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    if not inp.wrt:
        return outs
    wrt = [inp.args[i] for i in inp.wrt]
    return outs + list(torch.autograd.grad(outs, wrt, inp.grad_outputs))


def output_names(n_outs: int, inp: Inputs) -> list[str]:
    return [f"out{i}" for i in range(n_outs)] + [f"grad(arg{i})" for i in inp.wrt]


def reference(fn: Callable[..., object], inp: Inputs) -> Tensors:
    """The outputs and gradients in fp32 from the bf16 inputs' values; tensors over 2^31
    elements are kept in bf16 (one rounding, far inside the check's tolerance)."""
    ref = step(fn, upcast(inp))
    return [r.detach().bfloat16() if r.numel() > 2**31 else r.detach() for r in ref]


def check(got: Tensors, ref: Tensors, n: int, names: list[str]) -> tuple[str | None, float]:
    """(None or what is wrong, the largest error in units of its output's scale).

    An output passes when every element is within atol + rtol*|ref| of the fp32
    reference: rtol is fuser's tolerance for the output's dtype at reduction length `n`
    (several bf16 ulps; for fp32 outputs it grows like sqrt(n)), atol is rtol times the
    output's largest magnitude (a column sum near 0 carries the rounding of its n terms).
    """
    if len(got) != len(ref):
        return f"{len(got)} outputs and gradients, the reference has {len(ref)}", math.inf
    worst = 0.0
    for name, g, r in zip(names, got, ref):
        g = g.detach()
        if tuple(g.shape) != tuple(r.shape):
            return f"{name}: shape {tuple(g.shape)}, reference {tuple(r.shape)}", math.inf
        if g.numel() == 0:
            continue
        rtol = tolerance(dtype_of(g.dtype), n)[1]
        if g.dtype in (torch.float16, torch.bfloat16):
            rtol = max(rtol, 3 * torch.finfo(g.dtype).eps)
        gf, rf = g.reshape(-1), r.reshape(-1)
        scale = max(_chunked(lambda a, b: b.abs().max(), gf, rf), 1e-30)
        atol = rtol * scale
        excess = _chunked(lambda a, b, t=rtol: ((a - b).abs() - t * b.abs()).max(), gf, rf)
        err = _chunked(lambda a, b: (a - b).abs().max(), gf, rf)
        if not math.isfinite(err):
            return f"{name}: not finite where the reference is", math.inf
        worst = max(worst, err / scale)
        if excess > atol:
            return (
                f"{name}: max |got - ref| = {err:.3g} (scale {scale:.3g}, rtol {rtol:.2g})",
                worst,
            )
    return None, worst


def _chunked(f: Callable, a: torch.Tensor, b: torch.Tensor) -> float:
    out = -math.inf
    for i in range(0, a.numel(), COMPARE_CHUNK):
        out = max(out, float(f(a[i : i + COMPARE_CHUNK].float(), b[i : i + COMPARE_CHUNK].float())))
    return out


def host_ms(call: Callable[[], object], n: int = 5) -> float:
    """Median host time of one call, the GPU idle at its start (sets the spin)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(times)[n // 2] * 1e3


def gpu_ms(
    call: Callable[[], object],
    reps: int,
    setup: Callable[[], None] | None = None,
    flush: str = "read",
) -> tuple[float, float]:
    """(median GPU ms of `call`, host ms of one call): the module docstring's protocol.
    `call` must have been warmed up (compiled) already."""
    host = host_ms(call)
    cycles = int(min(host * 1.5 + 0.05, 50.0) * 1e-3 * SPIN_HZ)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if setup is not None:
            setup()
        _flush_l2(flush)
        torch.cuda._sleep(cycles)
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    mid = len(times) // 2
    return (times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2), host


def gpu_kernels(call: Callable[[], object]) -> tuple[int, int, list[str]]:
    """(kernels, memory copies/sets, their names in launch order) of one call, from
    torch.profiler's CUDA activity."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [
        e.name
        for e in sorted(prof.events(), key=lambda e: e.time_range.start)
        if e.device_type == torch.autograd.DeviceType.CUDA
    ]
    mem = [n for n in names if n.startswith(("Memset", "Memcpy"))]
    kernels = [n for n in names if n not in mem]
    return len(kernels), len(mem), [n[:60] for n in kernels]
