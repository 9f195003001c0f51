"""Run the benchmark cases: baselines, fuser backends and (optionally) the schedule sweep."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import statistics
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import torch

from fuser.bench.cases import DTYPES, OPS, Case, make_cases
from fuser.bench.measure import (
    bench_ms,
    copy_gbps,
    first_call_s,
    host_overhead_us,
    mismatch,
    plan_of,
    sweep_plans,
)


@dataclass
class Options:
    ops: list[str]
    hidden: list[int] | None = None
    rows: int | None = None
    dtype: str | None = None
    backends: list[str] = field(default_factory=lambda: ["triton"])
    baselines: list[str] = field(default_factory=lambda: ["eager", "compile"])
    sweep: bool = False
    sweep_ops: list[str] = field(default_factory=lambda: ["ln_fused"])
    jobs: int = 8
    quick: bool = False
    flush: str = "read"  # how the L2 is flushed between timed repeats (measure._flush_l2)
    smoke: bool = False  # CPU, interpreter: correctness only
    resources: bool = True


def meta() -> dict:
    import triton

    gpu = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if gpu else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }


def progress(items: list, label: str) -> Iterable:
    try:
        from tqdm import tqdm

        return tqdm(items, desc=label, file=sys.stderr, leave=False)
    except ImportError:
        return items


def _baseline(case: Case, name: str) -> Callable[[list], list] | None:
    if name == "eager":
        return case.eager
    if name == "compile":
        # static shapes, fresh caches: each size gets its own specialized kernels, as a
        # user compiling one model at one size would (dynamic kernels after a few sizes
        # ran 2-3x slower on the H100)
        torch._dynamo.reset()
        return torch.compile(case.eager, dynamic=False)
    if name == "liger":
        return _liger(case)
    raise SystemExit(f"unknown baseline {name!r}; choose eager, compile, liger")


def _liger(case: Case) -> Callable[[list], list] | None:
    try:
        from liger_kernel.transformers.functional import liger_layer_norm
    except ImportError:
        return None
    if case.op == "layernorm":
        return lambda i: [liger_layer_norm(i[0], i[1], i[2], 1e-5)]
    return None


def run_case(case: Case, opts: Options, ceiling: float, info: dict, emit: Callable) -> None:
    device = "cpu" if opts.smoke else "cuda"
    inputs = case.inputs(device)
    ref = case.eager(inputs)
    base = {
        "op": case.op,
        "shape": case.shape,
        "dtype": case.dtype_name,
        "copy_gbps": ceiling,
        **info,
    }

    def record(impl: str, ms: float | None, **extra) -> None:
        gbps = case.nbytes / ms / 1e6 if ms else None
        emit({**base, "impl": impl, "ms": ms, "gbps": gbps, **extra})

    if not opts.smoke:
        for name in opts.baselines:
            fn = _baseline(case, name)
            if fn is None:
                continue
            try:
                wrong = mismatch(case, fn(inputs), ref) if name != "eager" else None
                record(
                    name, bench_ms(lambda fn=fn: fn(inputs), opts.quick, opts.flush), error=wrong
                )
            except Exception as e:  # a baseline that cannot run is reported, not fatal
                record(name, None, error=f"{type(e).__name__}: {str(e)[:200]}")
    for backend in opts.backends:
        impl = f"fuser-{backend}"
        try:
            cold = first_call_s(lambda backend=backend: case.fuser(inputs, backend))
            wrong = mismatch(case, case.fuser(inputs, backend), ref)
        except Exception as e:
            record(impl, None, error=f"{type(e).__name__}: {str(e)[:300]}")
            continue
        kernels = [k for fd in case.fusions for k in fd.kernels]
        extra = {
            "schedule": "; ".join(k.schedule.short() for k in kernels),
            "est_registers": [k.schedule.estimate.registers for k in kernels],
            "compile_s": cold,
            "correct": wrong is None,
            "error": wrong,
        }
        if opts.resources and not opts.smoke:
            try:
                res = [k.resources() for k in kernels]
                extra["registers"] = [r["registers"] for r in res]
                extra["spill_bytes"] = [r["spill_bytes"] for r in res]
            except Exception as e:
                extra["registers_error"] = str(e)[:200]
        if opts.smoke or wrong is not None:
            record(impl, None, **extra)
        else:
            call = partial(case.fuser, inputs, backend)
            extra["host_us"] = host_overhead_us(call, n=300)
            record(impl, bench_ms(call, opts.quick, opts.flush), **extra)
        if wrong is None and opts.sweep and case.op in opts.sweep_ops:
            sweep_case(case, opts, backend, inputs, ref, record)


def _warm(args: tuple) -> int:
    """Worker: build the case and run the candidates `picks` once (fills the JIT caches)."""
    op, rows, cols, dtype, backend, picks = args
    case = OPS[op][0](rows, cols, DTYPES[dtype])
    inputs = case.inputs("cuda")
    plans = sweep_plans(plan_of(case, inputs, backend))
    done = 0
    for i in picks:
        try:
            plans[i][2].run(inputs)
            done += 1
        except Exception:  # the main process reports it
            pass
    torch.cuda.synchronize()
    return done


def sweep_case(case: Case, opts: Options, backend: str, inputs, ref, record) -> None:
    """Time every candidate schedule; mark the heuristic's; report the best."""
    plan = plan_of(case, inputs, backend)
    plans = sweep_plans(plan)
    chosen = {idx: k.schedule for idx, k in plan.kernels.items()}
    if opts.jobs > 1 and not opts.smoke and len(plans) > 4:
        # compile the candidates in parallel processes first (Triton's disk cache keeps
        # them), so the timing loop below only loads them
        dtype = next(k for k, v in DTYPES.items() if v == case.dtype)
        chunks = [list(range(i, len(plans), opts.jobs)) for i in range(opts.jobs)]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(opts.jobs, mp_context=ctx) as pool:
            list(
                pool.map(
                    _warm, [(case.op, case.rows, case.cols, dtype, backend, c) for c in chunks]
                )
            )
    timed: list[tuple[float, int]] = []
    for i, (label, s, p) in enumerate(progress(plans, f"sweep {case.op} {case.shape}")):
        is_choice = any(s == c for c in chosen.values())
        try:
            p.run(inputs)
            out = p.run(inputs)
            wrong = mismatch(case, case.finish(out) if case.finish else out, ref)
            ms = (
                None
                if wrong or opts.smoke
                else bench_ms(lambda p=p: p.run(inputs), True, opts.flush)
            )
        except Exception as e:
            wrong, ms = f"{type(e).__name__}: {str(e)[:200]}", None
        record(
            f"sweep-{backend}",
            ms,
            kernel=label,
            schedule=s.short(),
            est_registers=[s.estimate.registers],
            heuristic=is_choice,
            correct=wrong is None,
            error=wrong,
        )
        if ms is not None:
            timed.append((ms, i))
    if not opts.smoke:
        _confirm(case, opts, backend, inputs, plans, chosen, timed, record)


