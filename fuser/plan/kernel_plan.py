"""KernelPlan: one kernel as both renderers print it, decided once.

A Schedule says how to cover the [rows, cols] domain; a KernelPlan is that choice worked
out into everything a renderer would otherwise re-derive: per-thread layout of the tail
chunk, the width of every argument's accesses, which row values are kept in registers
between the passes and which are recomputed, the passes over the row, the predicates, the
workspaces and the finalize launch, the grid. It is frozen, backend-neutral and prints as
text (`kernel.explain()` shows it); the register estimate reads it.

Where a backend ignores a field, the field says so (`IGNORED_BY`): Triton chooses its own
per-thread layout and register allocation, so it reads the tiles, not how a thread walks
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuser.ir.dtypes import DType
from fuser.ir.graph import Node
from fuser.plan.picks import Pick
from fuser.schedulers.online import LoopedPlan
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import Arg, KernelSpec

# plan fields a backend does not print, and why (item 4 of issue 17: every field is read
# by both renderers or says why one ignores it)
IGNORED_BY = {
    "cuda": {
        "tail": "a CUDA thread covers the tail chunk with tail_vector elements, made from it",
        "walk_args": "the CUDA renderer takes each argument's access width from packs",
        "row_stages": "the CUDA row loop keeps rows_in_flight loads a thread in registers "
        "(its own prefetch); it stages no rows in shared memory, and its inner_outer row "
        "loop none either (no cp.async pipeline is written for it)",
        "walk_stages": "a CUDA row walk's iteration keeps its unroll chunks' loads in flight "
        "in registers; it stages no columns in shared memory",
        "walk_evict": "the CUDA row walk gives its loads no L2 eviction hints (not yet "
        "written; measured for Triton only)",
        "picks": "the CUDA row walk still sums a one-hot select over the row (a compare, "
        "select and add an element); reading its one element is written for Triton only",
    },
    "triton": {
        "unroll": "Triton chooses its own unroll: it walks walk_width (chunk x unroll) "
        "columns an iteration as one tile",
        "tail_vector": "Triton lays the tail tile out over the threads itself",
        "packs": "Triton vectorizes what its alignment analysis proves (tl.multiple_of)",
        "kept": "Triton keeps a chunk's SSA values live as long as a later pass uses them",
        "vectors_per_thread": "Triton spreads a pointwise tile over the threads itself",
        "idle_threads": "Triton spreads a pointwise tile over the threads itself",
        "row_step": "Triton's outer row step is its [rows_per_block, chunk] tile: row_step "
        "wherever the loop takes more than one step (it is more only where the rows are "
        "fewer than the CUDA block's thread rows: one step either way; tests/test_plan.py)",
        "rows_in_flight": "Triton spreads a step's [rows_per_block, chunk] tile over the "
        "threads itself",
        "walk_tail_slots": "Triton walks the walk_tail columns as one masked tile the next "
        "power of two wide (a tl.arange's width; one cross-thread reduction, not one a "
        "chunk), and in an online pass as walk_width tiles (the lanes' running max and sum "
        "keep one shape)",
        "column_rows_shared": "Triton folds a block's rows of column partials with tl.sum",
        "finalize_unroll": "Triton chooses its own unroll of the finalize's partials loop",
        "finalize_tpr": "Triton spreads the finalize's [finalize_rows, finalize_cols] tile "
        "over its finalize_threads itself",
    },
}


@dataclass(frozen=True)
class RowPass:
    """One pass over a persistent row's registers: the nodes it computes (element-wise
    and the reductions it feeds), run after reduction round `index`; in an inner_outer
    kernel, `columns` are the column reductions it accumulates across the rows."""

    index: int
    nodes: tuple[Node, ...]
    reductions: tuple[Node, ...]
    columns: tuple[Node, ...] = ()


@dataclass(frozen=True)
class RowChunk:
    """One column tile of a persistent row: its first column, its width, and whether it
    reaches past the row's end (its lanes there are masked)."""

    offset: int
    width: int
    masked: bool


@dataclass(frozen=True)
class Workspace:
    """A partial-sum buffer of a split column reduction: split_rows x cols of `dtype`."""

    name: str
    dtype: DType
    reduction: Node


