"""The outer (column) reduction scheduler: a column sum of [M, N] such as a bias gradient.

A block owns a column tile of `chunk` columns and walks rows `rows_per_block` at a time
(`rows_per_block / thread rows` loads in flight a thread). Two shapes of kernel, chosen
with a cost model of the device:

- column-tiled single stage (split 1): the column tiles alone are the grid; each block
  walks every row and writes its columns' results. No workspace, one launch. Enough only
  where N / chunk fills the SMs with bytes in flight (very wide N).
- split-M two stage: `split_rows` blocks per column tile each sum every split-th step of
  rows into an fp32 workspace row (`split_rows x N`); a finalize launch adds the partials
  of each column in a fixed order (deterministic, no float atomics). Its tile is
  `finalize_cols` columns a block, its threads spread over the partials.

The model (constants per backend in `Backend.limits.outer`, fuser.backends.base
OuterModel; fitted by benchmarks/outer_fit.py to the H100 sweeps of dy.float().sum(0) and
of the GELU backward's bias gradient): the main pass streams every FULL tensor (read and
written: a fused producer's inputs and its full output count too) at the copy ceiling
scaled by two power laws capped at 1, of the bytes in flight a SM (Little's law) and of
the resident warps a SM (their loads' latency; a lone block walking many rows). Its
instructions (math_per_element: the loop's share, each tensor's load or store, each op of
the producer per element and the accumulate; masked lanes of a tile wider than the
columns and masked rows of the last step issue too) run at the SMs' issue rate scaled by a
power law of the resident warps a SM (what hides their latencies). The two overlap as a
smooth maximum: a column sum of bf16 (~8 instructions an element) is the memory stream's,
the GELU backward (~55) is as much math as memory and wants 32 warps a SM, the registers
of one row a thread (registers.math_live_words prices its temporaries). Blocks beyond
one wave, or SMs with more blocks than others, stretch the pass; each wave of blocks pays
its epilogue's cross-thread combine (Triton's tl.sum over the tile's thread rows); the
row splits cost their workspace traffic (written once, read once) and the finalize launch.
CUDA prices no math yet: no CUDA kernel with a producer's math has been swept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuser.backends.base import Backend, OuterModel
from fuser.backends.registry import get_backend
from fuser.ir.ops import REDUCE, Op
from fuser.schedulers.common import (
    _estimate,
    _with,
    index_bits,
    pow2_ceil,
    pow2_floor,
    registers,
    vector_width,
)
from fuser.schedulers.device import Device
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec
from fuser.segmenter import Kind

# Predicted times within this fraction of the fastest are ties (the fit's resolution; a
# wider band picked 8192x4096's GELU backward at 2 row splits, 1 block a SM: 0.18 ms
# measured against 0.094 for torch.compile)
PICK_BAND = 1e-4
# A block that runs fewer row steps than this pays its epilogue (a shared-memory combine
# of its thread rows and the partials' store) on too little work
MIN_STEPS = 2
# Columns a row segment of a tile should span at least (bytes): a full 128-byte line
MIN_TILE_BYTES = 128
# A last-block finalize (an arrival counter per column tile; the last block adds the
# partials) saves the launch but needs a zeroed counter kept across calls (a memset
# launch each call, or a cached counter that concurrent streams would share) and
# gpu-scope acquire/release that neither CPU path (Triton's interpreter, the CUDA
# emulator) checks: fuser keeps a second launch and counts its cost in the choice
FINALIZE_WHY = (
    "finalize as a second launch (counted above), not the last block of each tile: that "
    "needs an arrival counter zeroed before every call and kept across calls (a memset "
    "launch, or a cached counter that concurrent streams would share) and gpu-scope "
    "acquire/release that the CPU paths do not check"
)


# sm_90 instructions an element of a Triton outer reduction's loop (Triton 3.6 through
# ptxas, no GPU: benchmarks/outer_fit.py --sass compiles a column sum of op(x) over bf16 x
# and subtracts the plain column sum's 7.6): the libdevice functions are tens of
# instructions (tanh's two branches both run in a warp whose lanes straddle |x| = 0.6),
# the MUFU approximations a few. Other ops take one, a broadcast or constant none.
OP_INSTRUCTIONS = {
    Op.EXP: 7,
    Op.EXP2: 2,
    Op.LOG: 29,
    Op.LOG2: 31,
    Op.LOG1P: 45,
    Op.TANH: 24,
    Op.ERF: 30,
    Op.SIGMOID: 17,
    Op.DIV: 16,
    Op.RECIPROCAL: 10,
    Op.SQRT: 17,
    Op.RSQRT: 2,
    Op.POW: 160,
    Op.SIN: 3,
    Op.COS: 3,
    Op.BROADCAST_IN_DIM: 0,
}
# an element's share of the loop (its mask, the staged loads' addresses) and of each FULL
# tensor loaded or stored (address, mask, the bf16 (un)packing): dy.float().sum(0) came to
# 7.6 (4 + 1.6 + the cast + the add), the GELU backward's 54.8 (4 + 3 x 1.6 + 46)
LOOP_INSTRUCTIONS = 4.0
ARG_INSTRUCTIONS = 1.6


@dataclass(frozen=True)
class OuterCost:
    """The cost model's view of one outer schedule (times in microseconds)."""

    blocks: int
    blocks_per_sm: int  # resident, from the register estimate
    in_flight_kb: float  # loads and stores in flight per SM
    warps: float  # resident warps per SM, on average
    efficiency: float  # of the copy ceiling, from the two above
    memory_us: float  # the main pass's bytes at that efficiency
    math_us: float  # its instructions at the issue rate its warps allow (0: not priced)
    issue: float  # that issue rate's fraction of the SMs' peak
    combine_us: float  # the epilogues' cross-thread combines (in main_us)
    main_us: float
    workspace_us: float
    finalize_us: float

    @property
    def total_us(self) -> float:
        return self.main_us + self.workspace_us + self.finalize_us


