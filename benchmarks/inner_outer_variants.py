"""LayerNorm / RMSNorm backward through fuser's Triton inner_outer kernel, its row loop
pipelined or not, beside torch.compile: does staging the loop's loads (plan.row_stages:
`tl.range(..., num_stages=N)`, the next steps' loads in flight through shared memory)
close the gap to the copy bandwidth, as it did for the outer reductions?

    PYTHONPATH=. python benchmarks/inner_outer_variants.py          # ~2 min on an H100
    PYTHONPATH=. python benchmarks/inner_outer_variants.py --cases gpt2:16384x768 --no-compile
    PYTHONPATH=. python benchmarks/inner_outer_variants.py --sass   # no GPU: sm_90 compiles

Cases (bf16 activations, fp32 parameters and statistics):
  gpt2  the GPT-2 training step's "_to_copy x2, native_layer_norm_backward, add" region:
        reads dy bf16, x fp32 (the residual stream), the residual gradient fp32; writes
        the new residual gradient fp32 and its bf16 cast, dw and db fp32
  ln    plain LayerNorm backward: x, dy bf16 -> dx bf16, dw, db fp32
  rms   RMSNorm backward: x, dy bf16 -> dx bf16, dw fp32
at 16384x768 (GPT-2 124M), 8192x1600 and 8192x4096.

Variants of fuser's kernel (each the fusion's own plan with one field forced, rendered
again and run through the same CompiledFusion; dataclasses.replace on the KernelPlan):
  fuser          the plan as fuser makes it now (row_stages from fuser/plan/build.py:
                 1 unless FUSER_INNER_OUTER_STAGES asks for more)
  stagesN        row_stages forced to N (2, 3, 4), the parameters staged too
  hoist          the column parameters (weights) loaded once before the loop
                 (fuser/codegen/triton/inner_outer.py HOIST_COLUMNS), not staged
  stagesN+hoist  both
  rpbR, rpbR+s3  the best-scored other layout of R rows a step (threads and warps
                 follow), as is and staged 3 deep
Each is checked against a float64 torch reference (fuser's bench tolerance per output),
then timed as fuser's benchmarks time (median, L2 flushed between repeats by reading
256 MB, CUDA events), finalize launch included. GB/s counts each tensor once. "fits"
says whether the compiled kernel's registers and shared memory leave room for the
blocks a SM its grid needs (grid / SMs): a persistent grid-stride kernel that does not
fit runs a second wave. "rule" is the row_stages fuser/plan/build.py would pick if asked
for the variant's depth (FUSER_INNER_OUTER_STAGES): its shared-memory budget lowers it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from types import SimpleNamespace

if "--sass" in sys.argv:  # the GPU form of the sources (no interpreter helpers)
    os.environ.setdefault("TRITON_INTERPRET", "0")

import torch

import fuser.codegen.triton.inner_outer as triton_inner_outer
from fuser.backends.registry import get_backend
from fuser.examples.norm_backward import norm_backward_fusion
from fuser.plan.build import make_plan
from fuser.runtime.kernel import Kernel
from fuser.schedulers.device import get_device
from fuser.schedulers.heuristics import vector_width
from fuser.schedulers.inner_outer import layouts, score

F32, BF16 = torch.float32, torch.bfloat16
CASES = [f"{k}:{s}" for k in ("gpt2", "ln", "rms") for s in ("16384x768", "8192x1600", "8192x4096")]
STAGES = (2, 3, 4)
EPS = 1e-5

# -- the fusions, as fuser's lowering of native_layer_norm_backward writes them ----------


fusion = norm_backward_fusion  # dy, x, w, [mean], rstd, [dh] -> the backward of `kind`


def make_inputs(kind: str, rows: int, cols: int, device: str) -> list[torch.Tensor]:
    """dy, x, w, [mean], rstd, [dh]: the statistics are x's own (as the forward saved)."""
    g = torch.Generator(device="cpu").manual_seed(rows * 7919 + cols)
    x = torch.randn(rows, cols, generator=g) * 2 + 0.5
    x = x if kind == "gpt2" else x.to(BF16)
    dy = torch.randn(rows, cols, generator=g).to(BF16)
    w = torch.randn(cols, generator=g) * 0.1 + 1
    xf = x.float()
    mean = xf.mean(1)
    var = (xf * xf).mean(1) if kind == "rms" else xf.var(1, unbiased=False)
    rstd = torch.rsqrt(var + EPS)
    ins = [dy, x, w] + ([] if kind == "rms" else [mean]) + [rstd]
    if kind == "gpt2":
        ins.append(torch.randn(rows, cols, generator=g))
    return [t.to(device) for t in ins]


