"""CUDA pointwise kernels: a [rows_per_block, chunk] tile per block, a few vectors a
thread."""

from __future__ import annotations

from fuser.codegen.cuda.render import CudaKernelWriter, Nest, slot_region
from fuser.ir.ops import Op
from fuser.segmenter import Kind


def pointwise(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, rpb, threads = s.vector, s.threads_per_row, s.rows_per_block, s.threads
    tile = tpr * rpb  # vectors per tile
    per_thread = s.vectors_per_thread
    row_guard = s.row_guard or s.idle_threads > 0
    col_guard = s.col_guard
    w.line(kw.signature(spec.name, threads))
    with w.block("{", "}"):
        w.comment(
            f"a {rpb} x {s.chunk} tile per block: {tile} vectors of {v}, "
            f"{per_thread} per thread" + ("" if row_guard or col_guard else ", no predicates"),
            "//",
        )
        kw.constants(
            ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, RPB=rpb, CHUNK=s.chunk, THREADS=threads
        )
        kw.scalar_prologue()
        # vector k = threadIdx.x + j * THREADS of the tile sits in row k / TPR, lane k % TPR;
        # both powers of two, so each is fixed per thread or a constant step per slot j
        first_row = f"({kw.idx})blockIdx.x * RPB"
        if threads >= tpr:
            w.line("const int lane = threadIdx.x % TPR;")
            w.line("const int col = blockIdx.y * CHUNK + lane * V;")
            if col_guard:
                w.line("const bool col_ok = col < COLS;")
            setup = [f"const {kw.idx} row = {first_row} + threadIdx.x / TPR + j * (THREADS / TPR);"]
        else:
            setup = [
                f"const {kw.idx} row = {first_row} + j * THREADS / TPR;",
                "const int col = blockIdx.y * CHUNK + (threadIdx.x + j * THREADS % TPR) * V;",
            ]
            if col_guard:
                setup.append("const bool col_ok = col < COLS;")
        if row_guard:
            ok = (f"threadIdx.x < {tile} && " if s.idle_threads else "") + "row < ROWS"
            setup.append(f"const bool row_ok = {ok};")
        region = slot_region(
            "j",
            per_thread,
            setup,
            v,
            row_ok="row_ok" if row_guard else None,
            col_ok="col_ok" if col_guard else None,
        )
        nodes = [n for n in spec.nodes if kw.kind(n.out) != Kind.SCALAR and n.op != Op.CONST]
        kw.emit_nest(
            Nest(
                [region],
                per_thread,
                "j",
                nodes,
                row_level=True,
                store_when={Kind.ROW: "col == 0", Kind.COL: "row == 0"},
            )
        )
    return w.text()
