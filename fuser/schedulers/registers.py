"""The register-pressure estimate.

registers/thread ~= overhead + persistent buffer words per thread. Constants are
calibrated against ptxas on sm_90 (see tests/test_resources.py, which checks the
estimate against the compiler for every sweep size).
"""

from __future__ import annotations

import math

from fuser.ir.dtypes import DType
from fuser.ir.ops import REDUCE, Op
from fuser.plan.kernel_plan import KernelPlan
from fuser.schedulers.spec import KernelSpec
from fuser.segmenter import Kind

# Calibrated on the seed fusion's sweep compiled by ptxas for sm_90 (Triton 3.6): a
# persistent kernel used ~22 registers of overhead, one register per fp32 row element kept
# across the reductions, ~2 per chunk (address and mask arithmetic) and ~1 per doubling
# of the warps (the cross-warp reduction). Estimates landed within 10% of ptxas.
BASE_OVERHEAD = 22
PER_CHUNK = 2
# A one-warp block (both backends declare 32 threads: Triton's .reqntid 32, the CUDA
# renderer's __launch_bounds__) is limited by the SM's 32 resident blocks, not by registers:
# up to 65536 / (32 x 32) = 64 a thread cost no occupancy, and ptxas spends ~8 more on a
# persistent row there (Triton, seed fusion, tpr32 rpb1: batch 2 est 42 -> ptxas 50, batch 3
# 52 -> 62, batch 4 62 -> 64; batch 5 at 72 is as modelled; two warps stay near the base).
ONE_WARP_SLACK = 8
ONE_WARP_FREE_REGISTERS = 64
# exp/log/erf/tanh expand into several instructions with live temporaries
TRANSCENDENTAL = {Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.LOG1P, Op.TANH, Op.ERF, Op.POW, Op.SIGMOID}


def access_chunks(plan: KernelPlan) -> int:
    """A Triton persistent row's chunks as PER_CHUNK prices them: one a 16-byte access of
    the widest row tensor, a narrower chunk its share (the half vector an exact split
    takes: two 8-byte chunks count as one), the tail one. ptxas (sm_90, no FMA
    contraction) gave the seed fusion the same registers at the same elements a thread and
    warps whichever the vector (fp16, 8192 rows: 4096 at 16 elements 8 warps 40 for both
    v8 x2 and v4 x4, 32 elements 4 warps 62 / 64, 8 elements 16 warps 28 / 30), so the
    address and mask arithmetic grows with the elements, not the chunks: priced by whole
    chunks, H=5140 v4 x5 + a tail was estimated 58 against ptxas 48."""
    widest = max((a.dtype.itemsize for a in plan.spec.full_args()), default=4)
    share = min(1.0, plan.vector * widest / 16)
    return math.ceil(plan.persistent_batch * share) + (1 if plan.tail else 0)


def overhead(spec: KernelSpec, chunks: int, warps: int) -> int:
    extra = 4 if any(n.op in TRANSCENDENTAL for n in spec.nodes) else 0
    return BASE_OVERHEAD + extra + PER_CHUNK * chunks + int(math.log2(max(warps, 1)))


def buffer_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers holding the row between reductions (none if nothing crosses one)."""
    return math.ceil(elements_per_thread * spec.crossing_words())


def row_buffer_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers a Triton persistent row keeps across its reductions: every form of the
    row live across one (row_live_words), at least buffer_registers'. The CUDA estimate
    keeps buffer_registers (calibrated on its own kernels)."""
    words = max(spec.crossing_words(), row_live_words(spec))
    return math.ceil(elements_per_thread * words)


