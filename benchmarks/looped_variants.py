"""Variants of fuser's Triton inner looped kernels (rows too long for registers, walked a
chunk at a time), timed beside fuser as it is, eager and torch.compile: does pipelining the
row walk (plan.walk_stages: `tl.range(..., num_stages=n)`, the next iterations' loads
staged in shared memory by cp.async) pay, and where?

    PYTHONPATH=. python benchmarks/looped_variants.py --out $OUT/looped.jsonl   # GPU
    PYTHONPATH=. python benchmarks/looped_variants.py --cases ce16384 --variants fuser,st3
    PYTHONPATH=. python benchmarks/looped_variants.py --stages 3    # "fuser" planned with 3
    PYTHONPATH=. python benchmarks/looped_variants.py --sass --cases ce16384   # no GPU

On an H100 (estimated, not yet run: ~170 kernels compiled ahead in 16 processes, 8 cases
of ~20 timed variants, 8 torch.compile's) about 2-3 minutes.

Cases (CASES): the cross-entropy forward of a GPT-2 step, as torch.compile(backend="fuser")
makes it of fuser::cross_entropy (fuser/dynamo/ce_lower.py): loss (mean, ignore_index -100)
and the gradient (softmax - onehot) / count in bf16, the logits bf16 [N, V] (V 50257: a
slice of [N, 50264] rows, as pad_mm.py leaves the lm head's; V 32000: contiguous), the
gradient in 16-byte aligned rows; and softmax / log_softmax over 8192 x 50257 rows, fp32
and bf16. Each is checked against eager (fuser's bench tolerance) and timed as fuser's
benchmarks time (fuser.bench.measure.bench_ms: median, L2 flushed by reading 256 MB, CUDA
events). GB/s counts the logits (input) read once and the gradient (output) written once;
"copy" is a 1 GiB device-to-device copy in the same run.

Variants (VARIANTS): `fuser` is the heuristic's plan as fuser runs it (--stages, or
FUSER_LOOPED_STAGES, sets config.looped_stages for it); the others replace its row kernel
with one rendered by fuser's own Triton renderer from a looped schedule (the heuristic's,
or schedule_looped's where the heuristic keeps the row in registers) with walk_stages
forced (stN), Triton's loop_unroll_factor on every row loop (luN: a source edit), other
chunk widths and warps (wWuU: 32 W threads x vector x U columns an iteration), the staged
walk with its loads addressed from `cols` as before looped.py's Chunk.split (st3-cols: a
source edit; more registers on sm_90), the aligned-start walk where the rows start
unaligned (aw), and a hand-written persistent kernel holding the whole row in registers
(persist1024: 1024 threads, the row padded to 65536 columns). --sass compiles them all
for sm_90 without a GPU: registers, spills, shared memory, the cp.async copies (LDGSTS)
that show a pipelined loop, resident blocks a SM.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from types import SimpleNamespace

if "--sass" in sys.argv:  # render the GPU's sources (not the interpreter's) on a CPU machine
    os.environ.setdefault("TRITON_INTERPRET", "0")

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fuser import FusionDefinition
from fuser.backends.registry import get_backend
from fuser.bench.measure import bench_ms, copy_gbps, mismatch
from fuser.config import config
from fuser.dynamo.ce_op import grad_row_stride
from fuser.dynamo.ce_region import one_pass_fusion
from fuser.plan.build import make_plan
from fuser.runtime.executor import CompiledFusion
from fuser.runtime.kernel import Kernel
from fuser.runtime.precompile import warmup_args
from fuser.runtime.triton_backend import TRITON_OPTIONS, load_module
from fuser.schedulers.device import PRESETS, Device, get_device
from fuser.schedulers.heuristics import aligned_walk_vector, schedule_looped
from fuser.schedulers.schedule import Schedule

BF16, F32 = torch.bfloat16, torch.float32
PERSIST_WARPS = 32  # 1024 threads: the most a block has


# -- cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseDef:
    name: str
    op: str  # cross_entropy | softmax | log_softmax
    rows: int
    cols: int
    stride: int  # the logits' row stride
    dtype: torch.dtype


CASES = {
    c.name: c
    for c in [
        CaseDef("ce16384", "cross_entropy", 16384, 50257, 50264, BF16),
        CaseDef("ce8192", "cross_entropy", 8192, 50257, 50264, BF16),
        CaseDef("ce8192c", "cross_entropy", 8192, 50257, 50257, BF16),  # odd rows: vector 1
        CaseDef("ce32768c", "cross_entropy", 32768, 50257, 50257, BF16),
        CaseDef("ce16384x32000", "cross_entropy", 16384, 32000, 32000, BF16),
        CaseDef("ce8192x32000", "cross_entropy", 8192, 32000, 32000, BF16),
        CaseDef("softmax-f32", "softmax", 8192, 50257, 50257, F32),
        CaseDef("softmax-bf16", "softmax", 8192, 50257, 50257, BF16),
        CaseDef("logsoftmax-f32", "log_softmax", 8192, 50257, 50257, F32),
        CaseDef("logsoftmax-bf16", "log_softmax", 8192, 50257, 50257, BF16),
    ]
}


def definition(c: CaseDef, x: torch.Tensor, t: torch.Tensor | None) -> FusionDefinition:
    """The fusion of case `c` for inputs laid out as `x` (and targets `t`), real or meta."""
    if c.op != "cross_entropy":
        with FusionDefinition(c.op) as fd:
            fd.add_output(getattr(fd.ops, c.op)(fd.define_tensor([-1, -1], c.dtype)))
        return fd
    # the region torch.compile(backend="fuser") lowers for fuser::cross_entropy
    return one_pass_fusion(x, t)


def inputs(c: CaseDef, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(c.rows * 7919 + c.cols)
    if device == "meta":
        x = torch.empty_strided((c.rows, c.cols), (c.stride, 1), dtype=c.dtype, device="meta")
        t = torch.empty(c.rows, dtype=torch.int64, device="meta")
        return [x, t] if c.op == "cross_entropy" else [x]
    base = (torch.randn(c.rows, c.stride, generator=g) * 2).to(c.dtype).to(device)
    x = base[:, : c.cols]
    if c.op != "cross_entropy":
        return [x]
    t = torch.randint(0, c.cols, (c.rows,), generator=g)
    t[::61] = -100  # a few ignored rows
    return [x, t.to(device)]


def torch_fn(c: CaseDef, compiled: bool) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """Case `c` by eager PyTorch, or by torch.compile (Inductor) of the same code."""

    def wrap(fn: Callable) -> Callable:
        return torch.compile(fn, dynamic=False) if compiled else fn

    if compiled:
        torch._dynamo.reset()
    if c.op != "cross_entropy":
        fn = wrap(getattr(torch, c.op))
        return lambda ins: [fn(ins[0], dim=-1)]
    loss_fn = wrap(lambda x, t: F.cross_entropy(x.float(), t))

    def fwd_bwd(ins: list[torch.Tensor]) -> list[torch.Tensor]:
        x = ins[0].detach().requires_grad_(True)
        loss = loss_fn(x, ins[1])  # the gradient comes back in the logits' bf16
        return [loss.detach(), torch.autograd.grad(loss, x)[0]]

    return fwd_bwd


# -- the hand-written persistent kernels ------------------------------------------------


@triton.jit
def ce_persistent(x_ptr, t_ptr, loss_ptr, g_ptr, count_ptr, V: tl.constexpr,
                  XS: tl.constexpr, GS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # the whole row in registers (kept in its own dtype); the gradient recomputes its exp
    # from lse so that the first pass's exps die early
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < V
    x = tl.load(x_ptr + row * XS + cols, mask=ok, other=float("-inf"))
    t = tl.load(t_ptr + row)
    xf = x.to(tl.float32)
    m = tl.max(xf, 0)
    lse = m + tl.log(tl.sum(tl.exp(xf - m), 0))
    hit = cols == t
    valid = t != -100
    picked = tl.sum(tl.where(hit, xf, 0.0), 0)
    tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
    scale = tl.where(valid, 1.0 / tl.load(count_ptr), 0.0)
    grad = (tl.exp(xf - lse) - hit.to(tl.float32)) * scale
    tl.store(g_ptr + row * GS + cols, grad.to(g_ptr.dtype.element_ty), mask=ok)


@triton.jit
def softmax_persistent(x_ptr, y_ptr, V: tl.constexpr, BLOCK: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < V
    xf = tl.load(x_ptr + row * V + cols, mask=ok, other=float("-inf")).to(tl.float32)
    m = tl.max(xf, 0)
    lse = m + tl.log(tl.sum(tl.exp(xf - m), 0))
    y = xf - lse if LOG else tl.exp(xf - lse)
    tl.store(y_ptr + row * V + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


def persistent_job(c: CaseDef) -> tuple[Callable, dict, list]:
    """(kernel, constexprs, the warmup's argument dtypes) of case `c`'s persistent kernel."""
    block = triton.next_power_of_2(c.cols)
    if c.op == "cross_entropy":
        consts = dict(V=c.cols, XS=c.stride, GS=grad_stride(c), BLOCK=block)
        return ce_persistent, consts, [c.dtype, torch.int64, F32, c.dtype, F32]
    consts = dict(V=c.cols, BLOCK=block, LOG=c.op == "log_softmax")
    return softmax_persistent, consts, [c.dtype, c.dtype]


def grad_stride(c: CaseDef) -> int:
    return grad_row_stride(c.cols, c.dtype)


def run_persistent(c: CaseDef) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    fn, consts, _ = persistent_job(c)
    opts = dict(num_warps=PERSIST_WARPS, **TRITON_OPTIONS)
    if c.op != "cross_entropy":

        def softmax(ins: list[torch.Tensor]) -> list[torch.Tensor]:
            y = torch.empty(c.rows, c.cols, dtype=c.dtype, device=ins[0].device)
            fn[(c.rows,)](ins[0], y, **consts, **opts)
            return [y]

        return softmax

    def ce(ins: list[torch.Tensor]) -> list[torch.Tensor]:
        x, t = ins
        count = (t != -100).sum().float()
        rows = torch.empty(c.rows, dtype=F32, device=x.device)
        g = torch.empty_strided(
            (c.rows, c.cols), (grad_stride(c), 1), dtype=c.dtype, device=x.device
        )
        fn[(c.rows,)](x, t, rows, g, count, **consts, **opts)
        return [rows.sum() / count, g]

    return ce


# -- variants of fuser's row kernel -------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    why: str
    kind: str = "looped"  # fuser | looped | persistent | eager | compile
    warps: int = 0  # 0: the base looped schedule's
    unroll: int = 0  # chunks an iteration (0: the base's)
    stages: int = 1  # walk_stages, forced
    lu: int = 0  # tl.range loop_unroll_factor on every row loop (source edit)
    cols_loads: bool = False  # staged loads addressed from cols (source edit)
    align: bool = False  # the aligned-start walk


V = Variant
VARIANTS = [
    V("fuser", "the heuristic's plan as fuser runs it", kind="fuser"),
    V("loop", "the base looped schedule, unpipelined (the heuristic's, if it loops)"),
    V("st2", "walk_stages 2", stages=2),
    V("st3", "walk_stages 3", stages=3),
    V("st4", "walk_stages 4", stages=4),
    V("st3-cols", "walk_stages 3, loads addressed from cols", stages=3, cols_loads=True),
    V("lu2", "loop_unroll_factor 2", lu=2),
    V("st3+lu2", "walk_stages 3 + loop_unroll_factor 2", stages=3, lu=2),
    V("w8u1", "8 warps, 1 chunk an iteration", warps=8, unroll=1),
    V("w8u1-st3", "8 warps, 1 chunk, walk_stages 3", warps=8, unroll=1, stages=3),
    V("w8u4", "8 warps, 4 chunks an iteration", warps=8, unroll=4),
    V("w8u4-st2", "8 warps, 4 chunks, walk_stages 2", warps=8, unroll=4, stages=2),
    V("w4u2", "4 warps, 2 chunks an iteration", warps=4, unroll=2),
    V("w4u2-st3", "4 warps, 2 chunks, walk_stages 3", warps=4, unroll=2, stages=3),
    V("w8u8", "8 warps, 8 chunks an iteration", warps=8, unroll=8),
    V("w8u8-st3", "8 warps, 8 chunks, walk_stages 3", warps=8, unroll=8, stages=3),
    V("w8u16", "8 warps, 16 chunks an iteration", warps=8, unroll=16),
    V("w8u4-st3", "8 warps, 4 chunks, walk_stages 3", warps=8, unroll=4, stages=3),
    V("w4u16", "4 warps, 16 chunks an iteration", warps=4, unroll=16),
    V("w16u1", "16 warps, 1 chunk an iteration", warps=16, unroll=1),
    V("w16u1-st3", "16 warps, 1 chunk, walk_stages 3", warps=16, unroll=1, stages=3),
    V("aw", "aligned-start walk (odd contiguous rows only)", align=True),
    V("aw-st3", "aligned-start walk, walk_stages 3", align=True, stages=3),
    V("persist1024", "whole row in registers, 1024 threads (hand-written)", kind="persistent"),
    V("eager", "PyTorch eager", kind="eager"),
    V("torch.compile", "Inductor", kind="compile"),
]
VARIANT = {v.name: v for v in VARIANTS}
LOOP_HEAD = re.compile(r"for off in (?:tl\.)?range\((.*)\):")
# a staged walk's load or store from the scalar offset (looped.py's Chunk.split), and the
# form before it: from `cols`, or an aligned walk's `pos`
SPLIT_LOAD = re.compile(
    r"(\w+_ptr) \+ (row_base\w* \+ )?off \+ (rows \* \d+ \+ )?tl\.arange\(0, \d+\)\[None, :\]"
)


def cols_addressed(m: re.Match) -> str:
    return f"{m[1]} + {m[2]}pos" if m[2] else f"{m[1]} + {m[3] or ''}cols"


def row_kernel(cf: CompiledFusion) -> int:
    return max(cf.kernels, key=lambda i: cf.kernels[i].spec.cols)


def base_schedule(k: Kernel, dev: Device) -> Schedule:
    """The heuristic's schedule if it loops, else schedule_looped's for the row kernel."""
    if k.schedule.kind == "inner_looped":
        return k.schedule
    return schedule_looped(k.spec, dev, k.schedule.vector, [], backend="triton")


def variant_kernel(v: Variant, k: Kernel, dev: Device) -> Kernel | None:
    """Row kernel `k` rendered as variant `v` (None where `v` does not apply)."""
    s0 = base_schedule(k, dev)
    vec = s0.vector
    if v.align:
        vec = aligned_walk_vector(k.spec, s0.vector)
        if vec == s0.vector:
            return None
    s = s0
    if v.warps or v.unroll or v.align:
        warps, unroll = v.warps or s0.num_warps, v.unroll or s0.unroll
        s = schedule_looped(k.spec, dev, vec, [], warps, unroll, "triton", v.align)
    plan = replace(make_plan(k.spec, s), walk_stages=v.stages)
    src = get_backend("triton").render(plan)
    if v.lu:
        src = LOOP_HEAD.sub(
            lambda m: f"for off in tl.range({m[1]}, loop_unroll_factor={v.lu}):", src
        )
    if v.cols_loads:
        src = SPLIT_LOAD.sub(cols_addressed, src)
    return Kernel(k.spec, s, src, "triton", plan=plan)


def describe(k: Kernel, v: Variant | None = None) -> str:
    edits = (
        (f" lu{v.lu}" if v.lu else "") + (" cols-addressed" if v.cols_loads else "") if v else ""
    )
    return f"{k.schedule.short()} st{k.plan.walk_stages}{edits}"


def variant_kernels(cf: CompiledFusion, names: list[str], dev: Device) -> dict[str, Kernel]:
    k = cf.kernels[row_kernel(cf)]
    out: dict[str, Kernel] = {}
    for v in VARIANTS:
        if v.name in names and v.kind == "looped":
            kv = variant_kernel(v, k, dev)
            if kv is not None and not (v.name == "loop" and kv.source == k.source):
                out[v.name] = kv
    return out


# -- compiling ahead, in worker processes -------------------------------------------------


def _warm(job: tuple) -> str:
    """Worker: compile one kernel into Triton's disk cache (nothing launched)."""
    try:
        if job[0] == "fuser":
            _, source, name, args, grid, warps = job
            fn = getattr(load_module(source, False), name)
            fn.warmup(*args, grid=grid, num_warps=warps, **TRITON_OPTIONS)
        else:
            c = CASES[job[1]]
            fn, consts, dtypes = persistent_job(c)
            opts = dict(num_warps=PERSIST_WARPS, **TRITON_OPTIONS)
            fn.warmup(*dtypes, grid=(c.rows,), **consts, **opts)
    except Exception as e:  # reported again where the main process launches it
        return f"{job[:2]}: {type(e).__name__}"
    return ""


def warm_all(jobs: list[tuple], n: int) -> None:
    if n <= 1 or not jobs:
        return
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        for err in pool.map(_warm, jobs):
            if err:
                print(f"  warm-up failed: {err}", file=sys.stderr)


def fuser_job(k: Kernel) -> tuple:
    return ("fuser", k.source, k.name, warmup_args(k), k.plan.grid, k.plan.num_warps)


# -- GPU timing ---------------------------------------------------------------------------


def time_case(c: CaseDef, names: list[str], dev: Device, with_compile: bool) -> list[dict]:
    ins = inputs(c, "cuda")
    fd = definition(c, *ins) if c.op == "cross_entropy" else definition(c, ins[0], None)
    ref = torch_fn(c, False)(ins)
    fd.execute(ins, backend="triton")
    cf = fd._runtime().last
    idx = row_kernel(cf)
    nbytes = 2 * c.rows * c.cols * c.dtype.itemsize  # the logits read, the output written
    out: list[dict] = []
    ns = SimpleNamespace(reduction_length=c.cols)  # all mismatch() reads of a bench Case

    def emit(name: str, fn: Callable[[], list[torch.Tensor]], what: str) -> None:
        try:
            wrong = mismatch(ns, fn(), ref)
            ms = bench_ms(fn)
        except Exception as e:  # a variant Triton rejects is reported, not fatal
            out.append({"case": c.name, "variant": name, "ms": None, "what": what,
                        "error": f"{type(e).__name__}: {str(e)[:160]}"})  # fmt: skip
            print(f"  {c.name} {name}: {out[-1]['error']}", file=sys.stderr)
            return
        row = {"case": c.name, "variant": name, "ms": ms, "gbps": nbytes / ms / 1e6}
        out.append(row | {"ok": wrong is None, "error": wrong, "what": what})
        print(f"  {c.name} {name}: {ms:.4f} ms {wrong or ''}", file=sys.stderr)

    kernels = variant_kernels(cf, names, dev)
    for v in VARIANTS:
        if v.name not in names:
            continue
        if v.kind == "fuser":
            emit(v.name, lambda: fd.execute(ins, backend="triton"), describe(cf.kernels[idx]))
        elif v.kind == "looped" and v.name in kernels:
            vcf = replace(cf, kernels={**cf.kernels, idx: kernels[v.name]})
            emit(v.name, lambda vcf=vcf: vcf.run(ins), describe(kernels[v.name], v))
        elif v.kind == "persistent":
            fn = run_persistent(c)
            emit(v.name, lambda fn=fn: fn(ins), f"1 row a block, {PERSIST_WARPS} warps")
        elif v.kind == "eager" or (v.kind == "compile" and with_compile):
            fn = torch_fn(c, v.kind == "compile")
            emit(v.name, lambda fn=fn: fn(ins), v.why)
    return out


def print_table(rows: list[dict], ceiling: float) -> None:
    print(f"\n{torch.cuda.get_device_name()}; copy {ceiling:.0f} GB/s; ms with the L2 flushed")
    print("| case | variant | ms | GB/s | % copy | vs fuser | ok | kernel |")
    print("|---|---|---|---|---|---|---|---|")
    base = {r["case"]: r["ms"] for r in rows if r["variant"] == "fuser" and r["ms"]}
    for r in rows:
        if r["ms"] is None:
            print(f"| {r['case']} | {r['variant']} | - | - | - | - | error: {r['error']} | |")
            continue
        vs = f"{base[r['case']] / r['ms']:.2f}x" if r["case"] in base else "-"
        ok = "yes" if r["ok"] else f"NO: {r['error']}"
        print(
            f"| {r['case']} | {r['variant']} | {r['ms']:.4f} | {r['gbps']:.0f} | "
            f"{r['gbps'] / ceiling:.0%} | {vs} | {ok} | {r['what']} |"
        )


# -- --sass: what ptxas makes of each variant, no GPU -------------------------------------


def _sass_info(job: tuple) -> dict:
    """Worker: compile one kernel for sm_90; its registers, stack, shared memory and
    cp.async copies (LDGSTS: the pipelined loads)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fuser.runtime.resources import cubin_resources, sass

    try:
        if job[0] == "fuser":
            _, src_job = job
            source, name = src_job["source"], src_job["name"]
            fn = getattr(load_module(source, False), name)
            attrs = {(i,): [["tt.divisibility", 16]] for i in src_job["aligned"]}
            src = ASTSource(fn=fn, signature=src_job["signature"], constexprs={}, attrs=attrs)
            warps = src_job["num_warps"]
        else:
            fn, consts, dtypes = persistent_job(CASES[job[1]])
            ptr = {BF16: "*bf16", F32: "*fp32", torch.int64: "*i64"}
            names = fn.arg_names[: len(dtypes)]
            sig = {n: ptr[d] for n, d in zip(names, dtypes)} | {k: "constexpr" for k in consts}
            attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(dtypes))}
            src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
            warps = PERSIST_WARPS
        opts = {"num_warps": warps, **TRITON_OPTIONS}
        ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    except Exception as e:
        lines = [x for x in str(e).strip().splitlines() if x.strip()]
        return {"error": f"{type(e).__name__}: {lines[-1][:160] if lines else ''}"}
    cubin = ck.asm["cubin"]
    r = next(iter(cubin_resources(cubin).values()))
    code = sass(cubin)
    return {"regs": r["registers"], "stack": r["stack"], "shared": ck.metadata.shared,
            "ldgsts": code.count("LDGSTS"), "warps": warps}  # fmt: skip


def sass_report(case_names: list[str], names: list[str], jobs: int) -> None:
    from fuser.runtime.resources import _job  # the signature fuser's resources() compiles

    dev = PRESETS["h100"]
    work: list[tuple[str, str, str, tuple]] = []
    for cname in case_names:
        c = CASES[cname]
        ins = inputs(c, "meta")
        fd = definition(c, *ins) if c.op == "cross_entropy" else definition(c, ins[0], None)
        fd.compile(ins, "h100", "triton")
        cf = fd._runtime().last
        k = cf.kernels[row_kernel(cf)]
        if "fuser" in names:
            work.append((cname, "fuser", describe(k), ("fuser", _job(k, "sm_90"))))
        for vname, kv in variant_kernels(cf, names, dev).items():
            what = describe(kv, VARIANT[vname])
            work.append((cname, vname, what, ("fuser", _job(kv, "sm_90"))))
        if "persist1024" in names:
            work.append((cname, "persist1024", f"{PERSIST_WARPS} warps", ("persistent", cname)))
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            infos = list(pool.map(_sass_info, [w[3] for w in work]))
    else:
        infos = [_sass_info(w[3]) for w in work]
    print("sm_90 (no GPU; the h100 preset's plans): registers, stack, shared memory, cp.async")
    print("| case | variant | kernel | regs | stack | shared | LDGSTS | blocks/SM |")
    print("|---|---|---|---|---|---|---|---|")
    for (cname, vname, what, _), info in zip(work, infos):
        if "error" in info:
            print(f"| {cname} | {vname} | {what} | error: {info['error']} |")
            continue
        blocks = dev.blocks_per_sm(info["warps"] * 32, info["regs"], info["shared"])
        print(
            f"| {cname} | {vname} | {what} | {info['regs']} | {info['stack']} | "
            f"{info['shared']} | {info['ldgsts']} | {blocks} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--variants", default=",".join(v.name for v in VARIANTS))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--sass", action="store_true", help="no GPU: sm_90 resources per variant")
    ap.add_argument("--stages", type=int, default=None, help="config.looped_stages for `fuser`")
    ap.add_argument("--out", default=None, help="write the rows as JSON lines here")
    ap.add_argument(
        "--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile workers"
    )
    args = ap.parse_args()
    cases, names = args.cases.split(","), args.variants.split(",")
    unknown = (set(cases) - set(CASES)) | (set(names) - {v.name for v in VARIANTS})
    if unknown:
        print(
            f"unknown {sorted(unknown)}; cases {list(CASES)}, variants {[v.name for v in VARIANTS]}"
        )
        return 2
    if args.stages is not None:
        config.looped_stages = args.stages
    if args.sass:
        sass_report(cases, names, args.jobs)
        return 0
    if not torch.cuda.is_available():
        print("looped_variants: needs a CUDA GPU (or --sass)")
        return 2
    dev = get_device(None)
    ceiling = copy_gbps()
    jobs: list[tuple] = []
    for cname in cases:  # plan from meta tensors, compile every variant ahead in parallel
        c = CASES[cname]
        ins = inputs(c, "meta")
        fd = definition(c, *ins) if c.op == "cross_entropy" else definition(c, ins[0], None)
        fd.compile(ins, None, "triton")
        cf = fd._runtime().last
        jobs.append(fuser_job(cf.kernels[row_kernel(cf)]))
        jobs += [fuser_job(k) for k in variant_kernels(cf, names, dev).values()]
        if "persist1024" in names:
            jobs.append(("persistent", cname))
    warm_all(jobs, args.jobs)
    rows: list[dict] = []
    for cname in cases:
        rows += time_case(CASES[cname], names, dev, not args.no_compile)
        torch.cuda.empty_cache()  # the case's tensors, gone with time_case
    print_table(rows, ceiling)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r | {"device": torch.cuda.get_device_name()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