def meta_inputs(kind: str, rows: int, cols: int) -> list[torch.Tensor]:
    """make_inputs' shapes and dtypes, on the meta device."""
    small = make_inputs(kind, 3, cols, "cpu")  # 3 rows: the row statistics are (3,)
    shape = {(3, cols): (rows, cols), (3,): (rows,), (cols,): (cols,)}
    return [torch.empty(shape[tuple(t.shape)], dtype=t.dtype, device="meta") for t in small]


def unpack(kind: str, ins: list[torch.Tensor]):
    dy, x, w = ins[:3]
    mean = None if kind == "rms" else ins[3]
    rstd = ins[3] if kind == "rms" else ins[4]
    dh = ins[5] if kind == "gpt2" else None
    return dy, x, w, mean, rstd, dh


def backward(kind: str, ins: list[torch.Tensor], dt: torch.dtype) -> list[torch.Tensor]:
    """The backward in torch, computed in `dt` (float64: the reference; float32: what
    torch.compile is given), outputs in fuser's order and dtypes."""
    dy, x, w, mean, rstd, dh = unpack(kind, ins)
    g, xf, n = dy.to(dt), x.to(dt), x.shape[1]
    xhat = (xf if mean is None else xf - mean.to(dt)[:, None]) * rstd.to(dt)[:, None]
    wg = g * w.to(dt)
    inner = wg - xhat * ((wg * xhat).sum(1, keepdim=True) / n)
    if mean is not None:
        inner = inner - wg.sum(1, keepdim=True) / n
    dx = rstd.to(dt)[:, None] * inner
    if dh is not None:  # the new residual gradient and its bf16 cast
        dx = dh.to(dt) + dx
        outs = [dx.float(), dx.to(BF16)]
    else:
        outs = [dx.to(BF16)]
    outs.append((g * xhat).sum(0).float())
    if mean is not None:
        outs.append(g.sum(0).float())
    return outs


def nbytes(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in [*ins, *outs])


def mismatches(got: list[torch.Tensor], ref: list[torch.Tensor], rows: int, cols: int) -> str:
    """fuser's bench tolerance per output: the row outputs reduce cols terms, dw and db
    rows terms."""
    from fuser.bench.measure import mismatch

    bad = []
    for i, (g, r) in enumerate(zip(got, ref)):
        length = cols if g.dim() == 2 else rows
        why = mismatch(SimpleNamespace(reduction_length=length), [g], [r])
        if why:
            bad.append(f"output {i}: {why.split(': ', 1)[-1]}")
    return "; ".join(bad)


# -- the variants ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    kernel: Kernel
    rule: int  # the row_stages build.py picks when asked for this depth
    why: str


def render(k: Kernel, schedule, stages: int, hoist: bool) -> Kernel:
    """`k`'s kernel under `schedule` with row_stages forced, HOIST_COLUMNS as asked."""
    plan = make_plan(k.spec, schedule)
    plan = dataclasses.replace(plan, row_stages=stages)
    b = get_backend("triton")
    before = triton_inner_outer.HOIST_COLUMNS
    triton_inner_outer.HOIST_COLUMNS = hoist
    try:
        source = b.render(plan)
    finally:
        triton_inner_outer.HOIST_COLUMNS = before
    return Kernel(k.spec, schedule, source, b.name, plan=plan)


def rule_stages(k: Kernel, schedule, asked: int) -> int:
    from fuser.config import config

    before = config.inner_outer_stages
    config.inner_outer_stages = asked
    try:
        return make_plan(k.spec, schedule).row_stages
    finally:
        config.inner_outer_stages = before


