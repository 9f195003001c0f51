"""CUDA inner persistent kernels: a row (or a few short rows) per block, kept in
registers across the passes of its reductions; optionally a prefetching row loop."""

from __future__ import annotations

from fuser.codegen.cuda.render import CudaKernelWriter, Nest, chunk_regions, row_nodes
from fuser.codegen.cuda.templates import COMPUTE
from fuser.ir.graph import Node
from fuser.segmenter import Kind


def inner_persistent(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, rpb, batch = s.vector, s.threads_per_row, s.rows_per_block, s.persistent_batch
    chunk = s.chunk
    tail_v = s.tail_vector
    nchunks = batch + (1 if tail_v else 0)
    threads = tpr * rpb
    # a prefetching loop's bound keeps its rows in range (row_guard: its last step's rows
    # past the end, which Triton's loop masks); the next row's loads have a guard of their own
    row_guard = s.row_guard and not s.programs
    nests, kept = [list(p.nodes) for p in s.passes], dict(s.kept)
    w.line(kw.signature(spec.name, threads))
    with w.block("{", "}"):
        w.comment(
            f"{rpb} row(s) per block, {tpr} threads per row; a thread keeps {batch} chunk(s) "
            f"of {v} columns" + (f" and a tail of {tail_v}" if tail_v else "") + " in registers",
            "//",
        )
        names = dict(ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, RPB=rpb, CHUNK=chunk)
        names |= dict(BATCH=batch) | (dict(TAIL_V=tail_v) if tail_v else {})
        kw.constants(**names)
        w.line(
            "const int lane = threadIdx.x % TPR;" if rpb > 1 else "const int lane = threadIdx.x;"
        )
        row_ok = "row_ok" if row_guard else None
        regions = chunk_regions(batch, v, tail_v, s.col_guard, row_ok)
        kw.scalar_prologue()
        rows = _PersistentRows(kw, nests, kept, regions, nchunks)
        if not s.programs:
            first = f"({kw.idx})blockIdx.x * RPB" + (" + threadIdx.x / TPR" if rpb > 1 else "")
            w.line(f"const {kw.idx} row = {first};")
            if row_guard:
                w.line("const bool row_ok = row < ROWS;")
            rows.emit(row_ok)
        else:
            _prefetching_rows(kw, rows)
    return w.text()


def _prefetching_rows(kw: CudaKernelWriter, rows: _PersistentRows) -> None:
    """PROGRAMS resident blocks, each walking rows PROGRAMS apart (rows_per_block is 1)."""
    w = kw.w
    programs = kw.s.grid[0]
    w.comment(
        f"{programs} resident blocks walk the rows {programs} apart; each loads its next "
        "row while it reduces this one",
        "//",
    )
    w.line(f"constexpr int PROGRAMS = {programs};")
    kw.declare_loads(rows.nest(0))
    with w.block("{", "}"):
        w.line(f"const {kw.idx} row = blockIdx.x;")
        kw.emit_loads(rows.nest(0))
    w.line("#pragma unroll 1")
    with w.block(f"for ({kw.idx} row = blockIdx.x; row < ROWS; row += PROGRAMS) {{", "}"):
        rows.emit(None, prefetch=True)


class _PersistentRows:
    """The passes over one row of an inner persistent kernel."""

    def __init__(self, kw: CudaKernelWriter, nests: list, kept: dict, regions: list, n: int):
        self.kw, self.nests, self.kept, self.regions, self.nchunks = kw, nests, kept, regions, n

    def reductions(self, d: int) -> list[Node]:
        spec = self.kw.spec
        return [n for n in spec.reductions if spec.depth[n.out.id] == d + 1]

    def nest(self, d: int) -> Nest:
        keep = {vid for vid, nest in self.kept.items() if nest == d}
        return Nest(
            self.regions,
            self.nchunks,
            "c",
            self.nests[d],
            reductions=self.reductions(d),
            keep=keep,
            store_when={Kind.COL: "row == 0"},
        )

    def emit(self, row_ok: str | None, prefetch: bool = False) -> None:
        kw, w = self.kw, self.kw.w
        s = kw.s
        kw.thread_inputs((Kind.ROW,), row_ok)
        store_row = " && ".join(c for c in ("lane == 0", row_ok) if c)
        kw.thread_nodes(row_nodes(kw, 0), store_row)
        for d in range(len(self.nests)):
            nest, reds = self.nest(d), self.reductions(d)
            w.line()
            what = ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds) or "the outputs"
            w.comment(f"pass {d} over the row's registers: {what}", "//")
            for vid in sorted(nest.keep):
                val = kw.value(vid)
                w.line(
                    f"{COMPUTE[val.dtype]} {val.name}[{self.nchunks}][V];  // kept for later passes"
                )
            kw.arrays |= nest.keep
            for n in reds:
                kw.declare_acc(n)
            if prefetch and d == 0:
                kw.emit_compute(nest)
                w.comment("the next row's loads, in flight through this row's reductions", "//")
                w.line(f"const {kw.idx} next = row + PROGRAMS;")
                with w.block("{", "}"):
                    w.line(f"const {kw.idx} row = next;")
                    w.line("const bool row_ok = row < ROWS;")
                    kw.emit_loads(nest, row_ok="row_ok")
            else:
                kw.emit_nest(nest)
            for n in reds:
                kw.row_reduce(n, s.threads_per_row, s.rows_per_block)
                kw.store_value(n.out, store_row)
            kw.thread_nodes(row_nodes(kw, d + 1), store_row)
