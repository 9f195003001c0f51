"""Timing, correctness and the heuristic's regret, per ../shared/DESIGN.md's protocol.

Median time with the L2 flushed between repeats (triton.testing.do_bench), GB/s from
the case's minimal bytes, and the ceiling: a 1 GiB device-to-device copy in the same run.
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
from fuser.schedulers.heuristics import candidate_schedules
from fuser.schedulers.schedule import Schedule


def bench_ms(fn: Callable[[], object], quick: bool = False) -> float:
    from triton.testing import do_bench

    return float(
        do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100, return_mode="median")
    )


def copy_gbps() -> float:
    x = torch.empty(2**29, dtype=torch.float16, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x))
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
    """Python time of one call, on the host: the GPU is not waited for in the loop."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


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