def row_live_words(spec: KernelSpec) -> float:
    """32-bit registers per row element live across a row reduction in a persistent kernel
    written in the spec's node order (both renderers emit it so): at each reduction, the
    FULL values computed from the row's loads before it and used after it, in words of
    their dtype (a 16-bit value half a word). Index values (an iota compared with a
    per-row target) are not counted: the compiler recomputes them where they are used.

    More than spec.crossing_words() where two forms of the row cross one reduction: a
    cross-entropy written exp(x - max) / sum with the target's logit summed after the
    exp-sum (the bench's hand-built fusion) keeps exp(x - max) and x, 2 words. Priced at
    1, such a 16384 x 32000 bf16 kernel was estimated 110 registers at 512 threads and
    compiled (ptxas, sm_90) to 128 with 96 bytes spilled (benchmarks/results/
    cpu-2026-11-28-session11-sass/row_sass.txt), 1.64 ms on the H100 against 0.85 for a
    kernel that fits. fuser's own lowering (dynamo/ce_lower.py) keeps 1.
    """
    loaded = {a.value.id: a.dtype for a in spec.inputs if a.kind == Kind.FULL}
    position = {n.out.id: i for i, n in enumerate(spec.nodes)}
    position.update({vid: -1 for vid in loaded})  # loaded ahead of the first node
    last_use: dict[int, int] = {}
    for i, n in enumerate(spec.nodes):
        for v in n.inputs:
            last_use[v.id] = i
    width = {vid: max(d.itemsize, 2) / 4 for vid, d in loaded.items()}
    for n in spec.nodes:
        if n.op in REDUCE or spec.kinds.get(n.out.id) != Kind.FULL:
            continue
        if any(v.id in loaded or v.id in width for v in n.inputs):
            width[n.out.id] = max(n.out.dtype.itemsize, 2) / 4
    most = 0.0
    for i, n in enumerate(spec.nodes):
        if n.op in REDUCE:
            live = sum(w for vid, w in width.items() if position[vid] < i < last_use.get(vid, -1))
            most = max(most, live)
    return most


def math_live_words(spec: KernelSpec) -> float:
    """32-bit registers per row element the elementwise math keeps live at once: at each
    node in the spec's order, the FULL values computed (or loaded, from their first use)
    before it and used after it, in words of their dtype (a 16-bit value half a word).
    A broadcast row or column value is not counted (one register a thread row or column).
    The GELU backward's tanh-form derivative keeps x, x^2, tanh and a partial product: 4;
    a cast feeding a column sum: 1."""
    loaded = {a.value.id: a.dtype for a in spec.inputs if a.kind == Kind.FULL}
    last_use: dict[int, int] = {}
    born: dict[int, int] = {}
    for i, n in enumerate(spec.nodes):
        for v in n.inputs:
            last_use[v.id] = i
            if v.id in loaded:
                born.setdefault(v.id, i)
    width = {vid: max(d.itemsize, 2) / 4 for vid, d in loaded.items()}
    for i, n in enumerate(spec.nodes):
        # a broadcast row or column value is one register a thread row or column, not
        # one an element
        if n.op in REDUCE or n.op == Op.BROADCAST_IN_DIM:
            continue
        if spec.kinds.get(n.out.id) == Kind.FULL:
            born[n.out.id] = i
            width[n.out.id] = max(n.out.dtype.itemsize, 2) / 4
    return max(
        (
            sum(w for vid, w in width.items() if born.get(vid, i + 1) <= i < last_use.get(vid, -1))
            for i in range(len(spec.nodes))
        ),
        default=0.0,
    )


