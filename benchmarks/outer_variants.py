"""Hand-written Triton variants of the outer (column) reduction that fuses the GELU
backward of a training step: dx = gelu_backward(dy, x, tanh) in bf16 and db =
dx.float().sum(0) in one pass (fuser/examples/bias_grad.py form "gelu"), timed beside
fuser's own kernel, the two-kernel form and torch.compile, to find what makes fuser's
Triton loop slow and which renderer change would fix it.

    PYTHONPATH=. python benchmarks/outer_variants.py                  # ~2-3 min on an H100
    PYTHONPATH=. python benchmarks/outer_variants.py --shapes 8192x3072 --variants replica,prefetch
    PYTHONPATH=. python benchmarks/outer_variants.py --sass           # no GPU: ptxas's view

Each variant is one knob turned from `replica`, the kernel fuser rendered for the h100
preset before the step guard of fuser/codegen/triton/kernels.py (_outer_step): [2, 1024]
tiles, 4 warps, 4 blocks a SM of row splits, fuser's tanh helper, row masks where the
split leaves a ragged last step, an fp32 [rows, cols] accumulator, no FMA contraction.
`step-if` is what fuser renders now (fuser-triton should time as it). The VARIANTS table
says which renderer change each stands for. Every variant is checked against eager
(fuser's bench tolerance: "ok") and compared element by element with eager's dx and
fuser's; then timed as fuser's benchmarks time (median, L2 flushed by reading 256 MB
between repeats, CUDA events). GB/s counts the three [M, N] bf16 tensors once; "vs"
columns are speedups over fuser-triton and over replica. fuser's plain column sum (form
f32) is timed too, with its own bytes: the renderer change reaches it as well.

--sass compiles every variant for sm_90 without a GPU and prints ptxas's registers and the
row loop's instructions per element: 857 a step of 16 elements a thread (54 an element)
in the replica, against 4 16-byte loads and 2 stores; at 8192 x 3072 that is ~42 M warp
instructions, ~45 us of issue at 1.75 GHz on 132 SMs, as long as the memory traffic, so
the loop's math and its loads must overlap (hypotheses in VARIANTS).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.language.extra.cuda import libdevice

from fuser.bench.measure import bench_ms, copy_gbps, mismatch
from fuser.examples.bias_grad import bias_grad_fusion
from fuser.runtime.resources import cubin_resources, sass

SHAPES = ["8192x3072", "16384x3072", "8192x768"]
SMS_PRESET = 132  # the h100 preset's SMs, for --sass without a GPU

# -- tanh, four ways -------------------------------------------------------------------


@triton.jit
def _tanh_ours(x):
    # fuser's helper (fuser/codegen/triton/templates.py): exp (ex2.approx with its
    # denormal fix-ups), a full-range divide (div.full: range checks and scalings), a
    # select of the sign, the series near 0
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 - x2 * (0.3333333333333333 - x2 * 0.13333333333333333))
    return tl.where(tl.abs(x) < 0.0625, small, tl.where(x < 0, -t, t))


@triton.jit
def _tanh_fast(x):
    # the same formula and series; e = exp(-2|x|) is in (0, 1], so the divisor 1 + e is
    # in [1, 2]: an approximate divide (rcp + mul) needs none of div.full's range checks,
    # and an ftz ex2 none of the denormal fix-ups (e < 2^-126 only where t rounds to 1)
    a = tl.abs(x)
    e = libdevice.fast_expf(-2.0 * a)
    t = libdevice.fast_dividef(1.0 - e, 1.0 + e)
    x2 = x * x
    small = x * (1.0 - x2 * (0.3333333333333333 - x2 * 0.13333333333333333))
    return tl.where(a < 0.0625, small, libdevice.copysign(t, x))


@triton.jit
def _tanh_mufu(x):
    # the SFU's tanh (MUFU.TANH, sm_75+): one instruction, max relative error ~2^-11,
    # below a bf16 result's half ulp (2^-9) but not float32-exact
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _tanh(x, TANH: tl.constexpr):
    if TANH == "ours":
        return _tanh_ours(x)
    elif TANH == "fast":
        return _tanh_fast(x)
    elif TANH == "mufu":
        return _tanh_mufu(x)
    else:
        return libdevice.tanh(x)


@triton.jit
def _dx(dy, x, TANH: tl.constexpr):
    # dx = dy * gelu'(x), tanh form, bf16 in and out: the ops of fuser's graph in its order
    x = x.to(tl.float32)
    x2 = x * x
    t = _tanh(0.7978845608028654 * (x + 0.044715 * (x * x2)), TANH)
    dt = (1.0 - t * t) * (0.7978845608028654 * (1.0 + 0.134145 * x2))
    grad = 0.5 * (1.0 + t) + (0.5 * x) * dt
    return (dy.to(tl.float32) * grad).to(tl.bfloat16)


# -- the outer kernel ------------------------------------------------------------------


@triton.jit
def _at(pid, i, cols, SPLIT: tl.constexpr, R: tl.constexpr, ROWS: tl.constexpr,
        COLS: tl.constexpr, MROWS: tl.constexpr, MCOLS: tl.constexpr,
        INT64: tl.constexpr):  # fmt: skip
    """(offsets, mask) of step i of row split `pid`: rows (pid + i * SPLIT) * R ..., as
    fuser's order. An unmasked tile gets a constant-true mask, which Triton drops."""
    step = pid + i * SPLIT
    if INT64:
        step = step.to(tl.int64)
    rows = step * R + tl.arange(0, R)[:, None]
    ok = tl.full((1, 1), 1, tl.int1)
    if MROWS:
        ok = ok & (rows < ROWS)
    if MCOLS:
        ok = ok & (cols < COLS)
    return rows * COLS + cols, ok