def math_per_element(spec: KernelSpec) -> float:
    """Instructions a thread issues for an element of the main pass: the loop's share,
    each FULL tensor's load or store, each op computed per element (OP_INSTRUCTIONS; one
    where not listed) and each reduction's accumulate. Ops on row or column values are
    computed once a row or column and not counted."""
    ops = sum(
        OP_INSTRUCTIONS.get(n.op, 1)
        for n in spec.nodes
        if n.op in REDUCE or spec.kinds.get(n.out.id) == Kind.FULL
    )
    return LOOP_INSTRUCTIONS + ARG_INSTRUCTIONS * len(spec.full_args()) + ops


def _step_bytes(spec: KernelSpec) -> int:
    """Bytes a (row, column) element of a step moves: every FULL tensor once, inputs and
    outputs (a fused producer's full output is stored in the same step)."""
    return sum(a.dtype.itemsize for a in spec.full_args()) or 4


def finalize_cols(spec: KernelSpec, dev: Device, v: int, split: int) -> int:
    """Columns per finalize block: narrow enough that ~every SM gets a block (the partials
    are few KB a column tile), at most 32 vectors (a warp's width)."""
    if split == 1:
        return 0
    vectors = -(-spec.cols // v)
    return v * max(1, min(32, pow2_floor(max(vectors // dev.sms, 1))))


def cost(
    spec: KernelSpec,
    dev: Device,
    s: Schedule,
    regs: int,
    backend: Backend | str = "triton",
    model: OuterModel | None = None,
) -> OuterCost:
    """Predicted time of `s` with `backend`'s constants (or `model`'s): the main pass's
    memory stream at the bandwidth its bytes in flight allow, overlapped with its
    instructions at the issue rate its resident warps allow, stretched by waves and
    imbalance, plus the epilogues' combine, the workspace traffic and the finalize."""
    m = model or get_backend(backend).limits.outer
    blocks = math.prod(s.grid)
    resident = max(dev.blocks_per_sm(s.threads, regs), 1)
    per_sm = min(resident, -(-blocks // dev.sms))
    thread_rows = max(s.threads // s.threads_per_row, 1)
    loads = max(s.rows_per_block // thread_rows, 1)
    block_bytes = s.threads * loads * s.vector * _step_bytes(spec)
    # the SMs average blocks / sms blocks at once; bytes in flight and warps follow
    avg = min(blocks / dev.sms, resident)
    in_flight_kb = avg * block_bytes / 1024
    warps = avg * s.threads / dev.warp_size
    eff = min(1.0, in_flight_kb / m.in_flight_kb) ** m.in_flight_exp
    eff *= min(1.0, warps / m.warps) ** m.warps_exp
    memory = spec.bytes_moved() / (dev.dram_gbps * 1e3 * m.copy_fraction * eff)
    body, math_us, issue = memory, 0.0, 1.0
    if m.overlap:
        # every block runs the busiest block's steps and every lane of its tile: masked
        # rows and columns issue their math too
        row_step = max(s.rows_per_block, thread_rows)
        rows = -(-spec.rows // (row_step * s.split_rows)) * row_step * s.split_rows
        elements = rows * s.grid[0] * s.chunk
        issue = min(1.0, warps / m.math_warps) ** m.math_warps_exp
        math_us = elements * math_per_element(spec) / (dev.sms * m.issue_per_us * issue)
        body = (memory**m.overlap + math_us**m.overlap) ** (1 / m.overlap)
    # waves: blocks run resident x sms at a time; the busiest SM sets the time
    waves = blocks / (dev.sms * resident)
    stretch = max(1.0, math.ceil(waves) / waves) if waves > 1 else 1.0
    if blocks >= dev.sms:
        stretch *= math.ceil(blocks / dev.sms) / (blocks / dev.sms)
    combine = m.combine_us * math.ceil(waves) * math.log2(thread_rows) * loads
    main = m.launch_us + body * stretch + combine
    ws = fin = 0.0
    if s.split_rows > 1:
        ws = 2 * s.split_rows * spec.cols * 4 * len(spec.reductions) / (dev.dram_gbps * 1e3)
        fin = m.finalize_us
    return OuterCost(
        blocks, per_sm, in_flight_kb, warps, eff, memory, math_us, issue, combine, main, ws, fin
    )


def _split(spec: KernelSpec, dev: Device, col_tiles: int, rows_per_step: int, k: int) -> int:
    """Row splits so that col_tiles x split ~ k blocks per SM, each with MIN_STEPS steps."""
    # rounded down: one block past k a SM would make some SM run k + 1 of them
    want = dev.sms * k // col_tiles
    most = max(1, spec.rows // (rows_per_step * MIN_STEPS))
    return max(1, min(want, most))


def _make(
    spec: KernelSpec, v: int, tpr: int, warps: int, loads: int, split: int, fin: int
) -> Schedule:
    thread_rows = max(warps * 32 // tpr, 1)
    # fewer rows than thread rows: a step's tile is only as tall as the rows (Triton's
    # [rows_per_block, chunk] tile; CUDA's thread rows past the end are predicated off)
    return Schedule(
        "outer_reduction",
        spec.rows,
        spec.cols,
        v,
        tpr,
        min(thread_rows * loads, pow2_ceil(spec.rows)),
        num_warps=warps,
        split_rows=split,
        finalize_cols=fin,
        index_bits=index_bits(spec),
    )


def _space(spec: KernelSpec, dev: Device, v: int) -> list[tuple[int, int, int, int]]:
    """(threads_per_row, warps, loads in flight a thread, blocks per SM wanted) to try."""
    widest = max((a.dtype.itemsize for a in spec.full_args()), default=4)
    top = pow2_ceil(-(-spec.cols // v))
    low = min(top, max(1, MIN_TILE_BYTES // (v * widest)))
    out = []
    tpr = low
    while tpr <= min(top, 128):
        for warps in (4, 8):
            if tpr > warps * 32:
                continue
            for loads in (1, 2, 4):
                for k in (1, 2, 4, 8):
                    out.append((tpr, warps, loads, k))
        tpr *= 2
    return out


def _schedules(
    spec: KernelSpec, dev: Device, backend: Backend, v: int
) -> list[tuple[Schedule, int, OuterCost]]:
    """Every (schedule, registers, cost) of the space, with and without the row split."""
    seen: dict[tuple, tuple[Schedule, int, OuterCost]] = {}
    for tpr, warps, loads, k in _space(spec, dev, v):
        thread_rows = max(warps * 32 // tpr, 1)
        rows_per_step = thread_rows * loads
        if loads > 1 and rows_per_step > pow2_ceil(spec.rows):
            continue  # more loads a thread than the rows give
        col_tiles = -(-spec.cols // (tpr * v))
        for split in {1, _split(spec, dev, col_tiles, rows_per_step, k)}:
            key = (tpr, warps, loads, split)
            if key in seen:
                continue
            s = _make(spec, v, tpr, warps, loads, split, finalize_cols(spec, dev, v, split))
            regs = registers(spec, s, backend)
            if regs >= 255 or not dev.blocks_per_sm(s.threads, regs):
                continue
            seen[key] = (s, regs, cost(spec, dev, s, regs, backend))
    return list(seen.values())


def _pick(scored: list[tuple[Schedule, int, OuterCost]]) -> tuple[Schedule, int, OuterCost]:
    # the fastest predicted; within 0.01% of it (exact ties of the capped model), the smallest block
    # (4 warps: the sweep's fastest in both backends at every shape), the fewest partials,
    # then the tiling with the fewest padding lanes (a partial last tile leaves its blocks
    # short of work), then the widest tile
    best = min(c.total_us for _, _, c in scored)
    near = [x for x in scored if x[2].total_us <= best * (1 + PICK_BAND)]

    def key(x: tuple[Schedule, int, OuterCost]) -> tuple:
        s = x[0]
        lanes = s.cols / (s.grid[0] * s.chunk)
        return (s.num_warps, s.split_rows, -round(lanes, 2), -s.chunk, s.rows_per_block)

    return min(near, key=key)


def _describe(spec: KernelSpec, dev: Device, s: Schedule, c: OuterCost) -> str:
    loads = max(s.rows_per_block * s.threads_per_row // s.threads, 1)
    math_part = (
        f", {math_per_element(spec):.0f} instructions an element at {c.issue:.0%} of the issue "
        f"rate: math {c.math_us:.1f} us overlapping memory {c.memory_us:.1f} us"
        if c.math_us
        else ""
    )
    return (
        f"{c.blocks} blocks ({c.blocks_per_sm} resident a SM), {loads} step(s) of "
        f"{s.vector * _step_bytes(spec)} B in flight a thread = {c.in_flight_kb:.0f} KB and "
        f"{c.warps:.0f} warps a SM: {c.efficiency:.0%} of the copy ceiling{math_part}, "
        f"thread-row combines {c.combine_us:.2f} us, predicted {c.total_us:.1f} us"
    )


def schedule_outer(spec: KernelSpec, dev: Device, backend: Backend | str = "triton") -> Schedule:
    """The column reduction's schedule: split-M two stage or column-tiled single stage,
    whichever the device model predicts faster, with the reasons."""
    backend = get_backend(backend)
    reasons: list[str] = []
    v = vector_width(spec, reasons, masked_tail=backend.limits.masked_outer_tail)
    scored = _schedules(spec, dev, backend, v)
    s, regs, c = _pick(scored)
    single = [x for x in scored if x[0].split_rows == 1]
    split = [x for x in scored if x[0].split_rows > 1]
    col_tiles = s.grid[0]
    reasons.append(
        f"column tile {s.chunk} = {s.threads_per_row} threads x vector {v}, "
        f"{s.rows_per_block} rows a step ({s.num_warps} warps); {col_tiles} column tile(s)"
    )
    if s.split_rows > 1:
        best1 = min(single, key=lambda x: x[2].total_us) if single else None
        alone = (
            f"unsplit, the best column tiling ({best1[0].chunk} columns, "
            f"{best1[0].grid[0]} tiles) would be " + _describe(spec, dev, best1[0], best1[2])
            if best1
            else "no single-stage schedule fits"
        )
        reasons.append(f"split-M two stage, {s.split_rows} row splits: {alone}")
        reasons.append(
            f"chosen: {_describe(spec, dev, s, c)}, of which workspace "
            f"{s.split_rows} x {spec.cols} fp32 ({c.workspace_us:.2f} us: "
            f"{2 * s.split_rows * spec.cols * 4 / spec.bytes_moved():.1%} of the bytes) and "
            f"finalize ~{c.finalize_us:.0f} us"
        )
        reasons.append(
            f"finalize: {s.finalize_cols} columns a block, its threads over the "
            f"{s.split_rows} partials, added in a fixed order (deterministic, no float atomics)"
        )
        reasons.append(FINALIZE_WHY)
    else:
        best2 = min(split, key=lambda x: x[2].total_us) if split else None
        other = (
            f"; the best split-M schedule predicts {best2[2].total_us:.1f} us "
            f"(workspace and a finalize launch ~{best2[2].finalize_us:.0f} us)"
            if best2
            else ""
        )
        reasons.append(
            f"column-tiled single stage, no row split: {_describe(spec, dev, s, c)}{other}"
        )
    reasons.append(f"{len(scored)} candidates scored with the {backend.name} register estimate")
    covered = col_tiles * s.chunk
    return _with(s, _estimate(spec, dev, s, regs, 0, covered), reasons)


def outer_candidates(spec: KernelSpec, dev: Device, backend: Backend | str) -> list[Schedule]:
    """Every schedule the outer heuristic scores (for the sweep's regret), with its
    predicted time among the reasons."""
    backend = get_backend(backend)
    v = vector_width(spec, [], masked_tail=backend.limits.masked_outer_tail)
    out = []
    for s, regs, c in _schedules(spec, dev, backend, v):
        why = [f"sweep candidate: {_describe(spec, dev, s, c)}"]
        out.append(_with(s, _estimate(spec, dev, s, regs, 0, s.grid[0] * s.chunk), why))
    return out