CONFIRM_TOP = 3  # fastest candidates timed again beside the heuristic's
CONFIRM_ROUNDS = 3


def _confirm(case, opts, backend, inputs, plans, chosen, timed, record) -> None:
    """Time the heuristic's schedule and the sweep's fastest few again, in interleaved
    rounds with full repeats: the minimum of a hundred single quick timings is biased low
    (an H100 timed one 1024-column schedule at 17.1 and 21.6 us in two runs), so regret is
    computed from these medians instead."""
    picks: list[int] = []
    for label in dict.fromkeys(plans[i][0] for _, i in timed):  # per kernel of the plan
        picks += [i for _, i in sorted(timed) if plans[i][0] == label][:CONFIRM_TOP]
    picks += [i for i, (_, s, _) in enumerate(plans) if s in chosen.values() and i not in picks]
    times: dict[int, list[float]] = {i: [] for i in picks}
    for _ in range(CONFIRM_ROUNDS):
        for i in picks:
            p = plans[i][2]
            try:
                times[i].append(bench_ms(lambda p=p: p.run(inputs), False, opts.flush))
            except Exception:  # the sweep's own row already says why
                pass
    for i in [i for i in picks if times[i]]:
        label, s, _ = plans[i]
        record(
            f"confirm-{backend}",
            statistics.median(times[i]),
            kernel=label,
            schedule=s.short(),
            heuristic=s in chosen.values(),
            rounds=times[i],
        )


def run(opts: Options, emit: Callable[[dict], None]) -> None:
    info = {**meta(), "flush": opts.flush}
    os.environ.setdefault("FUSER_CACHE_DIR", os.path.expanduser("~/.cache/fuser-bench"))
    ceiling = None if opts.smoke else copy_gbps()
    if ceiling:
        emit(
            {
                "op": "copy",
                "shape": "1GiB",
                "dtype": "float16",
                "impl": "torch-copy",
                "gbps": ceiling,
                "copy_gbps": ceiling,
                **info,
            }
        )
    cases = list(make_cases(opts.ops, opts.hidden, opts.rows, opts.dtype))
    for case in progress(cases, "cases"):
        run_case(case, opts, ceiling, info, emit)