def other_layouts(k: Kernel, dev) -> list:
    """The best-scored layout of each rows-a-step count other than the chosen one's."""
    spec, chosen = k.spec, k.schedule
    backend = get_backend("triton")
    v = vector_width(spec, [])
    best: dict[int, tuple[float, object]] = {}
    for vv in sorted({v, max(v // 2, 1)}):
        for c in layouts(spec, dev, vv, backend)[0]:
            sc = score(spec, c, backend)[0]
            if (
                c.rows_per_block != chosen.rows_per_block
                and sc > best.get(c.rows_per_block, (-1.0, None))[0]
            ):
                best[c.rows_per_block] = (sc, c.schedule)
    return [s for _, (_, s) in sorted(best.items())][:2]


def variants(k: Kernel, dev) -> list[Variant]:
    s = k.schedule
    out = [Variant("fuser", k, k.plan.row_stages, s.short())]
    for n in STAGES:
        out.append(Variant(f"stages{n}", render(k, s, n, False), rule_stages(k, s, n), ""))
    out.append(Variant("hoist", render(k, s, 1, True), 1, "weights loaded before the loop"))
    for n in (2, 3):
        out.append(Variant(f"stages{n}+hoist", render(k, s, n, True), rule_stages(k, s, n), ""))
    for o in other_layouts(k, dev):
        tag = f"rpb{o.rows_per_block}"
        why = o.short()
        out.append(Variant(tag, render(k, o, 1, False), 1, why))
        out.append(Variant(f"{tag}+s3", render(k, o, 3, False), rule_stages(k, o, 3), why))
    return out


def with_kernel(plan, idx: int, kernel: Kernel):
    return dataclasses.replace(plan, kernels={**plan.kernels, idx: kernel})


# -- offline: what ptxas makes of each variant (no GPU) ----------------------------------


def compiled_sm90(k: Kernel) -> dict:
    """Registers, spills, Triton's shared memory and the staged copies in the row loop,
    compiled for sm_90 here."""
    import importlib.util
    import pathlib
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fuser.runtime.resources import _job, cubin_resources
    from fuser.runtime.triton_backend import TRITON_OPTIONS

    job = _job(k, "sm_90")
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / f"{job['name']}.py"
        path.write_text(job["source"])
        spec = importlib.util.spec_from_file_location(f"_v_{job['name']}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        attrs = {(i,): [["tt.divisibility", 16]] for i in job["aligned"]}
        src = ASTSource(
            fn=getattr(mod, job["name"]), signature=job["signature"], constexprs={}, attrs=attrs
        )
        c = triton.compile(
            src,
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": job["num_warps"], **TRITON_OPTIONS},
        )
    res = next(iter(cubin_resources(c.asm["cubin"]).values()))
    ttgir = c.asm["ttgir"]
    loop = ttgir[ttgir.index("scf.for") :]
    return {
        "registers": res["registers"],
        "spills": res["stack"] + res["local"],
        "shared": c.metadata.shared,
        "async_copies": loop.count("async_copy_global_to_local"),
    }


def resident(regs: int, shared: int, threads: int, dev) -> int:
    """Blocks a SM holds at `regs` registers and `shared` bytes (1 KB a block reserved)."""
    return dev.blocks_per_sm(threads, regs, shared + 1024 if shared else 0)


def sass_report(cases: list[str]) -> None:
    dev = get_device("h100")
    print("sm_90 (H100 preset), compiled here; fits: blocks a SM the kernel holds >= grid / SMs")
    print("| case | variant | schedule | row_stages | rule | regs | spills | shared B | copies | "
          "blocks/SM held / needed |")  # fmt: skip
    print("|---" * 10 + "|")
    for case in cases:
        kind, shape = case.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
        (k,) = fusion(kind, cols).compile(meta_inputs(kind, rows, cols), dev, "triton")
        for v in variants(k, dev):
            r = compiled_sm90(v.kernel)
            s = v.kernel.schedule
            held = resident(r["registers"], r["shared"], s.threads, dev)
            need = -(-s.grid[0] // dev.sms)
            print(
                f"| {case} | {v.name} | {s.short()} | {v.kernel.plan.row_stages} | {v.rule} | "
                f"{r['registers']} | {r['spills']} | {r['shared']} | {r['async_copies']} | "
                f"{held} / {need}{'' if held >= need else ' (2 waves)'} |"
            )


# -- GPU timing --------------------------------------------------------------------------


def time_case(case: str, with_compile: bool) -> list[dict]:
    from fuser.bench.measure import bench_ms
    from fuser.runtime.precompile import precompile

    kind, shape = case.split(":")
    rows, cols = (int(v) for v in shape.split("x"))
    dev = get_device(None)
    props = torch.cuda.get_device_properties(0)
    ins = make_inputs(kind, rows, cols, "cuda")
    ref = backward(kind, ins, torch.float64)
    moved = nbytes(ins, ref)
    fd = fusion(kind, cols)
    fd.execute(ins, backend="triton")
    plan = fd._runtime().last
    (idx,) = [i for i, k in plan.kernels.items() if k.schedule.kind == "inner_outer"]
    vs = variants(plan.kernels[idx], dev)
    precompile([v.kernel for v in vs], "cuda")
    out: list[dict] = []

    def emit(name: str, ms: float | None, **extra) -> None:
        gbps = moved / ms / 1e6 if ms else None
        out.append({"case": case, "variant": name, "ms": ms, "gbps": gbps, **extra})
        tail = extra.get("error") or ""
        print(f"  {case} {name}: {ms and round(ms, 4)} ms {tail}", file=sys.stderr)

    for v in vs:
        cf = with_kernel(plan, idx, v.kernel)
        try:
            got = cf.run(ins)
            torch.cuda.synchronize()
            wrong = mismatches(got, ref, rows, cols)
            ms = bench_ms(lambda cf=cf: cf.run(ins))
        except Exception as e:  # a variant Triton rejects is reported, not fatal
            emit(v.name, None, error=f"{type(e).__name__}: {str(e)[:150]}")
            continue
        ck = v.kernel._compiled
        s = v.kernel.schedule
        regs, shared = getattr(ck, "n_regs", 0), ck.metadata.shared if ck else 0
        held = resident(regs, shared, s.threads, dev)
        need = -(-s.grid[0] // props.multi_processor_count)
        emit(
            v.name,
            ms,
            ok=not wrong,
            error=wrong,
            stages=v.kernel.plan.row_stages,
            rule=v.rule,
            regs=regs,
            shared=shared,
            fits=f"{held}/{need}",
            schedule=s.short(),
            why=v.why,
        )
    if with_compile:
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: backward(kind, t, torch.float32), dynamic=False)
        got = compiled(ins)
        emit(
            "torch.compile",
            bench_ms(lambda: compiled(ins)),
            ok=not mismatches(got, ref, rows, cols),
            error=mismatches(got, ref, rows, cols),
            why="Inductor, the same math in fp32",
        )
    return out


def print_table(rows_out: list[dict], ceiling: float) -> None:
    print(f"\n{torch.cuda.get_device_name()}; copy {ceiling:.0f} GB/s; ms with the L2 flushed")
    cols = ["case", "variant", "ms", "GB/s", "% copy", "vs fuser", "ok", "row_stages", "rule"]
    cols += ["regs", "shared B", "blocks/SM held/needed", "schedule / note"]
    print("| " + " | ".join(cols) + " |")
    print("|---" * len(cols) + "|")
    base = {r["case"]: r["ms"] for r in rows_out if r["variant"] == "fuser"}
    for r in rows_out:
        if r["ms"] is None:
            print(f"| {r['case']} | {r['variant']} | - | - | - | - | error: {r.get('error')} |")
            continue
        ref = base.get(r["case"])
        speedup = f"{ref / r['ms']:.2f}x" if ref else "-"
        ok = "yes" if r.get("ok") else f"NO: {r.get('error')}"
        print(
            f"| {r['case']} | {r['variant']} | {r['ms']:.4f} | {r['gbps']:.0f} | "
            f"{r['gbps'] / ceiling:.0%} | {speedup} | {ok} | "
            f"{r.get('stages', '')} | {r.get('rule', '')} | {r.get('regs', '')} | "
            f"{r.get('shared', '')} | {r.get('fits', '')} | "
            f"{' '.join(x for x in (r.get('schedule'), r.get('why')) if x)} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="kind:ROWSxCOLS, comma-separated")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--sass", action="store_true", help="no GPU: sm_90 registers/shared")
    ap.add_argument("--out", default=None, help="write the rows as JSON lines here")
    args = ap.parse_args()
    cases = args.cases.split(",")
    bad = [c for c in cases if c.split(":")[0] not in ("gpt2", "ln", "rms") or ":" not in c]
    if bad:
        print(f"unknown cases {bad}: kind:ROWSxCOLS with kind gpt2, ln or rms")
        return 2
    if args.sass:
        sass_report(cases)
        return 0
    if not torch.cuda.is_available():
        print("inner_outer_variants: needs a CUDA GPU (or --sass)")
        return 2
    from fuser.bench.measure import copy_gbps

    ceiling = copy_gbps()
    rows_out: list[dict] = []
    for case in cases:
        rows_out += time_case(case, not args.no_compile)
    print_table(rows_out, ceiling)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows_out:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