@dataclass(frozen=True)
class KernelPlan:
    # the scheduler kind: pointwise | inner_persistent | inner_looped | outer_reduction |
    # inner_outer
    kind: str
    rows: int
    cols: int
    # tiling: a block covers rows_per_block rows x chunk columns, chunk = tpr * vector
    vector: int
    threads_per_row: int
    rows_per_block: int
    num_warps: int
    persistent_batch: int
    tail: int  # columns of the tail chunk (0: the chunks divide the row)
    tail_vector: int  # elements per thread of the tail chunk (0: no tail)
    unroll: int
    split_rows: int
    programs: int  # resident programs of a prefetching row loop (0: one program per block)
    index_bits: int
    grid: tuple[int, ...]
    # predicates: a partial last row block (outer: a last step of the row loop reaching past
    # the rows); a chunk reaching past the row end
    row_guard: bool
    col_guard: bool
    # elements per access of each tensor argument in a slot of each width the kernel uses
    packs: tuple[tuple[str, int, int], ...]
    # inner persistent: the passes over the row, and the values kept in registers (value
    # id -> the pass writing them); every other row value is recomputed where it is used
    passes: tuple[RowPass, ...] = ()
    kept: tuple[tuple[int, int], ...] = ()
    # inner looped: the passes over the row and the online max-and-sum pairs
    looped: LoopedPlan | None = None
    workspaces: tuple[Workspace, ...] = ()
    # pointwise: vectors of the block's tile each thread walks, and the threads holding
    # none (a tile smaller than the block: they are predicated off)
    vectors_per_thread: int = 1
    idle_threads: int = 0
    # outer: the row loop; each step a block covers row_step rows, rows_in_flight loads a
    # thread (its thread rows x rows in flight), every split_rows-th step is this block's
    row_step: int = 0
    rows_in_flight: int = 1
    row_steps: int = 0
    # outer and inner_outer: the row loop's loads issued row_stages - 1 steps ahead,
    # staged in shared memory (1: each step's loads wait for the step before it)
    row_stages: int = 1
    # inner looped: a row is walked walk_width columns an iteration (unroll chunks) up to
    # walk_end; the walk_tail positions after it (cols - walk_end, plus walk_align - 1 for
    # the aligned-start walk's shift: a tail even where walk_end is cols) are one tail walk
    # of walk_tail_slots chunks, the last predicated if col_guard
    walk_width: int = 0
    walk_end: int = 0
    walk_tail: int = 0
    walk_tail_slots: int = 0
    # inner looped: every loop over the row (each reduction pass and the output pass)
    # issues an iteration's loads walk_stages - 1 iterations ahead, staged in shared
    # memory (1: each iteration's loads wait for the iteration before it)
    walk_stages: int = 1
    # inner looped: the reduction passes' loads ask L2 to keep their lines (evict_last:
    # the output pass reads the row again), the output pass's let them go (evict_first)
    walk_evict: bool = False
    # inner looped, aligned-start walk (0: off): rows whose start is not 16-byte aligned
    # (a contiguous odd width) are walked from their start rounded down to walk_align
    # elements: shift = (row * walk_stride) % walk_align, column = position - shift. The
    # first iteration (a masked head: columns < 0 are off) ends on an aligned column, the
    # body walks [walk_width, walk_end) unmasked, then the tail; the arguments of
    # walk_args (row stride = walk_stride mod walk_align) take whole vectors.
    walk_align: int = 0
    walk_stride: int = 0
    walk_args: tuple[str, ...] = ()
    # the finalize launch adding the workspaces' partials (0 threads: no finalize): its
    # grid of column tiles, finalize_tpr threads x vector columns a block, finalize_rows
    # thread rows each adding every finalize_rows-th partial, combined in a fixed order
    finalize_threads: int = 0
    finalize_tpr: int = 0
    finalize_rows: int = 0
    finalize_grid: tuple[int, ...] = ()
    # its last column block reaching past the row end (its columns predicated); the
    # partials a thread's loop over them takes an unrolled step
    finalize_col_guard: bool = False
    finalize_unroll: int = 1
    # inner_outer: the kernel walks the rows in a grid-stride loop (programs blocks,
    # rows_per_block rows a step, the last step's rows guarded if row_guard) and
    # accumulates the column reductions of each pass (RowPass.columns) in fp32 registers,
    # one partial per thread row; a block folds its thread rows (CUDA: through
    # column_rows_shared bytes of shared memory, a fixed-order tree) and writes one
    # partial row per workspace. Its finalize adds finalize_rows partials of
    # finalize_cols columns at once, folds them in a fixed order, then computes
    # `epilogue`: the column ops after the column reductions (a cast to the parameter dtype).
    epilogue: tuple[Node, ...] = ()
    finalize_cols: int = 0
    column_rows_shared: int = 0
    # each gathered table's name and the bits of its row offset (index * row stride): 64
    # where the table's offsets reach 2**31, whatever index_bits says (that bounds the
    # kernel's own rows, not the table's: an embedding of 2**31 elements gathered by 8
    # rows); else 32. A renderer widens the loaded index to it before the multiply.
    gather_bits: tuple[tuple[str, int], ...] = ()
    # inner looped: row sums that are one-hot selects (fuser/plan/picks.py), each read as
    # the one element its index names after the row walk, not summed along it
    picks: tuple[Pick, ...] = ()
    spec: KernelSpec = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    schedule: Schedule = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    @property
    def chunk(self) -> int:
        return self.threads_per_row * self.vector

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @property
    def finalize_warps(self) -> int:
        """num_warps of the finalize launch: its threads in warps, at least one. A finalize
        of a few columns over a few blocks' partials has fewer than 32 threads (a CUDA
        block takes them as they are); Triton asserts a power of two, and 0 is not one:
        inner-outer kernels of narrow rows failed to compile on a GPU (found by
        fuser.fuzz.programs; the CPU interpreter does not check)."""
        return max(1, self.finalize_threads // 32)

    @property
    def finalize(self) -> bool:
        """A second launch adds the workspaces' partial sums in a fixed order."""
        return bool(self.workspaces)

    @property
    def chunk_count(self) -> int:
        return self.persistent_batch + (1 if self.tail else 0)

    def chunks(self) -> list[RowChunk]:
        """Every chunk of a persistent row; the last may be a smaller tail."""
        out = [(i * self.chunk, self.chunk) for i in range(self.persistent_batch)]
        if self.tail:
            out.append((self.persistent_batch * self.chunk, self.tail))
        return [RowChunk(off, width, off + width > self.cols) for off, width in out]

    def pack(self, a: Arg, width: int) -> int:
        """Elements per access of `a` in a slot of `width` elements."""
        for name, w, p in self.packs:
            if name == a.name and w == width:
                return p
        raise KeyError(f"the plan has no access width for {a.name} in a slot of {width}")

    def gather_index_bits(self, table: Arg) -> int:
        """The bits of gathered `table`'s row offset (gather_bits)."""
        return dict(self.gather_bits)[table.name]

    def kept_by(self, index: int) -> set[int]:
        return {vid for vid, d in self.kept if d == index}

    def text(self) -> str:
        lines = [f"plan: {self.kind}, grid {self.grid}, {self.threads} threads a block"]
        tile = (
            f"  tile: {self.rows_per_block} row(s) x {self.chunk} columns "
            f"({self.threads_per_row} threads x vector {self.vector})"
        )
        if self.kind in ("inner_persistent", "inner_outer"):
            tile += f"; {self.persistent_batch} chunk(s) in registers"
            if self.tail:
                tile += f" + a tail of {self.tail} ({self.tail_vector} a thread)"
        if self.unroll > 1:
            tile += f"; {self.unroll} chunks an iteration"
        lines.append(tile)
        if self.kind == "inner_outer":
            steps = -(-self.rows // (self.grid[0] * self.rows_per_block))
            lines.append(
                f"  row loop: {self.grid[0]} blocks walk the rows {self.rows_per_block} at a "
                f"time, grid-stride, up to {steps} step(s) each"
                + (
                    f"; loads {self.row_stages - 1} step(s) ahead through shared memory"
                    if self.row_stages > 1
                    else ""
                )
            )
        elif self.programs:
            lines.append(f"  row loop: {self.programs} resident programs prefetch their next row")
        if self.kind == "pointwise":
            lines.append(
                f"  {self.vectors_per_thread} vector(s) a thread"
                + (f"; {self.idle_threads} threads idle" if self.idle_threads else "")
            )
        if self.row_steps:
            lines.append(
                f"  row loop: {self.row_steps} step(s) of {self.row_step} rows a block "
                f"({self.rows_in_flight} in flight a thread)"
                + (
                    f", loads {self.row_stages - 1} step(s) ahead through shared memory"
                    if self.row_stages > 1
                    else ""
                )
            )
        if self.walk_width:
            rest = self.cols - self.walk_end
            if self.walk_align:
                lines.append(
                    f"  row walk: from the row start rounded down to {self.walk_align} "
                    f"elements (shift = row * {self.walk_stride} % {self.walk_align}): a "
                    f"masked head of {self.walk_width}, {self.walk_width} columns an "
                    f"iteration up to {self.walk_end}, then a tail of {rest} + shift; "
                    f"whole vectors for {', '.join(self.walk_args)}"
                )
            else:
                lines.append(
                    f"  row walk: {self.walk_width} columns an iteration up to {self.walk_end}"
                    + (f", then a tail of {rest}" if rest else "")
                )
            if self.walk_evict:
                lines.append(
                    "  L2 hints: the reduction passes' loads kept (evict_last), the output "
                    "pass's let go (evict_first)"
                )
            if self.walk_stages > 1:
                lines.append(
                    f"  row walk loads {self.walk_stages - 1} iteration(s) ahead through "
                    "shared memory"
                )
        guards = [
            g
            for g, on in (
                ("last row block", self.row_guard),
                ("chunks past the row end", self.col_guard),
            )
            if on
        ]
        lines.append("  predicates: " + (", ".join(guards) if guards else "none (exact split)"))
        narrow = sorted({f"{n} x{p}" for n, w, p in self.packs if w == self.vector and p < w})
        if narrow:
            lines.append("  narrower accesses: " + ", ".join(narrow))
        names = {v.id: v.name for n in self.spec.nodes for v in n.outputs} if self.spec else {}
        for p in self.passes:
            reds = ", ".join(n.out.name for n in p.reductions) or "the outputs"
            if p.columns:
                reds += "; accumulates column partials of " + ", ".join(
                    n.out.name for n in p.columns
                )
            keep = ", ".join(sorted(names.get(v, str(v)) for v in self.kept_by(p.index)))
            lines.append(
                f"  pass {p.index}: {len(p.nodes)} ops -> {reds}"
                + (f"; keeps {keep} in registers" if keep else "")
            )
        if self.looped is not None:
            lines.append(
                f"  passes over the row: {self.looped.count}"
                + (
                    f" ({len(self.looped.pairs)} online max-and-sum pair(s))"
                    if self.looped.pairs
                    else ""
                )
            )
        for p in self.picks:
            lines.append(f"  pick: {p.text()}")
        wide = [name for name, bits in self.gather_bits if bits == 64]
        if wide:
            lines.append(f"  64-bit gathered row offsets: {', '.join(wide)}")
        for ws in self.workspaces:
            lines.append(f"  workspace {ws.name}: {self.split_rows} x {self.cols} {ws.dtype.value}")
        if self.column_rows_shared:
            lines.append(
                f"  a block folds its {self.rows_per_block} thread rows of partials through "
                f"{self.column_rows_shared} B of shared memory"
            )
        if self.finalize:
            lines.append(
                f"  finalize launch: grid {self.finalize_grid}, {self.finalize_threads} threads: "
                f"{self.finalize_cols} columns a block, {self.finalize_rows} "
                f"thread rows over the {self.split_rows} partials, combined in a fixed order"
                + (", its last column block predicated" if self.finalize_col_guard else "")
                + (
                    f"; then {len(self.epilogue)} column op(s) to the outputs"
                    if self.epilogue
                    else ""
                )
            )
        return "\n".join(lines)
