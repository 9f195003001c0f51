"""Timing, correctness and the heuristic's regret, per ../shared/DESIGN.md's protocol.

Median time with the L2 flushed between repeats (by reading a 256 MB buffer, or by
writing it as triton.testing.do_bench does: --flush), GB/s from the case's minimal bytes,
and the ceiling: a 1 GiB device-to-device copy in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from fuser.bench.cases import Case, Tensors
from fuser.ir.dtypes import dtype_of
from fuser.ir.evaluate import tolerance
from fuser.runtime.executor import CompiledFusion, render_kernel
from fuser.schedulers.choose import candidate_schedules
from fuser.schedulers.schedule import Schedule

FLUSHES = ("read", "zero")
_flush_buffer: list[torch.Tensor] = []


def _flush_l2(how: str) -> None:
    """Push the previous call's data out of the L2 before the next timed call.

    "zero" writes a 256 MB buffer (what triton.testing.do_bench does): the L2 is left full
    of dirty lines, whose write-back to memory then runs during the timed kernel and costs
    a short kernel ~10 us on an H100. "read" sums the buffer instead: the L2 holds clean
    lines that are simply dropped, so the timed kernel pays only for its own traffic.
    """
    if not _flush_buffer:
        _flush_buffer.append(torch.ones(64 * 2**20, dtype=torch.int32, device="cuda"))
    buf = _flush_buffer[0]
    if how == "zero":
        buf.zero_()
    else:
        buf.sum()


def bench_ms(fn: Callable[[], object], quick: bool = False, flush: str = "read") -> float:
    """Median ms of `fn` over repeats, each after an L2 flush (see _flush_l2), each timed
    with its own pair of CUDA events (the flush is outside them)."""
    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {FLUSHES}, not {flush!r}")
    warmup_ms, rep_ms = (10, 40) if quick else (25, 100)
    fn()
    torch.cuda.synchronize()
    # estimate one call (flush included) to size the warm-up and the repeats
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        _flush_l2(flush)
        fn()
    end.record()
    torch.cuda.synchronize()
    each = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / each))):
        fn()
    reps = max(1, int(rep_ms / each))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        _flush_l2(flush)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def copy_gbps() -> float:
    x = torch.empty(2**29, dtype=torch.float16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x), flush="read")
    return 2 * x.numel() * x.element_size() / ms / 1e6


def mismatch(case: Case, got: Tensors, ref: Tensors) -> str | None:
    """None when every output matches the eager one within its dtype's tolerance."""
    if len(got) != len(ref):
        return f"{len(got)} outputs, eager gives {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref)):
        if g.shape != r.shape:
            return f"output {i}: shape {tuple(g.shape)}, eager {tuple(r.shape)}"
        if not r.dtype.is_floating_point:
            if not torch.equal(g, r):
                return f"output {i}: integers differ from eager"
            continue
        atol, rtol = tolerance(dtype_of(r.dtype), case.reduction_length)
        # eager rounds half outputs too: allow a few ulps of the output dtype on top
        if r.dtype in (torch.float16, torch.bfloat16):
            rtol = max(rtol, 3 * torch.finfo(r.dtype).eps)
        # absolute tolerance in units of the output's scale (dlogits are ~1e-4, y ~ 1)
        scale = r.float().abs().max().item() if r.numel() else 1.0
        atol *= min(max(scale, 1e-30), 1.0)
        if not torch.allclose(g.float(), r.float(), atol=atol, rtol=rtol, equal_nan=True):
            err = (g.float() - r.float()).abs().max().item()
            return f"output {i}: max |fuser - eager| = {err:.3g} (atol {atol:.2g}, rtol {rtol:.2g})"
    return None


def host_overhead_us(fn: Callable[[], object], n: int = 2000) -> float:
    """Python time of one call on the host, median over `n` calls. Each call starts with
    the GPU idle and is timed until it returns, before its kernels finish: a loop of
    calls without waiting would, once the launch queue is full, time the GPU instead."""
    fn()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] * 1e6


def first_call_s(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def plan_of(case: Case, inputs: Tensors, backend: str, which: int = 0) -> CompiledFusion:
    """The cached plan fusion `which` of `case` runs with (after one execute)."""
    case.fuser(inputs, backend)
    plan = case.fusions[which]._runtime().last
    assert plan is not None
    return plan


def with_schedule(plan: CompiledFusion, index: int, schedule: Schedule) -> CompiledFusion:
    """A copy of `plan` whose kernel `index` runs `schedule` instead of the heuristic's."""
    k = plan.kernels[index]
    kernels = {**plan.kernels, index: render_kernel(k.spec, schedule, plan.backend)}
    return replace(plan, kernels=kernels)


def sweep_plans(plan: CompiledFusion) -> list[tuple[str, Schedule, CompiledFusion]]:
    """(label, schedule, plan) for every candidate of every kernel of `plan`."""
    out = []
    for idx, k in plan.kernels.items():
        for s in candidate_schedules(k.spec, plan.device, plan.backend):
            out.append((f"k{idx}", s, with_schedule(plan, idx, s)))
    return out
