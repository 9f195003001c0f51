"""Time each kernel of the attention template over a grid of tiles, one kernel at a time.

    python benchmarks/attention_tiles.py --out $OUT/tiles.jsonl [--shape gpt2-124M]
        [--jobs 12] [--kernels fwd,dkdv,dq]

The planner (fuser/schedulers/attention.py) picks BLOCK_M x BLOCK_N, warps and stages for
the forward, the dK/dV kernel and the dQ kernel separately; this measures each choice
against its neighbours on the GPU at hand. For each of attention_bench's shapes it varies
one kernel's tiles with the others at the planner's choice, checks the kernel's result
against the planner's own (max abs difference), and times it alone (median GPU time by
triton.testing.do_bench). Compiling ~100 variants a shape takes minutes on one core, so
--jobs worker processes launch every variant once first (filling Triton's disk cache);
the timing then runs in this process, alone on the GPU. One JSON row per (shape, kernel,
tiles); the planner's row is marked `planner: true`; a table of the best tiles per kernel
on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing as mp
from collections.abc import Callable

import torch
from attention_bench import SHAPES
from attention_bench import meta as run_meta

from fuser.runtime.attention import (
    attention_forward,
    launch_delta,
    launch_dkdv,
    launch_dq,
    plan_for,
)
from fuser.schedulers.attention import AttentionPlan, AttentionShape, Tiles, retile

KERNELS = ("fwd", "dkdv", "dq")


def _grid(kernel: str) -> list[Tiles]:
    """Tiles to try: (BLOCK_M, BLOCK_N) with the diagonal's divisibility, warps, stages."""
    if kernel == "fwd":
        mn = [(64, 32), (64, 64), (128, 32), (128, 64), (128, 128)]
    elif kernel == "dkdv":  # BLOCK_N keys per program, BLOCK_M queries a step
        mn = [(16, 64), (32, 64), (64, 64), (16, 128), (32, 128), (64, 128)]
    else:  # dq: BLOCK_M queries per program, BLOCK_N keys a step
        mn = [(64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64)]
    return [Tiles(m, n, w, s) for (m, n), w, s in itertools.product(mn, (4, 8), (2, 3, 4))]


def _variants(shape: AttentionShape, kernels: list[str]) -> list[tuple[str, AttentionPlan]]:
    base = plan_for(shape)
    out = []
    for kernel in kernels:
        for t in _grid(kernel):
            key = {"fwd": "forward"}.get(kernel, kernel)
            try:
                out.append((kernel, retile(base, "tile sweep", **{key: t})))
            except AssertionError:  # shared memory over budget: not a candidate
                continue
    return out