@triton.jit
def _load(ptr, at, EVICT: tl.constexpr):
    return tl.load(ptr + at[0], mask=at[1], other=1.0, eviction_policy=EVICT)


@triton.jit
def _finish(dx, dx_ptr, at, acc, ACC_ROWS: tl.constexpr):
    # store dx, add it (as rounded) to the accumulator: masked lanes add 0
    tl.store(dx_ptr + at[0], dx, mask=at[1])
    v = tl.where(at[1], dx.to(tl.float32), 0.0)
    if ACC_ROWS:
        acc = acc + v
    else:
        acc = acc + tl.sum(v, axis=0, keep_dims=True)
    return acc


@triton.jit
def outer_gelu(dy_ptr, x_ptr, dx_ptr, ws_ptr, ROWS: tl.constexpr, COLS: tl.constexpr,
               R: tl.constexpr, C: tl.constexpr, SPLIT: tl.constexpr, STEPS: tl.constexpr,
               MROWS: tl.constexpr, MCOLS: tl.constexpr, TANH: tl.constexpr,
               LOOP: tl.constexpr, STAGES: tl.constexpr, UNROLL: tl.constexpr,
               ACC_ROWS: tl.constexpr, BOUNDED: tl.constexpr,
               INT64: tl.constexpr, EVICT: tl.constexpr):  # fmt: skip
    """Column tile C (program_id 0) x row split SPLIT (program_id 1): STEPS steps of
    [R, C], then this split's partial column sums into the workspace row."""
    pid = tl.program_id(1)
    cols = tl.program_id(0) * C + tl.arange(0, C)[None, :]
    acc = tl.zeros((R if ACC_ROWS else 1, C), tl.float32)
    if LOOP == "prefetch":
        # the next step's tiles are loaded before this step's math: loads stay in flight
        # while the warp computes (the last step reloads itself: an L2 hit, no mask)
        at = _at(pid, 0, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
        x_next, dy_next = _load(x_ptr, at, EVICT), _load(dy_ptr, at, EVICT)
        for i in range(STEPS):
            at = _at(pid, i, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
            x, dy = x_next, dy_next
            nxt = _at(
                pid, tl.minimum(i + 1, STEPS - 1), cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64
            )
            x_next, dy_next = _load(x_ptr, nxt, EVICT), _load(dy_ptr, nxt, EVICT)
            acc = _finish(_dx(dy, x, TANH), dx_ptr, at, acc, ACC_ROWS)
    elif LOOP == "pingpong":
        # prefetch with two register buffers, two steps an iteration: each half loads the
        # other buffer before its math (one buffer reloaded in place: ptxas issued the
        # next loads only after the old tile's last use, mid-loop)
        at = _at(pid, 0, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
        xa, dya = _load(x_ptr, at, EVICT), _load(dy_ptr, at, EVICT)
        for j in range(0, STEPS - 1, 2):
            at = _at(pid, j, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
            bt = _at(pid, j + 1, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
            xb, dyb = _load(x_ptr, bt, EVICT), _load(dy_ptr, bt, EVICT)
            acc = _finish(_dx(dya, xa, TANH), dx_ptr, at, acc, ACC_ROWS)
            nxt = _at(
                pid, tl.minimum(j + 2, STEPS - 1), cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64
            )
            xa, dya = _load(x_ptr, nxt, EVICT), _load(dy_ptr, nxt, EVICT)
            acc = _finish(_dx(dyb, xb, TANH), dx_ptr, bt, acc, ACC_ROWS)
        if STEPS % 2 == 1:
            at = _at(pid, STEPS - 1, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
            acc = _finish(_dx(dya, xa, TANH), dx_ptr, at, acc, ACC_ROWS)
    else:
        # `range` is tl.range with neither knob (None); "stages" pipelines the loads
        # through shared memory (cp.async), "unroll" repeats the body. BOUNDED: each split
        # walks only its own steps below the rows (a dynamic trip count, no row masks:
        # where R divides the rows, a step's tile is wholly in or wholly past the end)
        if BOUNDED == "if":
            for i in tl.range(0, STEPS, num_stages=STAGES, loop_unroll_factor=UNROLL):
                if pid + i * SPLIT < ROWS // R:  # uniform: the whole tile or none of it
                    at = _at(pid, i, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
                    x, dy = _load(x_ptr, at, EVICT), _load(dy_ptr, at, EVICT)
                    acc = _finish(_dx(dy, x, TANH), dx_ptr, at, acc, ACC_ROWS)
        elif BOUNDED == "range":
            for s in tl.range(pid, ROWS // R, SPLIT, num_stages=STAGES, loop_unroll_factor=UNROLL):
                at = _at(s, 0, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
                x, dy = _load(x_ptr, at, EVICT), _load(dy_ptr, at, EVICT)
                acc = _finish(_dx(dy, x, TANH), dx_ptr, at, acc, ACC_ROWS)
        else:
            for i in tl.range(0, STEPS, num_stages=STAGES, loop_unroll_factor=UNROLL):
                at = _at(pid, i, cols, SPLIT, R, ROWS, COLS, MROWS, MCOLS, INT64)
                x, dy = _load(x_ptr, at, EVICT), _load(dy_ptr, at, EVICT)
                acc = _finish(_dx(dy, x, TANH), dx_ptr, at, acc, ACC_ROWS)
    part = tl.sum(acc, axis=0, keep_dims=True)
    tl.store(ws_ptr + pid * COLS + cols, part, mask=cols < COLS)


@triton.jit
def finalize(ws_ptr, db_ptr, COLS: tl.constexpr, SPLIT: tl.constexpr, FC: tl.constexpr,
             FP: tl.constexpr):  # fmt: skip
    """db: the SPLIT partials of FC columns added in a fixed order, FP a step."""
    cols = tl.program_id(0) * FC + tl.arange(0, FC)[None, :]
    parts = tl.arange(0, FP)[:, None]
    acc = tl.zeros((FP, FC), tl.float32)
    for p in range(0, SPLIT, FP):
        ok = ((p + parts) < SPLIT) & (cols < COLS)
        acc += tl.load(ws_ptr + (p + parts) * COLS + cols, mask=ok, other=0.0)
    tl.store(db_ptr + cols, tl.sum(acc, axis=0, keep_dims=True), mask=cols < COLS)


@triton.jit
def pointwise_dx(dy_ptr, x_ptr, dx_ptr, N: tl.constexpr, BLOCK: tl.constexpr,
                 TANH: tl.constexpr):  # fmt: skip
    """dx alone, flat: the first kernel of the two-kernel form."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(x_ptr + offs, mask=ok, other=1.0)
    dy = tl.load(dy_ptr + offs, mask=ok, other=1.0)
    tl.store(dx_ptr + offs, _dx(dy, x, TANH), mask=ok)


# -- variants --------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One outer kernel; the defaults are what fuser renders today (h100 preset)."""

    name: str
    why: str  # the renderer change it stands for
    rows: int = 2  # R: rows a step
    cols: int = 1024  # C: columns a tile
    warps: int = 4
    per_sm: int = 4  # row splits so that column tiles x splits = per_sm x SMs
    exact: bool = False  # splits a power of two dividing the steps: no row mask
    # no row masks where R divides the rows (a tile is whole or past the end): "range",
    # each split's own trip count; "if", a uniform branch around a step past the end
    bounded: str = ""
    tanh: str = "ours"  # ours | fast | mufu | libdevice
    loop: str = "plain"  # plain | prefetch | stages | unroll
    stages: int = 0  # num_stages (stages) or the unroll factor (unroll)
    acc_rows: bool = True  # [R, C] accumulator; False: [1, C], a tl.sum a step
    int64: bool = False
    evict: str = ""  # eviction_policy of the loads
    fma: bool = False  # enable_fp_fusion (fuser compiles with it off)


V = Variant
VARIANTS = [
    V("replica", "fuser today (must time as fuser-triton)"),
    V("tanh-libdevice", "templates.py tanh -> libdevice.tanh", tanh="libdevice"),
    V("tanh-fast", "templates.py tanh: ex2.ftz + rcp.approx + copysign", tanh="fast"),
    V("tanh-mufu", "tanh.approx.f32 (not fp32-exact)", tanh="mufu"),
    V("fma", "TRITON_OPTIONS enable_fp_fusion=True", fma=True),
    V("prefetch", "outer loop: load step i+1 before step i's math", loop="prefetch"),
    V("pingpong", "outer loop: two register buffers, 2 steps an iteration", loop="pingpong"),
    V("stages2", "outer loop: tl.range(num_stages=2)", loop="stages", stages=2),
    V("stages3", "outer loop: tl.range(num_stages=3)", loop="stages", stages=3),
    V("unroll2", "outer loop: tl.range(loop_unroll_factor=2)", loop="unroll", stages=2),
    V("exact", "split a power of 2: no row masks", exact=True),
    V("bounded", "outer loop: range(pid, steps, split), no row masks", bounded="range"),
    V("step-if", "outer loop: `if step < steps:` around the body, no row masks", bounded="if"),
    V("acc1", "[1, C] accumulator, tl.sum a step", acc_rows=False),
    V("int64", "index_bits 64", int64=True),
    V("evict-first", "loads evict_first", evict="evict_first"),
    V("8/SM", "scheduler: 8 blocks a SM", per_sm=8),
    V("2/SM", "scheduler: 2 blocks a SM", per_sm=2),
    V("r4c1024w8", "scheduler: [4, 1024] tiles, 8 warps", rows=4, warps=8),
    V("r8c512w4", "scheduler: [8, 512] tiles, 4 warps", rows=8, cols=512),
    V("r4c512w4", "scheduler: [4, 512] tiles, 4 warps", rows=4, cols=512),
    V("r4c256w4", "scheduler: [4, 256] tiles, 4 warps (768 = 3 tiles exactly)", rows=4, cols=256),
    V("r4c1024w4", "scheduler: [4, 1024] tiles, 4 warps (2 loads a thread)", rows=4),
    V("pf+fast", "prefetch + tanh-fast", loop="prefetch", tanh="fast"),
    V("st3+fast", "stages3 + tanh-fast", loop="stages", stages=3, tanh="fast"),
    V("if+fast", "step-if + tanh-fast", bounded="if", tanh="fast"),
    V(
        "if+st3+fast",
        "step-if + stages3 + tanh-fast",
        bounded="if",
        loop="stages",
        stages=3,
        tanh="fast",
    ),  # fmt: skip
    V("pf+fast+fma", "prefetch + tanh-fast + fma", loop="prefetch", tanh="fast", fma=True),
    V(
        "pf+fast+8/SM",
        "prefetch + tanh-fast, 8 blocks a SM",
        loop="prefetch",
        tanh="fast",
        per_sm=8,
    ),  # fmt: skip
]


@dataclass(frozen=True)
class Launch:
    """A variant at one shape: its grid and the constexprs of both kernels."""

    v: Variant
    grid: tuple[int, int]
    consts: dict
    fin_grid: int
    fin: dict


def launch_of(v: Variant, rows: int, cols: int, sms: int) -> Launch:
    c = min(v.cols, triton.next_power_of_2(cols))
    tiles = -(-cols // c)
    most = max(1, rows // (v.rows * 2))  # at least 2 steps a split
    split = max(1, min(sms * v.per_sm // tiles, most))
    if v.exact:  # the largest power of 2 at most `split` whose steps cover the rows exactly
        split = 1 << (split.bit_length() - 1)
        while split > 1 and rows % (v.rows * split):
            split //= 2
    steps = -(-rows // (v.rows * split))
    whole = v.bounded and rows % v.rows == 0 and v.loop in ("plain", "stages", "unroll")
    bounded = v.bounded if whole else ""
    consts = dict(BOUNDED=bounded, ROWS=rows, COLS=cols, R=v.rows, C=c, SPLIT=split, STEPS=steps)
    consts |= dict(
        MROWS=not bounded and rows % (v.rows * split) != 0, MCOLS=cols % c != 0, TANH=v.tanh
    )
    consts |= dict(LOOP=v.loop, ACC_ROWS=v.acc_rows, INT64=v.int64)
    consts |= dict(STAGES=v.stages if v.loop == "stages" else None)
    consts |= dict(UNROLL=v.stages if v.loop == "unroll" else None)
    consts |= dict(EVICT=v.evict)
    fc, fp = 16, 128
    fin = dict(COLS=cols, SPLIT=split, FC=fc, FP=fp)
    return Launch(v, (tiles, split), consts, -(-cols // fc), fin)


def options(v: Variant) -> dict:
    return {"num_warps": v.warps, "enable_fp_fusion": v.fma}


def run_variant(la: Launch, dy: torch.Tensor, x: torch.Tensor, dx, ws, db) -> None:
    outer_gelu[la.grid](dy, x, dx, ws, **la.consts, **options(la.v))
    finalize[(la.fin_grid,)](ws, db, **la.fin, num_warps=4)


def _warm(job: tuple[str, str, int]) -> str:
    """Worker: compile one variant at one shape into Triton's disk cache (no launch:
    dtypes stand for the tensors, whose 16-byte alignment warmup assumes)."""
    shape, name, sms = job
    rows, cols = (int(s) for s in shape.split("x"))
    la = launch_of(next(v for v in VARIANTS if v.name == name), rows, cols, sms)
    bf, f32 = torch.bfloat16, torch.float32
    try:
        outer_gelu.warmup(bf, bf, bf, f32, grid=la.grid, **la.consts, **options(la.v))
        finalize.warmup(f32, f32, grid=(la.fin_grid,), **la.fin, num_warps=4)
    except Exception as e:  # reported when the main process runs it
        return f"{name}: {type(e).__name__}"
    return ""


def warm_all(shapes: list[str], names: list[str], jobs: int) -> None:
    """Compile every variant at every shape in `jobs` processes first (a compile is
    ~1.5 s and there are ~70; one at a time would take most of the run)."""
    if jobs <= 1:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    work = [(shape, name, sms) for shape in shapes for name in names]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        list(pool.map(_warm, work))


def short(e: Exception) -> str:
    """An exception in one line: its type and the last line of its message (Triton's
    CompilationError puts the source first, the cause last)."""
    lines = [x for x in str(e).strip().splitlines() if x.strip().strip("^")]
    return f"{type(e).__name__}: {lines[-1][:200] if lines else ''}"


# -- --sass: ptxas's view, no GPU ------------------------------------------------------


def loop_stats(sass: str) -> tuple[int, dict[str, int]]:
    """(instructions, opcode counts) of the largest loop (a backward branch's span)."""
    code = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if m:
            code.append((int(m.group(1), 16), m.group(3).split(".")[0], m.group(4)))
    best = (0, 0)
    for addr, op, rest in code:
        m = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > best[1] - best[0]:
            best = (int(m.group(1), 16), addr)
    ops: dict[str, int] = {}
    for addr, op, _ in code:
        if best[0] <= addr <= best[1]:
            ops[op] = ops.get(op, 0) + 1
    return sum(ops.values()), ops


def sass_report(shape: str, names: list[str]) -> None:
    rows, cols = (int(s) for s in shape.split("x"))
    print(f"sm_90 SASS of the row loop at {shape} (no GPU; {SMS_PRESET} SMs assumed)")
    print("| variant | grid | regs | loop instrs | per element | LDG | STG | MUFU | F* ops |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v in [v for v in VARIANTS if v.name in names]:
        la = launch_of(v, rows, cols, SMS_PRESET)
        sig = {"dy_ptr": "*bf16", "x_ptr": "*bf16", "dx_ptr": "*bf16", "ws_ptr": "*fp32"}
        sig |= {k: "constexpr" for k in la.consts}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
        try:
            src = ASTSource(fn=outer_gelu, signature=sig, constexprs=la.consts, attrs=attrs)
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options(v))
        except Exception as e:  # a variant Triton rejects is reported, not fatal
            print(f"| {v.name} | compile error: {short(e)} |")
            continue
        cubin = ck.asm["cubin"]
        regs = next(iter(cubin_resources(cubin).values()))["registers"]
        n, ops = loop_stats(sass(cubin))
        per_iter = v.stages if v.loop == "unroll" else 2 if v.loop == "pingpong" else 1
        elems = v.rows * la.consts["C"] * per_iter / (32 * v.warps)
        fops = sum(k for o, k in ops.items() if o in ("FMUL", "FADD", "FFMA", "FSETP", "FSEL"))
        print(
            f"| {v.name} | {la.grid} | {regs} | {n} | {n / elems:.1f} | {ops.get('LDG', 0)} | "
            f"{ops.get('STG', 0)} | {ops.get('MUFU', 0)} | {fops} |"
        )


# -- GPU timing ------------------------------------------------------------------------


def inputs_of(rows: int, cols: int) -> list[torch.Tensor]:
    # as benchmarks/outer_sweep.py's make_case (dy, then x)
    g = torch.Generator(device="cpu").manual_seed(rows * 7919 + cols)
    return [torch.randn(rows, cols, generator=g).to(torch.bfloat16).cuda() for _ in range(2)]


def eager(ins: list[torch.Tensor]) -> list[torch.Tensor]:
    dx = torch.ops.aten.gelu_backward(ins[0], ins[1], approximate="tanh")
    return [dx, dx.float().sum(0)]


def check(
    got: list[torch.Tensor], ref: list[torch.Tensor], fuser_dx: torch.Tensor, rows: int
) -> dict:
    """Against eager with fuser's bench tolerance (fuser.bench.measure.mismatch), and
    how many dx elements differ from eager's and from fuser's (bits)."""
    wrong = mismatch(SimpleNamespace(reduction_length=rows), got, ref)  # all it reads of a Case
    diff = got[0] != ref[0]
    err = (got[0].float() - ref[0].float()).abs().max() / ref[0].float().abs().max()
    return {
        "ok": wrong is None,
        "error": wrong,
        "dx_vs_eager": diff.float().mean().item(),
        "dx_err": err.item(),
        "dx_vs_fuser": (got[0] != fuser_dx).float().mean().item(),
    }


def time_shape(shape: str, names: list[str], with_compile: bool, with_cuda: bool) -> list[dict]:
    rows, cols = (int(s) for s in shape.split("x"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ins = inputs_of(rows, cols)
    dy, x = ins
    ref = eager(ins)
    nbytes = 3 * rows * cols * 2 + cols * 4
    out: list[dict] = []

    def emit(name: str, ms: float | None, why: str, moved: int = nbytes, **extra) -> None:
        gbps = moved / ms / 1e6 if ms else None
        out.append({"shape": shape, "variant": name, "ms": ms, "gbps": gbps, "why": why, **extra})
        print(
            f"  {shape} {name}: {ms and round(ms, 4)} ms {extra.get('error') or ''}",
            file=sys.stderr,
        )

    fd = bias_grad_fusion("gelu", torch.bfloat16)
    fuser_out = fd.execute(ins, backend="triton")
    sched = fd.kernels[0].schedule.short()
    emit(
        "fuser-triton",
        bench_ms(lambda: fd.execute(ins, backend="triton")),
        sched,
        **check(fuser_out, ref, fuser_out[0], rows),
    )
    fuser_dx = fuser_out[0]
    if with_cuda:
        try:
            got = fd.execute(ins, backend="cuda")
            emit(
                "fuser-cuda",
                bench_ms(lambda: fd.execute(ins, backend="cuda")),
                "",
                **check(got, ref, fuser_dx, rows),
            )
        except Exception as e:  # NVRTC missing: reported, the rest still runs
            emit("fuser-cuda", None, "", error=f"{type(e).__name__}: {str(e)[:120]}")

    # the plain column sum (form "f32": dy.float().sum(0)) by fuser, GB/s of its own bytes:
    # the same outer loop without the producer (what a renderer change does to it)
    f32 = bias_grad_fusion("f32", torch.bfloat16)
    f32_ms = bench_ms(lambda: f32.execute([dy], backend="triton"))
    f32_why = f"dy.float().sum(0) alone: {f32.kernels[0].schedule.short()}"
    emit("fuser-triton f32 sum", f32_ms, f32_why, moved=rows * cols * 2 + cols * 4, plain=True)

    # the two-kernel form: dx pointwise (Triton), then fuser's own column sum of dx
    dx2 = torch.empty_like(dy)
    n, block = rows * cols, 2048

    def two_kernels() -> list[torch.Tensor]:
        pointwise_dx[(-(-n // block),)](
            dy, x, dx2, N=n, BLOCK=block, TANH="ours", num_warps=4, enable_fp_fusion=False
        )
        return [dx2, f32.execute([dx2], backend="triton")[0]]

    emit(
        "2k: pw + fuser sum",
        bench_ms(two_kernels),
        "pointwise dx then fuser f32 column sum",
        **check(two_kernels(), ref, fuser_dx, rows),
    )
    if with_compile:
        torch._dynamo.reset()
        compiled = torch.compile(eager, dynamic=False)
        emit(
            "torch.compile",
            bench_ms(lambda: compiled(ins)),
            "Inductor",
            **check(compiled(ins), ref, fuser_dx, rows),
        )

    dx = torch.empty_like(dy)
    db = torch.empty(cols, dtype=torch.float32, device="cuda")
    for v in [v for v in VARIANTS if v.name in names]:
        la = launch_of(v, rows, cols, sms)
        ws = torch.empty(la.grid[1], cols, dtype=torch.float32, device="cuda")
        try:
            run_variant(la, dy, x, dx, ws, db)
            torch.cuda.synchronize()
            res = check([dx.clone(), db.clone()], ref, fuser_dx, rows)
            ms = bench_ms(lambda la=la, ws=ws: run_variant(la, dy, x, dx, ws, db))
        except Exception as e:  # a variant Triton rejects is reported, not fatal
            emit(v.name, None, v.why, error=f"{type(e).__name__}: {str(e)[:150]}")
            continue
        meta = f"grid {la.grid} steps {la.consts['STEPS']} masked {la.consts['MROWS']}"
        emit(v.name, ms, v.why, launch=meta, **res)
    return out


def print_table(rows_out: list[dict], ceiling: float) -> None:
    print(f"\n{torch.cuda.get_device_name()}; copy {ceiling:.0f} GB/s; ms with the L2 flushed")
    cols = ["shape", "variant", "ms", "GB/s", "vs fuser", "vs replica", "ok", "dx != eager"]
    cols += ["max err / max abs", "dx != fuser", "launch", "stands for"]
    print("| " + " | ".join(cols) + " |")
    print("|---" * len(cols) + "|")
    base = {r["shape"]: r["ms"] for r in rows_out if r["variant"] == "fuser-triton"}
    replica = {r["shape"]: r["ms"] for r in rows_out if r["variant"] == "replica"}

    def vs(ref: float | None, ms: float) -> str:
        return f"{ref / ms:.2f}x" if ref else "-"

    for r in rows_out:
        if r["ms"] is None:
            print(f"| {r['shape']} | {r['variant']} | - | - | - | - | error: {r.get('error')} |")
            continue
        if r.get("plain"):
            print(f"| {r['shape']} | {r['variant']} | {r['ms']:.4f} | {r['gbps']:.0f} | "
                  f"- | - | - | - | - | - | | {r['why']} |")  # fmt: skip
            continue
        ok = "yes" if r.get("ok") else f"NO: {r.get('error')}"
        print(
            f"| {r['shape']} | {r['variant']} | {r['ms']:.4f} | {r['gbps']:.0f} | "
            f"{vs(base.get(r['shape']), r['ms'])} | {vs(replica.get(r['shape']), r['ms'])} | "
            f"{ok} | {r.get('dx_vs_eager', 0):.2%} | "
            f"{r.get('dx_err', 0):.1e} | {r.get('dx_vs_fuser', 0):.2%} | {r.get('launch', '')} | "
            f"{r['why']} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--variants", default=",".join(v.name for v in VARIANTS))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-cuda", action="store_true", help="skip fuser's CUDA backend")
    ap.add_argument("--sass", action="store_true", help="no GPU: ptxas's loop, per variant")
    ap.add_argument("--out", default=None, help="write the rows as JSON lines here")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="compile workers")
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = set(names) - {v.name for v in VARIANTS}
    if unknown:
        print(f"unknown variants {sorted(unknown)}; known: {[v.name for v in VARIANTS]}")
        return 2
    if args.sass:
        for shape in args.shapes.split(","):
            sass_report(shape, names)
        return 0
    if not torch.cuda.is_available():
        print("outer_variants: needs a CUDA GPU (or --sass)")
        return 2
    ceiling = copy_gbps()
    warm_all(args.shapes.split(","), names, args.jobs)
    rows_out = []
    for shape in args.shapes.split(","):
        rows_out += time_shape(shape, names, not args.no_compile, not args.no_cuda)
    print_table(rows_out, ceiling)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows_out:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
