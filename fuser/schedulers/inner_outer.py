"""The inner-outer scheduler: row reductions and column reductions in one kernel.

LayerNorm and RMSNorm backward reduce each row (dx needs sum(g) and sum(g * xhat) over the
row) and each column (dw = sum over rows of dy * xhat, db = sum of dy). One persistent
kernel does both: a grid of about SM-count x k blocks walks the rows (grid-stride,
rows_per_block at a time), keeps each row in registers as the inner persistent scheduler
does (its vector, threads per row and persistent batch), computes the row reductions and
the FULL outputs, and accumulates fp32 per-column partials of the column reductions in
registers across its rows. Each block writes one partial row per column reduction to a
workspace [blocks, cols]; a finalize launch adds them in a fixed order (deterministic, no
float atomics) and applies the column epilogue (the cast to the parameter dtype).

The registers hold the row and the column accumulators: both are counted. Where no layout
fits, InnerOuterSplit says why, and the executor splits the fusion into today's inner
kernel plus outer kernels (fuser/runtime/executor.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuser.backends.base import Backend
from fuser.backends.registry import get_backend
from fuser.errors import FuserError
from fuser.plan.build import column_results, make_plan
from fuser.schedulers.device import Device
from fuser.schedulers.heuristics import (
    BYTES_IN_FLIGHT_PER_SM,
    MAX_BATCH,
    MAX_BUFFER_REGISTERS,
    MAX_ROWS_PER_BLOCK,
    TARGET_WARPS_PER_SM,
    _estimate,
    _with,
    index_bits,
    pow2_ceil,
    vector_width,
)
from fuser.schedulers.registers import buffer_registers
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec

# The partial rows (written by the kernel, read by the finalize) may cost at most this
# share of the fusion's own traffic: it caps the grid where rows are short (H=768 bf16 at
# 1452 blocks would move 21% more bytes).
MAX_PARTIAL_SHARE = 1 / 8
# A block folds its thread rows' column partials through static shared memory: at most
# this much (the 48 KB static limit, with room for the row reductions' scratch).
MAX_FOLD_SHARED = 32 * 1024
# Separate loads of each row tensor a thread issues per row (its chunks, tail included):
# fewer score lower, (chunks / 4) ** 0.25. Measured on an H100 (LayerNorm backward, bf16,
# 8192 rows, kernel + finalize, both backends): vector 4 x batch 4 beat vector 8 x batch
# 2 (the same elements a thread) by 12-19% at H=1024 and 2048 in both backends and by
# 1-14% at H=4096; at H=1600 vector 4 x batch 3 + a 64-column tail beat vector 8 x
# batch 1 + a 1024-column tail by 7% in Triton and tied in CUDA.
LOADS_PER_THREAD = 4


class InnerOuterSplit(FuserError):
    """No inner-outer layout fits this kernel; the message says why. The executor then
    runs it as an inner kernel plus outer (column) kernels."""


@dataclass(frozen=True)
class Layout:
    """One inner-outer layout and what it costs."""

    vector: int
    threads_per_row: int
    rows_per_block: int
    batch: int
    tail: int
    covered: int
    per_thread: int
    registers: int
    buffer_registers: int
    accumulator_registers: int
    blocks_per_sm: int  # resident blocks the chosen k uses (k)
    blocks: int
    schedule: Schedule

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_block


def _schedule(spec: KernelSpec, v: int, tpr: int, rpb: int, batch: int, tail: int, blocks: int):
    blocks = min(blocks, -(-spec.rows // rpb))
    return Schedule(
        "inner_outer",
        spec.rows,
        spec.cols,
        v,
        tpr,
        rpb,
        batch,
        tail,
        num_warps=max(tpr * rpb // 32, 1),
        split_rows=blocks,
        index_bits=index_bits(spec),
        programs=blocks,
    )


def layouts(spec: KernelSpec, dev: Device, v: int, backend: Backend) -> tuple[list[Layout], str]:
    """Every inner-outer layout of `spec`'s row at vector `v` that fits, and (when none
    does) why the smallest did not."""
    cols, rows = spec.cols, spec.rows
    out: list[Layout] = []
    why_not = ""
    tpr = 1
    while tpr <= backend.limits.max_threads:
        chunk = tpr * v
        if chunk > pow2_ceil(cols) or chunk > cols * 2:
            break
        batch, rem = divmod(cols, chunk)
        tail = pow2_ceil(rem) if rem else 0
        if batch == 0:
            batch, tail = 1, 0
        covered = batch * chunk + tail
        rpb = 1
        while tpr * rpb <= backend.limits.max_threads and rpb <= MAX_ROWS_PER_BLOCK:
            threads = tpr * rpb
            if threads < 32 or rpb > pow2_ceil(rows) or batch > MAX_BATCH:
                rpb *= 2
                continue
            s = _schedule(spec, v, tpr, rpb, batch, tail, dev.sms)
            plan = make_plan(spec, s)
            regs = min(backend.estimate(plan), 255)
            tv = max(tail // tpr, 1) if tail else 0
            per_thread = batch * v + tv
            buf = per_thread * max(len(plan.kept), 1 if buffer_registers(spec, 1) else 0)
            acc = math.ceil(per_thread * sum(w.dtype.itemsize for w in plan.workspaces) / 4)
            bps = dev.blocks_per_sm(threads, regs, plan.column_rows_shared)
            if buf + acc > MAX_BUFFER_REGISTERS or regs >= 255 or not bps:
                why_not = why_not or (
                    f"{per_thread} row elements a thread at {threads} threads need {buf} "
                    f"buffer + {acc} column-accumulator registers (~{regs} in all; at most "
                    f"{MAX_BUFFER_REGISTERS} for buffers and accumulators, under 255 in all)"
                )
            elif plan.column_rows_shared > MAX_FOLD_SHARED:
                why_not = why_not or f"{plan.column_rows_shared} B of shared memory to fold"
            else:
                # k: the fewest resident blocks that give the SM its target warps and
                # bytes in flight (more blocks = more partial rows to write and add)
                inflight = threads * per_thread * _itemsize(spec)
                k = max(
                    -(-TARGET_WARPS_PER_SM // max(threads // 32, 1)),
                    -(-BYTES_IN_FLIGHT_PER_SM // inflight),
                )
                k = min(k, bps, max(1, _partial_cap(spec) // dev.sms))
                s = _schedule(spec, v, tpr, rpb, batch, tail, dev.sms * k)
                out.append(
                    Layout(
                        v,
                        tpr,
                        rpb,
                        batch,
                        tail,
                        covered,
                        per_thread,
                        regs,
                        buf,
                        acc,
                        k,
                        s.grid[0],
                        s,
                    )
                )
            rpb *= 2
        tpr *= 2
    return out, why_not


def _partial_cap(spec: KernelSpec) -> int:
    """The most blocks (partial rows) whose write and read stay within MAX_PARTIAL_SHARE
    of the traffic."""
    row = 2 * spec.cols * 4 * max(len(column_results(spec)[0]), 1)
    return int(spec.bytes_moved() * MAX_PARTIAL_SHARE // row)


def _itemsize(spec: KernelSpec) -> int:
    return max(
        (a.dtype.itemsize for a in spec.full_args() if not a.is_output),
        default=max((a.dtype.itemsize for a in spec.inputs), default=4),
    )


def score(spec: KernelSpec, c: Layout, backend: Backend) -> tuple[float, list[str]]:
    """Relative throughput of one layout (higher is better): the inner persistent
    scheduler's terms (latency covered by bytes in flight, occupancy, elements a thread,
    tails, several rows a block) times the share of the traffic that is the fusion's own
    (the partial rows are written once and read once by the finalize)."""
    warps_sm = c.blocks_per_sm * max(c.threads // 32, 1)
    lanes = spec.cols / c.covered
    inflight = c.blocks_per_sm * c.threads * c.per_thread * _itemsize(spec)
    latency = min(1.0, inflight / BYTES_IN_FLIGHT_PER_SM)
    occupancy = min(1.0, warps_sm / TARGET_WARPS_PER_SM) ** 0.5
    rows_pen = (
        1.0
        if c.rows_per_block == 1 or c.threads_per_row < 32
        else 0.9 ** math.log2(c.rows_per_block)
    )
    work = backend.per_thread_preference(c.per_thread, c.threads_per_row)
    tail_pen = 0.96 if c.tail else 1.0
    sync = {512: 0.98, 1024: 0.9}.get(c.threads_per_row, 1.0)
    chunks = c.batch + (1 if c.tail else 0)
    loads = min(1.0, chunks / LOADS_PER_THREAD) ** 0.25
    main = spec.bytes_moved()
    ncol = len(column_results(spec)[0])
    partial = 2 * c.blocks * spec.cols * 4 * ncol
    traffic = main / (main + partial)
    sc = lanes**0.25 * latency * occupancy * rows_pen * work * tail_pen * sync * traffic * loads
    why = [
        f"{c.rows_per_block} row(s) a step",
        f"{c.per_thread} elements/thread in {chunks} load(s) of each row tensor",
        "exact split" if not c.tail else "a tail chunk",
        f"{warps_sm} warps/SM",
        f"{inflight // 1024} KB in flight/SM",
        f"partials {partial / main:.1%} of the traffic",
    ]
    return sc, why


def schedule_inner_outer(
    spec: KernelSpec, dev: Device, backend: Backend | str = "triton"
) -> Schedule:
    """The inner-outer schedule of `spec` (row and column reductions), or InnerOuterSplit
    when its row does not fit registers."""
    backend = get_backend(backend)
    reasons: list[str] = []
    v = vector_width(spec, reasons)
    scored = []
    why_not = ""
    for vv in sorted({v, max(v // 2, 1)}, reverse=True):
        found, why = layouts(spec, dev, vv, backend)
        why_not = why_not or why
        for c in found:
            sc, why_c = score(spec, c, backend)
            scored.append((sc * (1.0 if vv == v else 0.99), why_c, c))
    if not scored:
        raise InnerOuterSplit(
            f"inner-outer: the row of {spec.cols} columns does not fit registers with the "
            f"column accumulators ({why_not or 'no layout'}); split into an inner kernel and "
            "column-reduction kernels"
        )
    _, why, best = max(scored, key=lambda x: (x[0], x[2].threads_per_row))
    if best.vector != v:
        reasons.append(
            f"vector {best.vector}: half the widest, for {best.batch + bool(best.tail)} loads of "
            f"each row tensor a thread (>= {LOADS_PER_THREAD} measured faster) or an exact split"
        )
    columns = column_results(spec)[0]
    s = best.schedule
    reasons.append(
        f"inner-outer: each row stays in registers ({best.per_thread} elements/thread) for "
        f"its row reductions; {len(columns)} column reduction(s) "
        f"({', '.join(n.out.name for n in columns)}) accumulate fp32 partials in registers "
        f"across the block's rows; {len(scored)} layouts scored"
    )
    reasons.append(
        f"threads_per_row {best.threads_per_row} x rows_per_block {best.rows_per_block} = "
        f"{best.threads} threads, persistent_batch {best.batch} chunks of "
        f"{best.threads_per_row * best.vector}"
        + (f" + a tail chunk of {best.tail}" if best.tail else ", exact split")
        + f"; chosen for: {', '.join(why)}"
    )
    reasons.append(
        f"registers ~{best.registers}: {best.buffer_registers} row buffer + "
        f"{best.accumulator_registers} column accumulators; "
        f"{dev.blocks_per_sm(best.threads, best.registers)} block(s)/SM fit"
    )
    reasons.append(
        f"grid {s.grid[0]} = {dev.sms} SMs x k={best.blocks_per_sm} (the fewest blocks/SM "
        f"giving {TARGET_WARPS_PER_SM} warps or {BYTES_IN_FLIGHT_PER_SM // 1024} KB in "
        f"flight, at most {_partial_cap(spec)} partial rows: {MAX_PARTIAL_SHARE:.0%} of "
        "the traffic; each block writes one partial row)"
        if s.grid[0] == dev.sms * best.blocks_per_sm
        else f"grid {s.grid[0]}: one block per row step ({spec.rows} rows)"
    )
    reasons.append(
        f"deterministic: {s.grid[0]} partial rows x {spec.cols} fp32 per column reduction, "
        "added in a fixed order by a finalize launch that also casts to the output dtype"
    )
    est = _estimate(spec, dev, s, best.registers, best.buffer_registers, best.covered)
    return _with(s, est, reasons)


def inner_outer_candidates(
    spec: KernelSpec, dev: Device, backend: Backend | str = "triton"
) -> list[Schedule]:
    """Every inner-outer layout the heuristic chooses among (for the sweep's regret)."""
    backend = get_backend(backend)
    v = vector_width(spec, [])
    out = []
    for vv in sorted({v, max(v // 2, 1)}):
        for c in layouts(spec, dev, vv, backend)[0]:
            est = _estimate(spec, dev, c.schedule, c.registers, c.buffer_registers, c.covered)
            out.append(_with(c.schedule, est, ["sweep candidate"]))
    return out
