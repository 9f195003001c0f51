"""Time every candidate schedule of the outer (column) reduction scheduler at the bias-
gradient targets of issue 20, beside eager and torch.compile, and report the heuristic's
regret (time of its choice / time of the fastest candidate - 1), per backend.

    python benchmarks/outer_sweep.py                                  # f32 form, all targets
    python benchmarks/outer_sweep.py --forms f32,same,gelu --shapes 8192x768,8192x3072
    python benchmarks/outer_sweep.py --out benchmarks/results/h100-$(date +%F)-outer

Forms (fuser/examples/bias_grad.py): f32 = dy.float().sum(0), same = dy.sum(0), gelu =
gelu_backward(dy, x) with dx written and dx.float().sum(0). Bytes: each tensor once.
Every candidate is timed quickly (L2 flushed, as python -m fuser.bench --sweep does), then
the heuristic's choice and the fastest few again in interleaved full rounds; regret comes
from those medians. Writes results.jsonl (one row per measurement) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from fuser.bench.cases import Case
from fuser.bench.measure import bench_ms, copy_gbps, mismatch, plan_of, sweep_plans
from fuser.examples.bias_grad import FORMS, bias_grad_eager, bias_grad_fusion, bias_grad_inputs

TARGETS = ["8192x768", "8192x1024", "8192x2304", "8192x3072", "8192x4096", "8192x6400"]
TARGETS += ["32768x768", "32768x3072"]
TOP = 3
ROUNDS = 3


def make_case(form: str, rows: int, cols: int, dtype: torch.dtype = torch.bfloat16) -> Case:
    fd = bias_grad_fusion(form, dtype)
    n_in = bias_grad_inputs(form)

    def inputs(device: str) -> list[torch.Tensor]:
        g = torch.Generator(device="cpu").manual_seed(rows * 7919 + cols)
        return [torch.randn(rows, cols, generator=g).to(dtype).to(device) for _ in range(n_in)]

    item = dtype.itemsize
    out_item = 4 if form != "same" else item
    nbytes = rows * cols * item * (n_in + (1 if form == "gelu" else 0)) + cols * out_item
    return Case(
        f"bias_grad_{form}",
        rows,
        cols,
        dtype,
        [fd],
        lambda ins, backend: fd.execute(ins, backend=backend),
        lambda ins: bias_grad_eager(form, ins),
        inputs,
        nbytes,
        reduction_length=rows,
    )


def _warm(args: tuple) -> int:
    """Worker: compile and run candidates `picks` once (fills the compilers' disk caches)."""
    form, rows, cols, backend, picks = args
    case = make_case(form, rows, cols)
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


def sweep(case: Case, backend: str, jobs: int, emit) -> dict:
    inputs = case.inputs("cuda")
    ref = case.eager(inputs)
    plan = plan_of(case, inputs, backend)
    chosen = plan.kernels[0].schedule
    plans = sweep_plans(plan)
    if jobs > 1:
        chunks = [list(range(i, len(plans), jobs)) for i in range(jobs)]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            list(
                pool.map(_warm, [(case.op[10:], case.rows, case.cols, backend, c) for c in chunks])
            )
    timed: list[tuple[float, int]] = []
    for i, (_, s, p) in enumerate(plans):
        try:
            wrong = mismatch(case, p.run(inputs), ref)
            ms = None if wrong else bench_ms(lambda p=p: p.run(inputs), True)
        except Exception as e:
            wrong, ms = f"{type(e).__name__}: {str(e)[:200]}", None
        emit(case, f"sweep-{backend}", ms, schedule=s.short(), heuristic=s == chosen, error=wrong)
        if ms is not None:
            timed.append((ms, i))
    picks = [i for _, i in sorted(timed)[:TOP]]
    picks += [i for i, (_, s, _) in enumerate(plans) if s == chosen and i not in picks]
    times: dict[int, list[float]] = {i: [] for i in picks}
    for _ in range(ROUNDS):
        for i in picks:
            p = plans[i][2]
            times[i].append(bench_ms(lambda p=p: p.run(inputs), False))
    med = {i: statistics.median(t) for i, t in times.items()}
    for i, ms in med.items():
        s = plans[i][1]
        emit(case, f"confirm-{backend}", ms, schedule=s.short(), heuristic=s == chosen)
    best = min(med, key=med.get)
    mine = next((i for i in med if plans[i][1] == chosen), None)
    return {
        "chosen": chosen.short(),
        "chosen_ms": med.get(mine) if mine is not None else None,
        "best": plans[best][1].short(),
        "best_ms": med[best],
        "candidates": len(plans),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--forms", default="f32", help=f"comma-separated, of {', '.join(FORMS)}")
    ap.add_argument("--shapes", default=",".join(TARGETS), help="MxN,... (default: the targets)")
    ap.add_argument("--backends", default="triton,cuda")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--no-sweep", action="store_true", help="heuristic and baselines only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("outer_sweep: needs a CUDA GPU")
        return 2
    os.environ.setdefault("FUSER_CACHE_DIR", os.path.expanduser("~/.cache/fuser-bench"))
    rows_out: list[dict] = []
    ceiling = copy_gbps()
    device = torch.cuda.get_device_name()
    if args.out:  # each row as it is measured: a run cut short keeps what it timed
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.jsonl").write_text("")

    def emit(case: Case, impl: str, ms: float | None, **extra) -> None:
        gbps = case.nbytes / ms / 1e6 if ms else None
        row = {"op": case.op, "shape": case.shape, "dtype": case.dtype_name, "impl": impl}
        row |= {"ms": ms, "gbps": gbps, "copy_gbps": ceiling, "device": device, **extra}
        rows_out.append(row)
        if args.out:
            with open(args.out / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")

    table = []
    for form in args.forms.split(","):
        for shape in args.shapes.split(","):
            m, n = (int(x) for x in shape.split("x"))
            case = make_case(form, m, n)
            inputs = case.inputs("cuda")
            torch._dynamo.reset()
            compiled = torch.compile(case.eager, dynamic=False)
            base = {}
            for name, fn in (("eager", case.eager), ("compile", compiled)):
                base[name] = bench_ms(lambda fn=fn, i=inputs: fn(i))
                emit(case, name, base[name])
            for backend in args.backends.split(","):
                ms = bench_ms(lambda b=backend, c=case, i=inputs: c.fuser(i, b))
                sched = case.fusions[0].kernels[0].schedule.short()
                emit(case, f"fuser-{backend}", ms, schedule=sched)
                row = {"form": form, "shape": shape, "backend": backend, "fuser_ms": ms}
                row |= {"compile_ms": base["compile"], "schedule": sched}
                if not args.no_sweep:
                    row |= sweep(case, backend, args.jobs, emit)
                table.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"\n{device}; copy {ceiling:.0f} GB/s; ms with the L2 flushed")
    print("| form | shape | backend | fuser ms | GB/s | torch.compile ms | vs compile | regret |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        case = make_case(r["form"], *(int(x) for x in r["shape"].split("x")))
        regret = (
            f"{r['chosen_ms'] / r['best_ms'] - 1:.1%} (best {r['best']})"
            if r.get("chosen_ms")
            else "-"
        )
        print(
            f"| {r['form']} | {r['shape']} | {r['backend']} | {r['fuser_ms']:.4f} | "
            f"{case.nbytes / r['fuser_ms'] / 1e6:.0f} | {r['compile_ms']:.4f} | "
            f"{r['compile_ms'] / r['fuser_ms']:.2f}x | {regret} |"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        print(f"wrote {args.out / 'results.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