def _inputs(b: int, h: int, t: int, d: int) -> dict[str, torch.Tensor]:
    """q/k/v as [B, T, H, d] projections viewed [B, H, T, d] (what models hand over)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(scale: float = 1.0) -> torch.Tensor:
        x = torch.randn(b, t, h, d, device="cuda", generator=g, dtype=torch.bfloat16)
        return (x * scale).transpose(1, 2)

    q, k, v, do = r(), r(), r(), r(0.1)
    out, lse = attention_forward(q, k, v, True)
    delta = torch.empty(b, h, t, device="cuda", dtype=torch.float32)
    launch_delta(plan_for(AttentionShape.of(q, k, True)), out, do, delta)
    return {"q": q, "k": k, "v": v, "do": do, "out": out, "lse": lse, "delta": delta}


def _runner(kernel: str, plan: AttentionPlan, x: dict) -> tuple[Callable[[], None], list]:
    """A closure launching one kernel of `plan` and the tensors it writes."""
    q, k, v, do, lse, delta = (x[n] for n in ("q", "k", "v", "do", "lse", "delta"))
    scale = 1.0 / math.sqrt(q.shape[-1])
    if kernel == "fwd":
        o, l2 = torch.empty_like(q), torch.empty_like(lse)
        return (lambda: attention_forward(q, k, v, True, out=o, lse=l2, plan=plan)), [o]
    if kernel == "dkdv":
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        return (lambda: launch_dkdv(plan, q, k, v, do, lse, delta, dk, dv, scale)), [dk, dv]
    dq = torch.empty_like(q)
    return (lambda: launch_dq(plan, q, k, v, do, lse, delta, dq, scale)), [dq]


def _warm(args: tuple[str, list[int], list[str]]) -> int:
    """Worker: launch the given variants once (compiles into Triton's disk cache)."""
    name, picks, kernels = args
    b, h, t, d = SHAPES[name]
    x = _inputs(b, h, t, d)
    variants = _variants(AttentionShape.of(x["q"], x["k"], True), kernels)
    for i in picks:
        kernel, plan = variants[i]
        try:
            _runner(kernel, plan, x)[0]()
        except Exception:  # noqa: BLE001 - the timing pass reports it
            pass
    torch.cuda.synchronize()
    return len(picks)


def _tiles(plan: AttentionPlan, kernel: str) -> Tiles:
    return {"fwd": plan.forward, "dkdv": plan.dkdv, "dq": plan.dq}[kernel]


def run_shape(name: str, kernels: list[str], jobs: int, meta: dict) -> list[dict]:
    import triton

    b, h, t, d = SHAPES[name]
    x = _inputs(b, h, t, d)
    shape = AttentionShape.of(x["q"], x["k"], True)
    base = plan_for(shape)
    variants = _variants(shape, kernels)
    if jobs > 1:
        ctx = mp.get_context("spawn")
        parts = [(name, list(range(i, len(variants), jobs)), kernels) for i in range(jobs)]
        with ctx.Pool(jobs) as pool:
            pool.map(_warm, parts)
    refs = {}
    for kernel in kernels:
        fn, outs = _runner(kernel, base, x)
        fn()
        refs[kernel] = [o.clone() for o in outs]
    rows = []
    for kernel, plan in variants:
        tiles = _tiles(plan, kernel)
        row = {"shape": name, "B": b, "H": h, "T": t, "d": d, "kernel": kernel}
        row |= {"block_m": tiles.block_m, "block_n": tiles.block_n}
        row |= {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
        row |= {"planner": tiles == _tiles(base, kernel)} | meta
        try:
            fn, outs = _runner(kernel, plan, x)
            fn()
            pairs = zip(outs, refs[kernel])
            err = max((o.float() - r.float()).abs().max().item() for o, r in pairs)
            row |= {"ms": triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")}
            row["max_diff_vs_planner"] = err
        except Exception as e:  # noqa: BLE001 - out of resources, say: a row with the error
            row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def _table(rows: list[dict]) -> None:
    for (shape, kernel), group in itertools.groupby(rows, lambda r: (r["shape"], r["kernel"])):
        ok = sorted((r for r in group if "ms" in r), key=lambda r: r["ms"])
        mine = [r for r in ok if r["planner"]]
        print(f"-- {shape} {kernel}: planner {mine[0]['ms']:.3f} ms" if mine else f"-- {shape}")
        for r in ok[:5]:
            print(
                f"   {r['ms']:.3f} ms  BLOCK_M={r['block_m']} BLOCK_N={r['block_n']} "
                f"warps={r['num_warps']} stages={r['num_stages']}  "
                f"diff {r['max_diff_vs_planner']:.1e}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="append JSON rows to this file")
    p.add_argument("--shape", action="append", default=[], choices=list(SHAPES))
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--jobs", type=int, default=1, help="processes compiling ahead")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_tiles needs a CUDA GPU")
    kernels = [k for k in a.kernels.split(",") if k]
    rows = []
    for name in a.shape or list(SHAPES):
        shape_rows = run_shape(name, kernels, a.jobs, run_meta())
        rows += shape_rows
        _table(shape_rows)
        if a.out:
            with open(a.out, "a") as f:
                for r in shape_rows:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