def working_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers for the chunk in flight: the loaded elements, packed 32 bits a register."""
    loaded = [a.dtype for a in spec.full_args() if not a.is_output]
    loaded += [n.out.dtype for n in spec.views]  # a view reads its input once more
    words = sum(d.itemsize for d in loaded) / 4
    return math.ceil(elements_per_thread * max(words, 1.0))


# A Triton looped kernel keeps each reduction's accumulator as a tile as wide as the
# iteration: one register per element of the thread's share, per accumulator. The base
# estimate covers one; ptxas spent ~3/4 register per element for each further one
# (online softmax bf16 128256 v8 x2: 2 accumulators, 63; cross-entropy 3, 79) and ~1/2
# per element for an int64 row (the iota of class indices: cross-entropy fp32 v4 x2, 64).
LOOPED_EXTRA_ACCUMULATOR = 0.75
LOOPED_INT64_ROW = 0.5


def _int64_row(spec: KernelSpec) -> bool:
    """True when an int64 value of the whole row is computed (an iota of class indices)."""
    return any(
        spec.kinds.get(n.out.id) == Kind.FULL and n.out.dtype == DType.int64 for n in spec.nodes
    )


def looped_accumulators(s: KernelPlan) -> int:
    """Accumulators live at once in looped kernel `s`: the most of any pass over the row
    (an online max-and-sum pass holds the plain reductions, the maxes and the sums; a
    pick is read once, not summed)."""
    spec, plan = s.spec, s.looped
    picked = {p.reduction.out.id for p in s.picks}
    most = 1
    for rounds in plan.passes:
        pairs = plan.pairs_in(rounds, spec)
        maxes = {id(p.max) for p in pairs}
        walked = [n for n in plan.reductions(rounds, spec) if n.out.id not in picked]
        most = max(most, len(walked) + len(maxes) + len(pairs))
    return most


def looped_chunks(s: KernelPlan) -> int:
    """A Triton looped iteration's chunks as PER_CHUNK prices them: its unroll, but no
    more than its 16-byte accesses (two at least) where narrow accesses took more chunks
    an iteration (softmax bf16 50257, vector 1 x 4 chunks: ptxas 32 registers, estimated
    40 so, 44 priced at 4 chunks; benchmarks/results/cpu-2026-11-28-session11-sass)."""
    itemsize = max((a.dtype.itemsize for a in s.spec.full_args()), default=4)
    return min(s.unroll, max(2, math.ceil(s.unroll * s.vector * itemsize / 16)))


# The Triton aligned-start walk (plan.walk_align): the shift and the row bases, live
# through the walk, and its head and tail chunks' element stores, each with its own
# predicate: ~4 plus 3 a row element past 4 a thread. sm_90, one chunk of 8 an iteration,
# 8 warps (benchmarks/results/cpu-2026-11-28-session17-sass/row_sass.txt): estimated 61-65
# with this term, ptxas 48-64 for the one-pass cross-entropy and softmax at 50257, 32001
# and 20001 columns (the one-pass cross-entropy at 50257: 48 and an 8-byte spill);
# tests/test_online.py's cross-entropy: bf16 73, fp32 40
TRITON_ALIGNED_WALK = (4, 3)


def looped_extra_registers(s: KernelPlan, elements_per_thread: int) -> int:
    """Registers of Triton looped kernel `s` beyond estimate_registers' (one accumulator)."""
    spec = s.spec
    extra = LOOPED_EXTRA_ACCUMULATOR * (looped_accumulators(s) - 1)
    extra += LOOPED_INT64_ROW if _int64_row(spec) else 0.0
    base, per = TRITON_ALIGNED_WALK
    walk = base + per * max(elements_per_thread - 4, 0) if s.walk_align else 0
    return math.ceil(elements_per_thread * extra) + walk


def estimate_registers(
    spec: KernelSpec, elements_per_thread: int, chunks: int, warps: int, persistent: bool
) -> tuple[int, int]:
    """(total, buffer) registers per thread for `elements_per_thread` row elements."""
    buf = row_buffer_registers(spec, elements_per_thread) if persistent else 0
    work = buf if persistent and buf else working_registers(spec, elements_per_thread)
    regs = overhead(spec, chunks, warps) + work
    if buf and warps == 1:
        regs = one_warp_registers(regs)
    return min(regs, 255), buf


# An inner_outer kernel holds, per row element of a thread: the values kept across the row
# reductions (ptxas keeps each of them, unlike the inner persistent kernel's newest form:
# LayerNorm backward keeps g and xhat), one accumulator per column reduction (kept across
# the whole row loop) and the loaded inputs' words. Fitted to ptxas (sm_90) on LayerNorm
# backward bf16 at H = 768 / 1600 / 4096 / 8192: Triton 80 / 80 / 120 / 120 (model 96 / 76
# / 116 / 116), CUDA 72 / 96 / 102 / 128 (model 88 / 93 / 108 / 108). The kernels have
# changed since (the Triton layout fix, vector 4): ptxas now gives Triton 96 / 127 / 126 /
# 116, CUDA 79 / 84 / 99 / 128; the backend terms below (the Triton tail's layout, CUDA's
# hoisted 4-byte column inputs) bring the model to Triton 96 / 110 / 116 / 116 and CUDA
# 88 / 93 / 108 / 124 (tests/test_inner_outer.py checks them).
INNER_OUTER_BASE_TRITON = 36
INNER_OUTER_BASE_CUDA = 28


