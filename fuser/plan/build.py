"""From a Schedule to a KernelPlan: one function per scheduler kind, the shared parts once.

What used to be decided inside the CUDA renderer lives here: the tail chunk's per-thread
width, each argument's access width, and which row values a persistent kernel keeps in
registers between its passes.
"""

from __future__ import annotations

from collections.abc import Callable

from fuser.config import config
from fuser.errors import ScheduleError
from fuser.ir.dtypes import accumulator
from fuser.ir.graph import Node, Value
from fuser.ir.ops import REDUCE, Op
from fuser.plan.kernel_plan import KernelPlan, RowPass, Workspace
from fuser.plan.picks import one_hot_picks
from fuser.schedulers.online import looped_plan
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import Arg, KernelSpec, access_width
from fuser.segmenter import Kind

PER_THREAD = (Kind.ROW, Kind.SCALAR)
# threads of an outer reduction's finalize block at most
FINALIZE_MAX_THREADS = 256
# an inner_outer finalize block adds FINALIZE_ROWS partials of FINALIZE_COLS columns at once
# (a warp's coalesced 128 bytes of fp32 a partial row; 16 rows in flight a block)
FINALIZE_COLS = 32
FINALIZE_ROWS = 16
# partials a finalize thread's loop adds an unrolled step (CUDA's #pragma unroll: loads of
# 4 partials in flight a thread; set when the finalize was written, not tuned since)
FINALIZE_UNROLL = 4


def pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def tail_vector(s: Schedule) -> int:
    """Elements per thread of a persistent row's tail chunk: the tail's width spread over
    the row's threads, at most a vector, at least 1 (0 without a tail)."""
    if not s.tail:
        return 0
    return max(1, min(s.vector, s.tail // s.threads_per_row))


def recomputed(spec: KernelSpec) -> frozenset[int]:
    """Values that depend on no FULL input (a broadcast, an iota, a column or row value):
    cheaper to recompute in every pass than to keep in registers."""
    cheap: set[int] = {a.value.id for a in spec.inputs if a.kind != Kind.FULL}
    for n in spec.nodes:
        if n.op in REDUCE or n.op == Op.CONST or all(v.id in cheap for v in n.inputs):
            cheap.update(v.id for v in n.outputs)
    return frozenset(cheap)


def row_passes(
    spec: KernelSpec, skip: frozenset[int] = frozenset()
) -> tuple[tuple[RowPass, ...], tuple[tuple[int, int], ...]]:
    """The passes of an inner persistent kernel (pass d runs after reduction round d) and
    the values kept in registers, with the pass that writes them. A FULL value is computed
    in the first pass that needs it; if a later pass needs it too, it is kept (the
    persistent buffer). Values that depend on no FULL input are recomputed instead.
    Outputs in `skip` are no pass's target (an inner_outer kernel's column results, which
    its finalize launch computes)."""
    consts = {n.out.id for n in spec.nodes if n.op == Op.CONST}
    producer = spec.producers
    cheap = recomputed(spec)
    placed: dict[int, int] = {}
    kept: dict[int, int] = {}
    passes = []
    for d in range(spec.rounds + 1):
        reductions = tuple(n for n in spec.reductions if spec.depth[n.out.id] == d + 1)
        targets: list[Value] = [n.inputs[0] for n in reductions]
        targets += [
            a.value
            for a in spec.outputs
            if a.kind in (Kind.FULL, Kind.COL)
            and spec.depth[a.value.id] == d
            and a.value.id not in skip
        ]
        need: set[int] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            if v.id in consts or spec.kind(v) in PER_THREAD:
                continue
            if v.id in placed and placed[v.id] < d:
                kept[v.id] = placed[v.id]
                continue
            if v.id not in cheap:
                placed[v.id] = d
            n = producer.get(v.id)
            if n is None or id(n) in need:
                continue
            need.add(id(n))
            stack += list(n.inputs)
        nodes = tuple(n for n in spec.nodes if id(n) in need)
        passes.append(RowPass(d, nodes, reductions))
    return tuple(passes), tuple(sorted(kept.items()))


def _packs(spec: KernelSpec, widths: set[int]) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        (a.name, w, access_width(spec, a, w)) for a in spec.args for w in sorted(widths) if w
    )


def _workspaces(spec: KernelSpec, s: Schedule) -> tuple[Workspace, ...]:
    if s.split_rows == 1:
        return ()
    return tuple(
        Workspace(f"ws_{n.out.name}", accumulator(n.inputs[0].dtype), n) for n in spec.reductions
    )


def gather_bits(spec: KernelSpec) -> tuple[tuple[str, int], ...]:
    """Each gathered table's row offset width: 64 bits where the offsets of its `bound`
    rows reach 2**31 (the threshold of the kernel's index_bits), else 32."""
    args = {a.value.id: a for a in spec.args}
    out = []
    for tid, g in spec.gathers.items():
        table = args[tid]
        out.append((table.name, 64 if table.extent(g.bound, spec.cols) >= 2**31 - 1 else 32))
    return tuple(out)


def _common(spec: KernelSpec, s: Schedule, **fields: object) -> KernelPlan:
    base: dict = dict(
        kind=s.kind,
        rows=s.rows,
        cols=s.cols,
        vector=s.vector,
        threads_per_row=s.threads_per_row,
        rows_per_block=s.rows_per_block,
        num_warps=s.num_warps,
        persistent_batch=s.persistent_batch,
        tail=s.tail,
        tail_vector=0,
        unroll=s.unroll,
        split_rows=s.split_rows,
        programs=s.programs,
        index_bits=s.index_bits,
        grid=s.grid,
        row_guard=not s.even_rows,
        col_guard=spec.cols % s.chunk != 0,
        packs=_packs(spec, {s.vector}),
        gather_bits=gather_bits(spec),
        spec=spec,
        schedule=s,
    )
    return KernelPlan(**(base | fields))


def plan_pointwise(spec: KernelSpec, s: Schedule) -> KernelPlan:
    tile = s.threads_per_row * s.rows_per_block  # vectors of a block's tile
    return _common(
        spec,
        s,
        vectors_per_thread=max(1, tile // s.threads),
        idle_threads=max(0, s.threads - tile),
    )


def plan_inner_persistent(spec: KernelSpec, s: Schedule) -> KernelPlan:
    tv = tail_vector(s)
    passes, kept = row_passes(spec)
    covered = s.persistent_batch * s.chunk + s.threads_per_row * tv
    # a prefetching row loop: the programs walk the rows grid apart, one a step; the
    # last step runs past the rows unless the programs divide them
    row_guard = spec.rows % s.grid[0] != 0 if s.programs else not s.even_rows
    return _common(
        spec,
        s,
        tail_vector=tv,
        row_guard=row_guard,
        col_guard=covered > spec.cols,
        packs=_packs(spec, {s.vector, tv}),
        passes=passes,
        kept=kept,
    )


def column_results(spec: KernelSpec) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """(the column reductions, the epilogue: the nodes after them, in order) of an
    inner_outer kernel. The epilogue also holds what it reads that the row kernel computes
    from the parameters (a broadcast column input, a scalar expression): the finalize
    recomputes those, since it sees none of the row kernel's values (the segmenter keeps
    every such value free of row data)."""
    cols = tuple(n for n in spec.reductions if spec.kind(n.out) == Kind.COL)
    after = {n.out.id for n in cols}
    tail = []
    for n in spec.nodes:
        if n.op not in REDUCE and any(v.id in after for v in n.inputs):
            after.update(v.id for v in n.outputs)
            tail.append(n)
    made_by = {v.id: n for n in spec.nodes for v in n.outputs}
    needed: set[int] = set()
    stack = [v.id for n in tail for v in n.inputs if v.id not in after]
    while stack:
        producer = made_by.get(stack.pop())
        if producer is None or id(producer) in needed:
            continue
        if producer.op in REDUCE or spec.kind(producer.out) in (Kind.FULL, Kind.ROW):
            raise ScheduleError(
                f"the column epilogue reads {producer.out.name}, computed from row data: "
                "the finalize cannot recompute it (the segmenter should have split here)"
            )
        needed.add(id(producer))
        stack.extend(v.id for v in producer.inputs)
    epilogue = tuple(n for n in spec.nodes if id(n) in needed or n in tail)
    return cols, epilogue


def _row_kernel_skips(spec: KernelSpec, columns: tuple[Node, ...], epilogue: tuple[Node, ...]):
    """Values the row kernel does not compute: the column reductions, what follows them,
    and the epilogue's recomputed producers that no row-kernel node reads."""
    skip = {v.id for n in (*columns, *epilogue) for v in n.outputs}
    tail_ids = {id(n) for n in (*columns, *epilogue)}
    used = {v.id for n in spec.nodes if id(n) not in tail_ids for v in n.inputs}
    after = {n.out.id for n in columns}
    for n in epilogue:
        if not any(v.id in after for v in n.inputs) and any(v.id in used for v in n.outputs):
            skip -= {v.id for v in n.outputs}  # a row op reads it too: computed there as well
        if any(v.id in after for v in n.inputs):
            after.update(v.id for v in n.outputs)
    return frozenset(skip)


def plan_inner_outer(spec: KernelSpec, s: Schedule) -> KernelPlan:
    tv = tail_vector(s)
    columns, epilogue = column_results(spec)
    skip = _row_kernel_skips(spec, columns, epilogue)
    passes, kept = row_passes(spec, skip)
    col_ids = {id(n) for n in columns}
    passes = tuple(
        RowPass(
            p.index,
            p.nodes,
            tuple(n for n in p.reductions if id(n) not in col_ids),
            tuple(n for n in p.reductions if id(n) in col_ids),
        )
        for p in passes
    )
    covered = s.persistent_batch * s.chunk + s.threads_per_row * tv
    blocks = s.grid[0]
    fin_cols = min(FINALIZE_COLS, pow2_ceil(spec.cols))
    fin_rows = min(FINALIZE_ROWS, pow2_ceil(blocks))
    # the thread rows of a block fold their partials chunk by chunk through shared
    # memory: a vector of accumulators a thread (reused by each chunk and reduction)
    word = max((accumulator(n.inputs[0].dtype).itemsize for n in columns), default=4)
    shared = s.threads * s.vector * word if s.rows_per_block > 1 else 0
    return _common(
        spec,
        s,
        tail_vector=tv,
        row_guard=spec.rows % (blocks * s.rows_per_block) != 0,
        col_guard=covered > spec.cols,
        packs=_packs(spec, {s.vector, tv, 1}),  # 1: the finalize's column a thread
        passes=passes,
        kept=kept,
        workspaces=tuple(
            Workspace(f"ws_{n.out.name}", accumulator(n.inputs[0].dtype), n) for n in columns
        ),
        epilogue=epilogue,
        finalize_threads=fin_cols * fin_rows,
        finalize_tpr=fin_cols,  # a column a thread
        finalize_grid=(-(-spec.cols // fin_cols),),
        finalize_col_guard=spec.cols % fin_cols != 0,
        finalize_unroll=FINALIZE_UNROLL,
        finalize_cols=fin_cols,
        finalize_rows=fin_rows,
        column_rows_shared=shared,
        row_stages=_inner_outer_stages(spec, s, covered),
    )


# the inner_outer row loop's pipeline (as the outer one's, below): each step's loads
# issued row_stages - 1 steps ahead through shared memory, so that they need not wait for
# the step before (its row reductions, then the column accumulators). H100
# (benchmarks/results/h100-2026-11-27-session6/6-staged/inner_outer.txt), 3 asked and
# lowered by the rule below: the GPT-2 residual form at 16384 x 768 (2 stages) 1.28x,
# at 8192 x 1600 (2) 1.34x, LayerNorm at 8192 x 4096 (3) 1.05x, RMSNorm at 8192 x 1600
# (3) 1.03x; 2 stages where 3 fit lost there (0.90-0.95x). FUSER_INNER_OUTER_STAGES
# (config.inner_outer_stages) sets it for a run (1: unstaged).
INNER_OUTER_STAGES = 3
# shared memory the staged loads of the blocks a SM holds may take (every pipelined
# loop: inner_outer, looped): the A100's 164 KB a SM less room for the reductions'
# scratch and the 1 KB a block the driver keeps, so staging costs no resident block on
# any preset
STAGED_SMEM_PER_SM = 144 * 1024


def _inner_outer_stages(spec: KernelSpec, s: Schedule, covered: int) -> int:
    """row_stages of an inner_outer row loop: config's (else INNER_OUTER_STAGES), fewer
    where the buffers of the blocks a SM holds would not fit STAGED_SMEM_PER_SM, and 1
    (not pipelined) where a block takes fewer than 2 x that many steps (short loops lost
    to the unstaged ones in the outer reductions). Triton keeps stages - 1 buffers of a
    step's loads, the column parameters' included (sm_90, the GPT-2 residual form at 768
    columns: 10.8 KB a buffer, 3 KB of it the fp32 weight). The blocks a SM holds: the
    estimate's (the grid is the SMs times at most that many); before there is one, as
    many as its threads allow. Not where several rows a step have a tail chunk: there
    ptxas gave the staged loop 31-54 more registers than the unstaged one (sm_90, the
    LayerNorm backward at 8192 x 1600, 2 rows a step of 3 chunks + a 64-column tail: 125
    -> 169 at 2 stages), a block fewer a SM than the grid needs (a second wave); without
    a tail, or at one row a step, at most 32 more, and the grid's blocks still fit
    (benchmarks/inner_outer_variants.py --sass)."""
    stages = config.inner_outer_stages or INNER_OUTER_STAGES
    if s.rows_per_block > 1 and s.tail:
        return 1
    steps = -(-spec.rows // (s.grid[0] * s.rows_per_block))
    tiles = [a for a in spec.inputs if a.kind in (Kind.FULL, Kind.COL)]
    per_row = [a for a in spec.inputs if a.kind == Kind.ROW]
    step_bytes = s.rows_per_block * (
        covered * sum(a.dtype.itemsize for a in tiles) + sum(a.dtype.itemsize for a in per_row)
    )
    resident = s.estimate.blocks_per_sm if s.estimate else max(2048 // s.threads, 1)
    while stages > 1 and resident * (stages - 1) * step_bytes > STAGED_SMEM_PER_SM:
        stages -= 1
    if stages < 2 or steps < 2 * stages or not any(a.kind == Kind.FULL for a in tiles):
        return 1
    return stages


def aligned_walk(spec: KernelSpec, v: int) -> tuple[int, tuple[str, ...]]:
    """(the row stride, the arguments) of an aligned-start walk at vector `v`, or (0, ())
    where none helps: every loaded FULL argument is contiguous along the row, its pointer
    16-byte aligned (well, v elements), and its rows start at the same offset modulo v
    (one shift for all), which is not 0 (else the rows are aligned already). Outputs with
    that stride take whole vectors too."""
    fulls = [a for a in spec.args if a.kind == Kind.FULL]
    loads = [a for a in fulls if not a.is_output]
    if v < 2 or spec.rows < 2 or spec.views or spec.gathers or not loads:
        return 0, ()
    if any(a.row_dims for a in spec.args):  # rows not one stride apart
        return 0, ()

    def fits(a: Arg) -> bool:
        return a.col_stride == 1 and a.align % (v * a.dtype.itemsize) == 0

    stride = loads[0].row_stride
    if stride % v == 0 or any(not fits(a) or (a.row_stride - stride) % v for a in loads):
        return 0, ()
    return stride, tuple(a.name for a in fulls if fits(a) and (a.row_stride - stride) % v == 0)


def rereads_row(spec: KernelSpec) -> bool:
    """Whether a looped walk reads its row again after a reduction pass: L2 hints then
    keep the first reads for the output pass (H100, bf16 cross-entropy: 16384 x 32000
    1.12 -> 0.94 ms, 8192 x 50257 1.22 -> 1.02, 16384 x 50257 unchanged; the session 11
    results' 1-ce-anatomy)."""
    return bool(spec.reductions) and any(a.kind in (Kind.FULL, Kind.COL) for a in spec.outputs)


def plan_inner_looped(spec: KernelSpec, s: Schedule) -> KernelPlan:
    width = s.chunk * s.unroll
    end = spec.cols // width * width
    tail = spec.cols - end
    walk: dict = {}
    if s.align_walk:
        stride, names = aligned_walk(spec, s.vector)
        if not stride or end < width:
            raise ScheduleError(f"{spec.name}: no aligned-start walk at vector {s.vector}")
        # the walk's positions are columns + shift: the tail reaches up to vector - 1
        # columns further, also where the loop ends at the row's last column
        tail += s.vector - 1
        # the others are read at the true column (position - shift): element by element
        packs = tuple(
            (a.name, s.vector, s.vector if a.name in names else access_width(spec, a, 1))
            for a in spec.args
        )
        walk = dict(
            walk_align=s.vector, walk_stride=stride, walk_args=names, packs=packs, col_guard=True
        )
    start = width if s.align_walk else 0  # the aligned walk's first iteration is its head
    widths = {n: p for n, w, p in walk.get("packs") or _packs(spec, {s.vector}) if w == s.vector}
    return _common(
        spec,
        s,
        looped=looped_plan(spec),
        picks=one_hot_picks(spec),
        walk_evict=rereads_row(spec),
        walk_width=width,
        walk_end=end,
        walk_tail=tail,
        walk_tail_slots=-(-tail // s.chunk),
        walk_stages=_walk_stages(spec, s, widths, (end - start) // width),
        **walk,
    )


# the looped row walk's pipeline (plan.walk_stages): every loop over the row issues an
# iteration's loads walk_stages - 1 iterations ahead through shared memory (Triton's
# tl.range num_stages: cp.async), where each iteration's loads otherwise wait for the
# previous one's math (the online max and sum's exps, the output pass's). H100
# (benchmarks/results/h100-2026-11-27-session6/6-staged/looped.txt): a walk of narrow
# loads gains (softmax of 8192 x 50257 fp32, one 4-byte element a thread an access: 3
# stages 1.68x), one of 16-byte vectors does not (the cross-entropy's row kernel, 16384 x
# 50257 bf16 at vector 8: 0.98x at 3 stages, 0.78x at 2; its registers go from 80 to 128,
# 3 resident blocks a SM -> 2), so a walk whose every staged access is WIDE_BYTES or more
# is not staged. FUSER_LOOPED_STAGES (config.looped_stages) sets it for a run, wide
# walks included.
WALK_STAGES = 3
WIDE_BYTES = 16
# cp.async copies 4, 8 or 16 bytes a thread: Triton pipelines no narrower load (a vector 1
# walk over 2-byte elements, the rows of contiguous odd-width bf16 logits)
ASYNC_BYTES = 4


def _walk_stages(spec: KernelSpec, s: Schedule, widths: dict[str, int], iterations: int) -> int:
    """The row walk's pipeline depth: config.looped_stages or WALK_STAGES where the loop
    takes at least two iterations a stage (shorter loops lost to their prologue in the
    outer row loop: 4 steps, 3 stages, 4-9% slower), some load can go through cp.async
    (`widths`: each argument's elements an access), and the loads of an iteration fit
    STAGE_BYTES, and the stages - 1 buffers Triton allocates for them STAGED_SMEM_PER_SM
    for the SM's resident blocks; else 1."""
    stages = config.looped_stages or WALK_STAGES
    loaded = [a for a in spec.args if a.kind in (Kind.FULL, Kind.COL) and not a.is_output]
    staged = [a for a in loaded if widths[a.name] * a.dtype.itemsize >= ASYNC_BYTES]
    tile = s.chunk * s.unroll * sum(a.dtype.itemsize for a in staged)
    blocks = s.estimate.blocks_per_sm if s.estimate else 1
    if stages <= 1 or not staged or iterations < 2 * stages:
        return 1
    wide = all(widths[a.name] * a.dtype.itemsize >= WIDE_BYTES for a in staged)
    if wide and not config.looped_stages:
        return 1
    if tile > STAGE_BYTES or blocks * (stages - 1) * tile > STAGED_SMEM_PER_SM:
        return 1
    return stages


def plan_outer(spec: KernelSpec, s: Schedule) -> KernelPlan:
    workspaces = _workspaces(spec, s)
    # the block's threads stand in thread rows of threads_per_row; a step takes at least
    # one row per thread row, rows_per_block if that is more
    thread_rows = s.threads // s.threads_per_row
    row_step = max(s.rows_per_block, thread_rows)
    covered = row_step * s.split_rows  # rows of one step of all the split blocks
    fin: dict = {}
    if workspaces:
        # the finalize: finalize_cols columns a block (finalize_cols / vector threads
        # across them), its other threads over the partials, each adding every
        # finalize_rows-th partial, then the thread rows combined in a fixed order
        fin_tpr = max(s.finalize_cols // s.vector, 1)
        threads = min(max(32, fin_tpr * pow2_ceil(s.split_rows)), FINALIZE_MAX_THREADS)
        threads = max(threads, fin_tpr)
        fin = dict(
            finalize_threads=threads,
            finalize_tpr=fin_tpr,
            finalize_rows=threads // fin_tpr,
            finalize_grid=(-(-spec.cols // (fin_tpr * s.vector)),),
            finalize_col_guard=spec.cols % (fin_tpr * s.vector) != 0,
            finalize_unroll=FINALIZE_UNROLL,
            finalize_cols=fin_tpr * s.vector,
        )
    return _common(
        spec,
        s,
        row_guard=spec.rows % covered != 0,
        row_stages=_row_stages(spec, s, row_step, -(-spec.rows // covered)),
        workspaces=workspaces,
        row_step=row_step,
        rows_in_flight=row_step // thread_rows,
        row_steps=-(-spec.rows // covered),
        **fin,
    )


# the outer row loop's pipeline: a step's loads issued ROW_STAGES - 1 steps ahead through
# shared memory. The H100 (benchmarks/results/h100-2026-11-27-session6/3-ce-outer/
# outer_variants.txt):
# the GELU-backward bias gradient at 16384 x 3072 went from 0.158 to 0.118 ms with 3
# stages (2 stages: 0.135), where each step's loads otherwise wait for the step before:
# the loop is as much math as memory, and nothing else overlaps them
ROW_STAGES = 3
STAGE_BYTES = 16 * 1024  # shared memory a stage may take (a block's tile of the loads)


def _row_stages(spec: KernelSpec, s: Schedule, row_step: int, steps: int) -> int:
    loaded = [a for a in spec.args if a.kind == Kind.FULL and not a.is_output]
    tile = row_step * s.threads_per_row * s.vector * sum(a.dtype.itemsize for a in loaded)
    if steps < 2 * ROW_STAGES or not loaded or tile > STAGE_BYTES:
        return 1
    return ROW_STAGES


PLANNERS: dict[str, Callable[[KernelSpec, Schedule], KernelPlan]] = {
    "pointwise": plan_pointwise,
    "inner_persistent": plan_inner_persistent,
    "inner_looped": plan_inner_looped,
    "outer_reduction": plan_outer,
    "inner_outer": plan_inner_outer,
}


def make_plan(spec: KernelSpec, schedule: Schedule) -> KernelPlan:
    """The KernelPlan of `schedule` for `spec`."""
    return PLANNERS[schedule.kind](spec, schedule)
