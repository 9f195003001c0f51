"""The backend-neutral Schedule: one frozen dataclass per kernel, with its reasons."""

from __future__ import annotations

from dataclasses import dataclass, field

from fuser.errors import ScheduleError
from fuser.explanation import Explanation

# the most blocks a launch may have along x, y, z (CUDA's maxGridSize: a pointwise kernel
# puts a row's column tiles on y, so a row of over 65535 tiles cannot launch)
GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class Estimate:
    """What the scheduler expects the kernel to cost."""

    registers: int  # per thread, including overhead
    buffer_registers: int  # of which persistent buffers
    blocks_per_sm: int
    warps_per_sm: int
    waves: float
    bytes_moved: int
    lane_efficiency: float  # useful elements / elements the tiles cover

    def line(self) -> str:
        return (
            f"~{self.registers} regs/thread ({self.buffer_registers} in buffers), "
            f"{self.blocks_per_sm} blocks = {self.warps_per_sm} warps/SM, {self.waves:.2f} waves, "
            f"{self.bytes_moved / 1e6:.2f} MB moved, lanes {self.lane_efficiency:.0%} useful"
        )


@dataclass(frozen=True)
class Schedule:
    """How one kernel covers its [rows, cols] domain.

    Tile = rows_per_block x chunk, chunk = threads_per_row * vector. An inner persistent
    kernel keeps `persistent_batch` chunks (plus a `tail` chunk) of each row in registers;
    a looped kernel walks the row `unroll` chunks at a time; an outer reduction splits the
    rows over `split_rows` blocks per column tile and sums their partials in a second pass
    (the finalize launch), `finalize_cols` columns a block.
    An inner-outer kernel (row and column reductions: LayerNorm backward) is persistent on
    `programs` blocks that walk the rows `rows_per_block` at a time, keep each row in
    registers as inner_persistent does, and accumulate per-column partials of the column
    reductions; each block writes one partial row (`split_rows` = its blocks) and a
    finalize launch adds them in a fixed order.
    """

    kind: str  # pointwise | inner_persistent | inner_looped | outer_reduction | inner_outer
    rows: int
    cols: int
    vector: int
    threads_per_row: int
    rows_per_block: int
    persistent_batch: int = 1
    tail: int = 0
    unroll: int = 1
    num_warps: int = 4
    split_rows: int = 1
    # outer_reduction with split_rows > 1: columns per block of the finalize launch
    finalize_cols: int = 0
    index_bits: int = 32
    # inner_persistent: 0 = one program per row block; N = N resident programs, each
    # walking row blocks N apart and loading the next row while it reduces this one.
    # inner_outer: the blocks of the grid-stride row loop (no prefetch)
    programs: int = 0
    # inner_looped: walk each row from its start rounded down to `vector` elements (rows of
    # an odd width start unaligned; the walk keeps whole vectors: fuser/plan/build.py)
    align_walk: bool = False
    estimate: Estimate | None = None
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def chunk(self) -> int:
        return self.threads_per_row * self.vector

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @property
    def grid(self) -> tuple[int, ...]:
        if self.kind == "pointwise":
            return (-(-self.rows // self.rows_per_block), -(-self.cols // self.chunk))
        if self.kind == "outer_reduction":
            return (-(-self.cols // self.chunk), self.split_rows)
        blocks = -(-self.rows // self.rows_per_block)
        return (min(self.programs, blocks) if self.programs else blocks,)

    @property
    def even_rows(self) -> bool:
        return self.rows % self.rows_per_block == 0

    def chunks(self) -> list[tuple[int, int]]:
        """(offset, size) of every chunk of a row; the last may be a smaller tail."""
        out = [(i * self.chunk, self.chunk) for i in range(self.persistent_batch)]
        if self.tail:
            out.append((self.persistent_batch * self.chunk, self.tail))
        return out

    def short(self) -> str:
        s = f"{self.kind} v{self.vector} tpr{self.threads_per_row} rpb{self.rows_per_block}"
        if self.kind in ("inner_persistent", "inner_outer"):
            s += f" batch{self.persistent_batch}" + (f"+tail{self.tail}" if self.tail else "")
        if self.programs:
            s += f" {'blocks' if self.kind == 'inner_outer' else 'prefetch'}{self.programs}"
        if self.unroll > 1:
            s += f" unroll{self.unroll}"
        if self.align_walk:
            s += " aligned-walk"
        if self.split_rows > 1 and self.kind != "inner_outer":
            s += f" split{self.split_rows}"
            if self.finalize_cols:
                s += f" fin{self.finalize_cols}"
        s += f" warps{self.num_warps}"
        return s + (" i64" if self.index_bits == 64 else "")

    def validate(self) -> Schedule:
        """Legality checks in one place; messages say what does not fit."""
        for name in ("vector", "threads_per_row", "rows_per_block"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ScheduleError(f"{name} {v} is not a power of two")
        if self.tail and self.tail & (self.tail - 1):
            raise ScheduleError(f"tail chunk {self.tail} is not a power of two")
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ScheduleError(f"num_warps {self.num_warps} is not 1, 2, 4, 8, 16 or 32")
        if self.kind in ("inner_persistent", "inner_outer"):
            covered = self.persistent_batch * self.chunk + self.tail
            if covered < self.cols:
                raise ScheduleError(
                    f"{self.persistent_batch} chunks of {self.chunk} + tail {self.tail} cover "
                    f"{covered} of {self.cols} columns"
                )
        if self.kind == "outer_reduction" and self.split_rows > 1:
            f = self.finalize_cols
            if f < self.vector or f % self.vector or (f // self.vector) & (f // self.vector - 1):
                raise ScheduleError(
                    f"finalize_cols {f} is not a power of two times the vector {self.vector}"
                )
        if any(g > limit for g, limit in zip(self.grid, GRID_LIMITS)):
            raise ScheduleError(
                f"grid {self.grid} exceeds CUDA's {GRID_LIMITS[: len(self.grid)]} blocks a "
                f"dimension ({self.rows} rows x {self.cols} columns, {self.chunk} a block)"
            )
        if self.align_walk and self.kind != "inner_looped":
            raise ScheduleError("an aligned-start walk is a looped kernel's")
        if self.kind == "inner_outer":
            if not self.programs or self.split_rows != self.grid[0]:
                raise ScheduleError(
                    f"inner_outer: {self.split_rows} partial rows for a grid of {self.grid}"
                )
        elif self.programs and (self.kind != "inner_persistent" or self.rows_per_block != 1):
            raise ScheduleError("a prefetching row loop needs inner_persistent, one row a block")
        return self

    def explain(self) -> Explanation:
        lines = [f"schedule: {self.short()}  grid {self.grid}"]
        if self.estimate:
            lines.append(f"estimate: {self.estimate.line()}")
        lines += [f"  - {r}" for r in self.reasons]
        return Explanation("\n".join(lines))