def column_accumulator_registers(plan: KernelPlan, per_thread: int) -> int:
    """Registers of an inner_outer kernel's column partials: `per_thread` elements of
    each column reduction's accumulator (fp32: one word, fp64: two)."""
    words = sum(ws.dtype.itemsize for ws in plan.workspaces) / 4
    return math.ceil(per_thread * words)


def inner_outer_registers(
    plan: KernelPlan, per_thread: int, base: int, row_per_thread: int | None = None
) -> int:
    """Registers of an inner_outer kernel: `base`, plus per row element of a thread the
    kept values, the column accumulators and the loaded inputs' words. `row_per_thread`:
    the row values' elements a thread where their layout holds more than the
    accumulators' `per_thread` (Triton's tail)."""
    row = per_thread if row_per_thread is None else row_per_thread
    kept = max(len(plan.kept), 1 if plan.spec.crossing_words() else 0)
    regs = base + row * kept + column_accumulator_registers(plan, per_thread)
    regs += math.ceil(row * _words(plan.spec, (Kind.FULL,)))
    return min(regs, 255)


def triton_inner_outer_registers(plan: KernelPlan) -> int:
    """The Triton inner_outer estimate. A tail chunk narrower than the threads' vectors
    (LayerNorm backward 1600 = 3 x 512 + 64 at 128 threads a row, vector 4) is laid out,
    in its row values, in the chunks' layout (sizePerThread = the vector): the [rows, 64]
    tile is replicated over the threads and each holds `vector` of its elements, while
    its column accumulators take a layout of one element a thread (the TTGIR of that
    kernel). Priced at one element a thread, ptxas gave 127 against an estimate of 101."""
    s = plan
    tail = max(s.tail // s.threads_per_row, 1) if s.tail else 0
    per_thread = s.persistent_batch * s.vector + tail
    row_tail = max(s.tail // s.threads_per_row, min(s.vector, s.tail)) if s.tail else 0
    row = s.persistent_batch * s.vector + row_tail
    return inner_outer_registers(plan, per_thread, INNER_OUTER_BASE_TRITON, row)


# OUTER_TRITON_NOTE: a Triton outer reduction's thread holds, per element of its
# [rows_per_block, chunk] share, each reduction's fp32 accumulator and the producer's
# temporaries beyond the value summed (math_live_words - 1); its loads come through the
# staged row loop's shared memory (plan.row_stages), not held beside them. ptxas (sm_90,
# Triton 3.6; benchmarks/outer_fit.py --registers: 128 threads a row, 4 warps, split) at
# 8 / 16 / 32 elements a thread, against this estimate and the one before (a loaded word
# an element beside the accumulators): dy.float().sum(0) 32 / 35 / 56 (34 / 42 / 58;
# 42 / 58 / 90); the GELU backward's bias gradient 48 / 80 / 145 (62 / 94 / 158; 46 / 62 /
# 94: 5 blocks of 4 warps a SM where 3 fit); a scaled row's max and sum 40 / 56 / 103
# (42 / 58 / 90; 50 / 74 / 122); x * sigmoid(x) 32 / 40 / 64 (46 / 62 / 94, as before:
# its two live values are short-lived)
def triton_registers(plan: KernelPlan) -> int:
    """Registers per thread the Triton backend's kernel for `plan` is expected to use."""
    spec, s = plan.spec, plan
    if s.kind == "inner_outer":
        return triton_inner_outer_registers(plan)
    if s.kind == "inner_persistent":
        tail = max(s.tail // s.threads_per_row, 1) if s.tail else 0
        per_thread = s.persistent_batch * s.vector + tail
        regs, _ = estimate_registers(spec, per_thread, access_chunks(s), s.num_warps, True)
        if s.programs:  # the next row's inputs are held while this row computes
            regs = min(regs + working_registers(spec, per_thread), 255)
        return regs
    if s.kind == "inner_looped":
        per_thread = s.vector * s.unroll
        regs, _ = estimate_registers(spec, per_thread, looped_chunks(s), s.num_warps, False)
        return min(regs + looped_extra_registers(s, per_thread), 255)
    per_thread = max(s.rows_per_block * s.chunk // s.threads, 1)
    if s.kind == "outer_reduction":
        # the [rows_per_block, chunk] fp32 accumulator tile of each reduction, and the
        # producer's temporaries beyond the value a reduction consumes (OUTER_TRITON_NOTE)
        words = len(spec.reductions) + max(0.0, math_live_words(spec) - 1)
        return min(overhead(spec, 1, s.num_warps) + math.ceil(per_thread * words), 255)
    return estimate_registers(spec, per_thread, 1, s.num_warps, False)[0]


def one_warp_registers(regs: int) -> int:
    """What ptxas spends on a persistent row in a one-warp block estimated at `regs`:
    ~ONE_WARP_SLACK more, up to the 64 that still keep 32 blocks resident."""
    if regs >= ONE_WARP_FREE_REGISTERS:
        return regs
    return min(ONE_WARP_FREE_REGISTERS, regs + ONE_WARP_SLACK)


# -- the CUDA backend ----------------------------------------------------------------------
# The CUDA renderer (fuser/codegen/cuda) spends registers differently from Triton: a
# thread's chunks share one address (constant offsets), all FULL loads of a pass are issued
# before the math, and column inputs are loaded where they are used. Calibrated against
# NVRTC 13 + ptxas for sm_90 on the seed sweep, layernorm, softmax, column sums, pointwise
# and looped kernels in fp16/bf16/fp32 (tests/test_cuda_backend.py checks them).
# Persistent: ~21 registers of indices, row values and the reduction, plus the buffers,
# plus about an eighth of the column-input words of the row (their loads run ahead).
# (24 while cuda.core's NVRTC path still contracted multiply-adds; without contraction
# NVRTC uses from 8 more to 21 fewer on the seed sweep and the layernorm/softmax cases, 2.4
# fewer on average, and 24 overestimated by 3.8 on average, 21 by 0.8:
# benchmarks/results/cpu-2026-11-24-cuda-registers.)
CUDA_PERSISTENT_BASE = 21
CUDA_COLUMN_LOOKAHEAD = 8
CUDA_PREFETCH_PER_WORD = 2
# Looped: ~22 plus the input words of one iteration (v x unroll elements per thread).
CUDA_LOOPED_BASE = 22
# ...plus ~3 per element of the iteration where the row holds int64 values (an iota of
# class indices compared with a target: cross-entropy at 50257 v1 +9, 128256 fp32 v4 x2
# +18, bf16 v8 x2 +47 over the base; measured with the online max-and-sum pass).
CUDA_LOOPED_PER_INT64_ELEMENT = 3
# The aligned-start walk's head (its slots predicated per element, the shift live through
# the row): ptxas (sm_90) gave softmax bf16 50257 v8 x2 46 registers (base model 30) and
# cross-entropy fp32 50257 v4 x2 75 (54).
# With an int64 row (cross-entropy's class iota) the walk cost 21 more at 8 elements an
# iteration (fp32 v4 x2: 75 against 54) and 1 at 16 (bf16 v8 x2: 79 against 78): a
# two-point fit, to be refitted as more walks are compiled.
CUDA_ALIGNED_WALK = 16


def aligned_walk_registers(spec: KernelSpec, per_thread: int) -> int:
    """Registers a CUDA aligned-start walk adds to the looped estimate."""
    if _int64_row(spec):
        return max(0, math.ceil(41 - 2.5 * per_thread))
    return CUDA_ALIGNED_WALK


# Column reduction: ~12 plus one accumulator per column per reduction plus the input
# words of the rows in flight.
CUDA_OUTER_BASE = 12
# Pointwise: ~20 plus one per element of the thread's tile share (packed loads, the fp32
# math and the packed stores overlap).
CUDA_POINTWISE_BASE = 20
# A VIEW read (slice/cat) in a CUDA pointwise kernel: element loads at mapped columns, with
# their own address and range predicate. A guess of 2 per view, to be measured with ptxas.
CUDA_VIEW_REGISTERS = 2


def _words(spec: KernelSpec, kinds: tuple, outputs: bool = False) -> float:
    """32-bit words per element of the arguments of `kinds` (inputs, or outputs)."""
    return (
        sum(a.dtype.itemsize for a in spec.args if a.kind in kinds and a.is_output == outputs) / 4
    )


# The CUDA inner_outer kernel loads its column inputs in the row loop, but they do not
# change from row to row (const __restrict__): ptxas hoists the loads above the loop and
# keeps their values live through it. A 4-byte input stays in registers, a word an element
# (LayerNorm backward bf16 at 8192 columns, 16 elements a thread, reads w as fp32: ptxas
# 127 where the same kernel with bf16 w takes 98; at 4096 fp32 w 124, bf16 99, no w 96):
# 2-byte inputs cost little (+3 at 16 elements, within the base).
def _hoisted_column_words(spec: KernelSpec) -> float:
    """32-bit words an element of the column inputs ptxas keeps across a CUDA
    inner_outer row loop (those of 4+ bytes)."""
    return sum(
        a.dtype.itemsize / 4
        for a in spec.args
        if a.kind == Kind.COL and not a.is_output and a.dtype.itemsize >= 4
    )


def cuda_registers(plan: KernelPlan) -> int:
    """Registers per thread the CUDA backend's kernel for `plan` is expected to use."""
    spec, s = plan.spec, plan
    if s.kind == "inner_outer":
        per_thread = s.persistent_batch * s.vector + s.tail_vector
        regs = inner_outer_registers(plan, per_thread, INNER_OUTER_BASE_CUDA)
        regs += math.ceil(per_thread * _hoisted_column_words(spec))
    elif s.kind == "inner_persistent":
        per_thread = s.persistent_batch * s.vector + s.tail_vector
        buf = buffer_registers(spec, per_thread)
        regs = CUDA_PERSISTENT_BASE + buf
        regs += math.ceil(per_thread * _words(spec, (Kind.COL,)) / CUDA_COLUMN_LOOKAHEAD)
        if s.programs:
            # the next row's loads, held through this row's passes: measured ~2 registers
            # per loaded word (seed fusion, fp16: 5140 +28, 12288 +47, 16384 +33, 20480 +25)
            regs += math.ceil(CUDA_PREFETCH_PER_WORD * per_thread * _words(spec, (Kind.FULL,)))
        if s.threads == 32 and buf:
            regs = one_warp_registers(regs)  # measured the same through NVRTC
    elif s.kind == "inner_looped":
        per_thread = s.vector * s.unroll
        regs = CUDA_LOOPED_BASE + math.ceil(per_thread * _words(spec, (Kind.FULL,)))
        if _int64_row(spec):
            regs += CUDA_LOOPED_PER_INT64_ELEMENT * per_thread
        if s.walk_align:
            regs += aligned_walk_registers(spec, per_thread)
    elif s.kind == "outer_reduction":
        in_flight = max(s.rows_per_block // (s.threads // s.threads_per_row), 1)
        regs = CUDA_OUTER_BASE + s.vector * len(spec.reductions)
        regs += math.ceil(in_flight * s.vector * _words(spec, (Kind.FULL,)))
    else:
        tile_vectors = s.threads_per_row * s.rows_per_block
        regs = CUDA_POINTWISE_BASE + max(tile_vectors // s.threads, 1) * s.vector
        # a view's element reads: its address and predicate (an estimate, not yet
        # calibrated against ptxas)
        regs += CUDA_VIEW_REGISTERS * len(spec.views)
    return min(regs, 255)
