"""Heuristics: choose a Schedule for a KernelSpec, with the reason for every choice."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fuser.backends.base import Backend
from fuser.backends.registry import get_backend
from fuser.errors import ScheduleError
from fuser.plan.build import ASYNC_BYTES, aligned_walk, rereads_row
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
from fuser.schedulers.online import looped_plan
from fuser.schedulers.outer import outer_candidates, schedule_outer
from fuser.schedulers.registers import buffer_registers
from fuser.schedulers.schedule import GRID_LIMITS, Estimate, Schedule
from fuser.schedulers.spec import KernelSpec

# re-exported: the helpers lived here before fuser/schedulers/common.py
__all__ = [
    "candidate_schedules",
    "choose_schedule",
    "index_bits",
    "pow2_ceil",
    "pow2_floor",
    "registers",
    "schedule_inner",
    "schedule_looped",
    "schedule_outer",
    "schedule_pointwise",
    "vector_width",
]

# A persistent row keeps at most this many buffer registers per thread; beyond it the
# row is looped instead (nvFuser budgets about half of the 255 for buffers).
MAX_BUFFER_REGISTERS = 128
# Bytes each SM should have in flight to cover DRAM latency on Hopper. Little's law gives
# 3.35 TB/s * ~0.6 us / 132 SMs ~= 16 KB; the H100 sweep agrees (8192x1024 was fastest
# at 48 warps/SM x 8 fp16 elements = 24 KB, and lost 7% at 42 KB with fewer warps).
BYTES_IN_FLIGHT_PER_SM = 16 * 1024
# Warps per SM below which latency hiding suffers (nvFuser aims near 28; the H100 sweep
# ran 16384 at 16 warps/SM within 0.4% of the best).
TARGET_WARPS_PER_SM = 16
# Persistent batch cap. nvFuser caps near 10; past 8 chunks ptxas kept both the fp16 loads
# and the fp32 row live (12288 x batch 12 reached 254 registers), so fuser stops at 8.
MAX_BATCH = 8
# More rows per block than this grew registers beyond the model (1536 x rpb 8: 112 vs 85).
MAX_ROWS_PER_BLOCK = 4
# A looped kernel that reads its row twice keeps its resident rows within this share of
# the L2, so the second read hits (the rest holds the gradient's written lines and other
# traffic): at 8192x50257 bf16, 6 blocks/SM x 132 x 100 KB = 80 MB did not fit in 50 MB.
L2_ROWS_SHARE = 0.8


# -- pointwise ---------------------------------------------------------------------
def schedule_pointwise(
    spec: KernelSpec,
    dev: Device,
    per_block: int = 1024,
    warps: int | None = None,
    backend: Backend | str = "triton",
) -> Schedule:
    reasons: list[str] = []
    v = vector_width(spec, reasons)
    # 1024-element tiles of 4 warps, 8 elements a thread (one 16-byte access of 2-byte
    # elements, two of fp32): timed over the pointwise space on an H200 (session 21),
    # within 0.6% of the best for rotary forward and backward (D = 64, 128) and GELU
    # forward and backward in bf16, where 4096-element tiles of 16 a thread lost 6-11%
    # (more blocks resident, fewer registers each); 3.2% off fp32 GELU's best (4096
    # elements, 16 warps), where 4 elements a thread lost 5.2%
    per_block = min(per_block, pow2_ceil(spec.cols * spec.rows))
    chunk = min(pow2_ceil(spec.cols), per_block, 1024 * v)
    tiles = -(-spec.cols // chunk)
    if tiles > GRID_LIMITS[1] and chunk < 1024 * v:
        # a row's column tiles go on the grid's y (at most 65535): a long row (a 1-D
        # tensor of 100M elements) takes wider tiles, up to 1024 threads of v
        wide = min(pow2_ceil(-(-spec.cols // GRID_LIMITS[1])), 1024 * v)
        reasons.append(
            f"{tiles} column tiles of {chunk} would pass the grid's y limit "
            f"({GRID_LIMITS[1]}): {wide}-column tiles"
        )
        chunk = wide
        per_block = max(per_block, chunk)
    tpr = max(chunk // v, 1)
    rpb = max(min(per_block // chunk, pow2_ceil(spec.rows)), 1)
    if warps is None:
        warps = pow2_floor(max(1, min(8, tpr * rpb * v // (32 * 8))))
    s = Schedule(
        "pointwise",
        spec.rows,
        spec.cols,
        v,
        tpr,
        rpb,
        num_warps=warps,
        index_bits=index_bits(spec),
    )
    reasons.append(
        f"tile {rpb} rows x {chunk} cols = {rpb * chunk} elements per block, "
        f"{warps} warps: ~{rpb * chunk // (warps * 32)} elements per thread"
    )
    if spec.cols % chunk == 0 and spec.rows % rpb == 0:
        reasons.append("exact split: the tile divides the domain, no predicates")
    regs = registers(spec, s, backend)
    covered = -(-spec.cols // chunk) * chunk
    est = _estimate(spec, dev, s, regs, 0, covered)
    return _with(s, est, reasons)


# -- inner (row) reductions and persistent normalization ----------------------------
@dataclass(frozen=True)
class Candidate:
    """One persistent layout of a row: `threads_per_row` x `rows_per_block` threads, each
    keeping `batch` chunks (plus a `tail` chunk) of `per_thread` row elements."""

    threads_per_row: int
    rows_per_block: int
    batch: int
    tail: int
    covered: int  # columns the chunks cover (the row, plus padding lanes)
    per_thread: int
    registers: int  # the backend's estimate
    buffer_registers: int  # of which the row kept across the reductions

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_block


def _persistent_schedule(
    spec: KernelSpec, v: int, c: Candidate, programs: int = 0, estimate: Estimate | None = None
) -> Schedule:
    return Schedule(
        "inner_persistent",
        spec.rows,
        spec.cols,
        v,
        c.threads_per_row,
        c.rows_per_block,
        c.batch,
        c.tail,
        num_warps=max(c.threads // 32, 1),
        index_bits=index_bits(spec),
        programs=programs,
        estimate=estimate,
    )


def _persistent_candidates(
    spec: KernelSpec, dev: Device, v: int, backend: Backend, fill_warp: bool = False
) -> list[Candidate]:
    """The persistent layouts of a row with at least a warp a block. fill_warp: also those
    whose row is so narrow that MAX_ROWS_PER_BLOCK rows fill no warp; they take the rows
    that fill one (where there are that many)."""
    cols, rows = spec.cols, spec.rows
    out = []
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
        per_thread = batch * v + max(tail // tpr, 1 if tail else 0)
        max_rpb = min(pow2_ceil(rows), max(MAX_ROWS_PER_BLOCK, 32 // tpr if fill_warp else 0))
        rpb = 1
        while tpr * rpb <= backend.limits.max_threads:
            threads = tpr * rpb
            if threads >= 32 and rpb <= max_rpb and batch <= MAX_BATCH:
                c = Candidate(tpr, rpb, batch, tail, covered, per_thread, 0, 0)
                regs = min(registers(spec, _persistent_schedule(spec, v, c), backend), 255)
                buf = buffer_registers(spec, per_thread)
                out.append(replace(c, registers=regs, buffer_registers=buf))
            rpb *= 2
        tpr *= 2
    return out


def _score(
    spec: KernelSpec, dev: Device, c: Candidate, itemsize: int, backend: Backend
) -> tuple[float, list[str]]:
    """Estimated relative throughput of one persistent candidate (higher is better).

    Calibrated on the H100 sweep of the seed fusion (benchmarks/results/h100-2026-11-21-sweep1:
    every candidate timed): one row per block wins, by 15-60% over 2-4 rows per block
    (Triton lays a [rows, chunk] tile out across warps in both dimensions and the row
    reduction then crosses them); 8-32 elements per thread (the backend's preference); an
    exact split beats a tail by ~4%; enough warps per SM to cover DRAM latency; padding
    lanes cost little (masked lanes move no bytes).
    """
    tpr, rpb, per_thread = c.threads_per_row, c.rows_per_block, c.per_thread
    bps = dev.blocks_per_sm(c.threads, c.registers)
    if bps == 0:
        return 0.0, []
    warps_sm = bps * max(c.threads // 32, 1)
    lanes = spec.cols / c.covered
    inflight = bps * c.threads * per_thread * itemsize
    latency = min(1.0, inflight / BYTES_IN_FLIGHT_PER_SM)
    occupancy = min(1.0, warps_sm / TARGET_WARPS_PER_SM) ** 0.5
    # several rows per block only where one row cannot fill a warp
    rows_pen = 1.0 if rpb == 1 or tpr < 32 else 0.8 ** math.log2(rpb)
    work = backend.per_thread_preference(per_thread, tpr)
    tail_pen = 0.96 if c.tail else 1.0
    # a row spread over 16+ warps pays for the cross-warp reduction (shared memory)
    sync = {512: 0.98, 1024: 0.9}.get(tpr, 1.0)
    score = lanes**0.25 * latency * occupancy * rows_pen * work * tail_pen * sync
    why = [
        f"{rpb} row(s) per block",
        f"{per_thread} elements/thread",
        "exact split" if not c.tail else "a tail chunk",
        f"{warps_sm} warps/SM",
        f"{inflight // 1024} KB in flight/SM",
        f"lanes {lanes:.0%} useful",
    ]
    return score, why


def _inner_schedule(
    spec: KernelSpec,
    dev: Device,
    v: int,
    c: Candidate,
    reasons: list[str],
    backend: Backend,
    prefetch: bool = False,
) -> Schedule:
    regs, programs = c.registers, 0
    if prefetch:
        # the next row's inputs are held while this row computes: the estimate of the
        # prefetching kernel decides how many programs stay resident
        regs = min(registers(spec, _persistent_schedule(spec, v, c, programs=1), backend), 255)
        programs = dev.sms * max(dev.blocks_per_sm(c.threads, regs), 1)
    s = _persistent_schedule(spec, v, c, programs)
    return _with(s, _estimate(spec, dev, s, regs, c.buffer_registers, c.covered), reasons)


def _inner_candidates(
    spec: KernelSpec, dev: Device, vectors: list[int], backend: Backend
) -> list[tuple[int, Candidate]]:
    """(vector, candidate) for each persistent layout of the row at these vectors."""

    # a candidate must fit on an SM at all (1024 threads x 95 registers does not: a
    # 16-byte vector lets 8 chunks cover 50257 columns, too many registers for one block)
    def fitting(fill_warp: bool) -> list[tuple[int, Candidate]]:
        return [
            (v, c)
            for v in vectors
            for c in _persistent_candidates(spec, dev, v, backend, fill_warp)
            if c.buffer_registers <= MAX_BUFFER_REGISTERS
            and c.registers < 255
            and dev.blocks_per_sm(c.threads, c.registers)
        ]

    # rows of a few columns (a softmax over 8 experts, a sum over a state of 8) fill no
    # warp with 4 rows a block: a warp of them, rather than the looped kernel's warp a row
    # (4096 x 8: 4096 blocks of one warp, each of 8 useful lanes)
    return fitting(False) or fitting(True)


def schedule_inner(spec: KernelSpec, dev: Device, backend: Backend | str = "triton") -> Schedule:
    backend = get_backend(backend)
    reasons: list[str] = []
    v = vector_width(spec, reasons)
    # full tiles may all come from broadcasts (no FULL input): then the widest input
    itemsize = max(
        (a.dtype.itemsize for a in spec.full_args() if not a.is_output),
        default=max((a.dtype.itemsize for a in spec.inputs), default=4),
    )
    # the widest vector, and half of it where that makes the split exact
    scored = []
    for vv, c in _inner_candidates(spec, dev, sorted({v, max(v // 2, 1)}, reverse=True), backend):
        sc, why = _score(spec, dev, c, itemsize, backend)
        scored.append((sc * (1.0 if vv == v else 0.99), why, vv, c))
    if not scored:
        wide = v
        # a narrow walk whose accesses cp.async can take is staged (softmax fp32 50257
        # 1.68x, build._walk_stages); the aligned walk was measured against the 2-byte
        # walks that cannot be (session 17, bf16 rows)
        staged = backend.limits.staged_walks and v * itemsize >= ASYNC_BYTES
        if backend.limits.aligned_walk and not staged:
            wide = aligned_walk_vector(spec, v, backend.limits.aligned_walk_all_args)
        if wide > v:
            reasons.append(
                f"aligned-start walk: vector {wide}; each row is walked from its start rounded "
                f"down to {wide} elements (a masked head up to the first aligned column, whole "
                "vectors after it), as the rows start unaligned only by their stride"
            )
            unroll = backend.limits.aligned_walk_unroll or None
            return schedule_looped(
                spec, dev, wide, reasons, backend=backend, align_walk=True, unroll=unroll
            )
        return schedule_looped(spec, dev, v, reasons, backend=backend)
    _, why, v_best, best = max(scored, key=lambda x: (x[0], x[3].threads_per_row))
    if v_best != v:
        reasons.append(f"vector {v_best}: half the widest, for an exact split of the row")
        v = v_best
    tpr, rpb, batch, tail = best.threads_per_row, best.rows_per_block, best.batch, best.tail
    exact = tail == 0 and spec.cols % (tpr * v) == 0
    reasons.append(
        f"persistent: the row stays in registers, {best.per_thread} elements/thread "
        f"({spec.crossing_words():.1f} words each cross the reductions), "
        f"{len(scored)} candidates scored"
    )
    reasons.append(
        f"threads_per_row {tpr} x rows_per_block {rpb} = {tpr * rpb} threads; "
        f"chosen for: {', '.join(why)}"
    )
    reasons.append(
        f"persistent_batch {batch} chunks of {tpr * v}"
        + (f" + a tail chunk of {tail} (the only masked one)" if tail else ", exact split")
    )
    if exact and spec.rows % rpb == 0:
        reasons.append("exact split: every chunk and row block is full, no predicates")
    chosen = _inner_schedule(spec, dev, v, best, reasons, backend)
    # "one block per SM" (at most the backend's few) must hold even if ptxas uses 10% fewer
    # registers than estimated
    # (16384 estimated 66, compiled to 64: two blocks fit, and prefetching lost 5%)
    few = backend.limits.prefetch_max_blocks_per_sm
    surely_few = dev.blocks_per_sm(tpr * rpb, int(best.registers * 0.9)) <= few
    if surely_few and rpb == 1 and spec.rows > 4 * dev.sms and backend.limits.prefetch:
        # With one resident block per SM nothing overlaps its reductions with loads, so
        # each program keeps its SM and loads the next row while it reduces this one
        # (H100: 8192x20480 12% faster, CUDA 0.355 -> 0.27 ms; at 2+ blocks/SM, 12288
        # and 16384, 5-7% slower).
        pre = _inner_schedule(spec, dev, v, best, list(reasons), backend, prefetch=True)
        assert pre.estimate is not None
        # the next row's registers must cost no resident block. CUDA on the H100, where
        # the plain kernel fits 2 per SM and the prefetching one 1: without prefetching
        # softmax 98304x20480 4.16 -> 2.93 ms, LayerNorm fwd+bwd 8192x16384 1.37 -> 1.20,
        # LayerNorm 8192x16384 0.235 -> 0.180; cross-entropy 8192x20480 0.425 -> 0.505
        # is the one case it lost (benchmarks/results/h100-2026-11-25-cuda-prefetch/).
        # At 1 and 1 prefetching won (LayerNorm 8192x20480: 0.355 -> 0.27 ms)
        plain_blocks = dev.blocks_per_sm(tpr * rpb, best.registers)
        blocks = dev.blocks_per_sm(tpr * rpb, pre.estimate.registers)
        if 1 <= blocks and blocks >= plain_blocks and pre.estimate.registers < 255:
            reasons.append(
                f"prefetch: one block per SM; {pre.grid[0]} resident programs each load "
                "their next row while reducing this one"
            )
            return replace(pre, reasons=tuple(reasons))
    lone = dev.blocks_per_sm(tpr * rpb, best.registers) == 1 and tpr * rpb < 1024
    long_row = best.buffer_registers >= LONE_ROW_REGISTERS
    # two reads of the row (one online or plain reduction pass, then the output pass; a
    # LayerNorm's mean-then-variance would read it three times: unmeasured) and rows
    # enough for several in flight on every SM
    two_reads = looped_plan(spec).count <= 2 and spec.rows > 4 * dev.sms
    if lone and long_row and two_reads and rereads_row(spec) and backend.limits.looped_l2_hints:
        # one block of fewer than 32 warps a SM, not prefetching: nothing overlaps its
        # row's loads with another row's reductions; the looped walk reads the row twice,
        # the second time from L2 (plan.walk_evict). H100, bf16 cross-entropy 16384 x
        # 32000: persistent 1.10 ms, looped 0.87 (8192 rows: 0.56, 0.44); 8192 x 32000
        # softmax bf16/fp16 1.10x, log_softmax 1.25-1.29x; rows the rule leaves alone
        # (24576, fp32 16000) unchanged (benchmarks/results/h100-2026-11-27-session11/
        # 3-looped-unroll, 8-lone-rule)
        reasons.append(
            f"not persistent: its best layout ({tpr * rpb} threads, ~{best.registers} "
            f"registers, {best.buffer_registers} of them the row) fits one block a SM, "
            "which leaves the SM idle while it reduces; the looped walk keeps several "
            "rows in flight and re-reads from L2"
        )
        return schedule_looped(spec, dev, v, reasons, backend=backend)
    return chosen


# a persistent row of this many registers a thread or more, alone on its SM, is walked
# instead (schedule_inner; LayerNorm fp16 16384 at 512 threads, 32 a thread, stays)
LONE_ROW_REGISTERS = 64
LOOPED_ACCESS_BYTES = 8  # a looped walk's loads in flight a thread an iteration, at least


def schedule_looped(
    spec: KernelSpec,
    dev: Device,
    v: int,
    reasons: list[str],
    warps: int | None = None,
    unroll: int | None = None,
    backend: Backend | str = "triton",
    align_walk: bool = False,
) -> Schedule:
    # 256 threads per row, 2 chunks per iteration: 4096 fp16 elements in flight per block
    chosen_warps = warps is not None
    if warps is None:
        warps = 8 if spec.cols >= 8 * 32 * v else max(1, pow2_floor(spec.cols // (32 * v)))
    tpr = warps * 32
    if unroll is None:
        unroll = 2 if spec.cols >= 2 * tpr * v else 1
        # accesses narrower than 8 bytes (a vector-1 walk of 16-bit rows): more chunks an
        # iteration, so that a thread has 8 bytes of loads in flight. H100, bf16 rows of
        # 50257: cross-entropy 1.17 -> 0.99 ms (x4), softmax 1.36 -> 1.29
        # (benchmarks/results/h100-2026-11-27-session11/3-looped-unroll)
        access = v * max((a.dtype.itemsize for a in spec.full_args()), default=4)
        wide = max(unroll, LOOPED_ACCESS_BYTES // access)
        if access < LOOPED_ACCESS_BYTES and spec.cols >= wide * tpr * v:
            unroll = wide
            reasons.append(
                f"{wide} chunks an iteration: {access}-byte accesses, {LOOPED_ACCESS_BYTES} "
                "bytes of loads in flight a thread"
            )
    plan = looped_plan(spec)
    if not chosen_warps and plan.count > 1 and get_backend(backend).limits.l2_rows_cap:
        warps = _l2_warps(spec, dev, v, warps, unroll, backend, reasons, align_walk)
        tpr = warps * 32
    reasons.append(
        f"looped: {spec.cols} columns do not fit in registers at {spec.crossing_words():.1f} "
        f"words/element; {len(plan.passes)} pass(es) over the row, {tpr * v * unroll} "
        "elements per iteration"
    )
    online = plan.reason(spec)
    if online:
        reasons.append(online)
    s = _looped(spec, v, warps, unroll, align_walk)
    regs = registers(spec, s, backend)
    return _with(s, _estimate(spec, dev, s, regs, 0, spec.cols), reasons)


def aligned_walk_vector(spec: KernelSpec, v: int, all_args: bool = False) -> int:
    """The vector of an aligned-start walk over rows that start unaligned only by their
    stride (fuser/plan/build.py aligned_walk), or `v` where none applies; `all_args`:
    only where every full argument, outputs included, takes whole vectors. The walk needs
    a head and a body: at least two iterations of 8 warps x 2 chunks."""
    fulls = spec.full_args()
    wide = max(16 // max((a.dtype.itemsize for a in fulls), default=4), 1)
    if wide <= v or spec.cols < 2 * 2 * 256 * wide:
        return v
    stride, names = aligned_walk(spec, wide)
    if not stride or (all_args and len(names) < len(fulls)):
        return v
    return wide


def _looped(
    spec: KernelSpec, v: int, warps: int, unroll: int, align_walk: bool = False
) -> Schedule:
    return Schedule(
        "inner_looped",
        spec.rows,
        spec.cols,
        v,
        warps * 32,
        1,
        unroll=unroll,
        num_warps=warps,
        index_bits=index_bits(spec),
        align_walk=align_walk,
    )


def row_read_bytes(spec: KernelSpec) -> int:
    """Bytes of one row of the FULL inputs: what a later pass over the row reads again."""
    return spec.cols * sum(a.dtype.itemsize for a in spec.full_args() if not a.is_output)


def _l2_warps(
    spec: KernelSpec,
    dev: Device,
    v: int,
    warps: int,
    unroll: int,
    backend: Backend,
    reasons: list[str],
    align_walk: bool = False,
) -> int:
    """Warps of a looped kernel that reads its row more than once: the resident rows
    (one a block) times the row's bytes stay within L2_ROWS_SHARE of the L2, so the later
    passes find the row there instead of in DRAM. More warps a block means fewer resident
    blocks (by threads and registers) and more bytes in flight per row."""
    row = row_read_bytes(spec)
    budget = int(dev.l2_bytes * L2_ROWS_SHARE)

    def in_flight(w: int) -> int:
        regs = registers(spec, _looped(spec, v, w, unroll, align_walk), backend)
        return dev.sms * max(dev.blocks_per_sm(w * 32, regs), 1)

    rows = in_flight(warps)
    if rows * row <= budget or spec.rows <= rows:
        return warps
    first = rows
    while rows * row > budget and warps * 32 < backend.limits.max_threads:
        warps *= 2
        rows = in_flight(warps)
    reasons.append(
        f"L2: {first} resident rows x {row // 1024} KB = {first * row >> 20} MB would outgrow "
        f"{L2_ROWS_SHARE:.0%} of the {dev.l2_bytes >> 20} MB L2 before the next pass reads the "
        f"row again; {warps} warps a block keep {rows} rows ({rows * row >> 20} MB) resident"
    )
    return warps


def choose_schedule(spec: KernelSpec, dev: Device, backend: Backend | str = "triton") -> Schedule:
    """The heuristic's schedule for `spec` on `dev`, chosen with `backend`'s estimate."""
    backend = get_backend(backend)
    _not_inner_outer(spec)
    if spec.layout.outer:
        return schedule_outer(spec, dev, backend=backend)
    if spec.layout.inner:
        return schedule_inner(spec, dev, backend)
    return schedule_pointwise(spec, dev, backend=backend)


def _not_inner_outer(spec: KernelSpec) -> None:  # row and column reductions: choose.py
    if spec.layout.inner_outer:
        raise ScheduleError(f"{spec.name}: row and column reductions (schedulers/choose.py)")


def candidate_schedules(
    spec: KernelSpec, dev: Device, backend: Backend | str = "triton"
) -> list[Schedule]:
    """Every legal schedule the heuristics choose among, for measuring their regret.

    The heuristic's own choice is always one of them (the sweep times all and reports
    the best beside it).
    """
    backend = get_backend(backend)
    _not_inner_outer(spec)
    out: list[Schedule] = []
    if spec.layout.outer:
        out += outer_candidates(spec, dev, backend)
    elif spec.layout.inner:
        v_best = vector_width(spec, [])
        for v in sorted({v_best, max(v_best // 2, 1)}):
            for _, c in _inner_candidates(spec, dev, [v], backend):
                out.append(_inner_schedule(spec, dev, v, c, ["sweep candidate"], backend))
                if c.rows_per_block == 1 and spec.rows > 2 * dev.sms and backend.limits.prefetch:
                    out.append(_inner_schedule(spec, dev, v, c, ["sweep candidate"], backend, True))
            if spec.cols > 2048 or not out:
                # narrow accesses (an odd row stride forces vector 1 at 50257) keep few
                # bytes in flight per thread: the sweep also tries 8 of them per iteration
                widest = max((a.dtype.itemsize for a in spec.full_args()), default=4)
                unrolls = (1, 2, 4) + ((8,) if v * widest < 16 else ())
                for warps in (4, 8, 16):
                    for unroll in unrolls:
                        if warps * 32 * v * unroll <= 2 * pow2_ceil(spec.cols):
                            out.append(schedule_looped(spec, dev, v, [], warps, unroll, backend))
    else:
        for per_block in (1024, 2048, 4096, 8192, 16384):
            for warps in (2, 4, 8, 16):
                out.append(schedule_pointwise(spec, dev, per_block, warps, backend))
    out.append(choose_schedule(spec, dev, backend))
    unique: dict[str, Schedule] = {}
    for sch in out:
        unique.setdefault(f"{sch.short()} {sch.grid}", sch)
    return list(unique.values())
