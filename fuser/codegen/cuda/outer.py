"""CUDA outer (column) reduction kernels: a column tile per block walking the rows; a
split reduction writes per-block partials that a finalize kernel adds in a fixed order."""

from __future__ import annotations

from contextlib import nullcontext

from fuser.codegen.cuda.render import CudaKernelWriter, Nest, Region, slot_region
from fuser.codegen.cuda.templates import COMPUTE, REDUCE_FN, acc_type, combine, round_to
from fuser.ir.graph import Node, Value
from fuser.segmenter import Kind


def outer_reduction(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, threads, split = s.vector, s.threads_per_row, s.threads, s.split_rows
    ty_count = threads // tpr  # thread rows
    rows_per_step, in_flight = s.row_step, s.rows_in_flight
    step = rows_per_step * split
    trips = s.row_steps
    row_guard, col_guard = s.row_guard, s.col_guard
    reds = list(spec.reductions)
    ws = kw.workspaces()

    loop_targets = [n.inputs[0] for n in reds] + [
        a.value for a in spec.outputs if a.kind in (Kind.FULL, Kind.ROW)
    ]
    loop_nodes = kw.cone(loop_targets, lambda x: kw.kind(x) in (Kind.COL, Kind.SCALAR))
    col_used = {
        x.id
        for n in [*loop_nodes, *reds]
        for x in n.inputs
        if kw.kind(x) == Kind.COL and x.id not in kw.consts
    }
    col_values = [kw.value(i) for i in sorted(col_used)]

    w.line(kw.signature(spec.name, threads))
    with w.block("{", "}"):
        w.comment(
            f"column tile {s.chunk} = {tpr} threads x {v}; {ty_count} thread rows take "
            f"{rows_per_step} rows per step ({in_flight} in flight each); "
            f"{split} block(s) split the rows",
            "//",
        )
        kw.constants(
            ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, TY=ty_count, CHUNK=s.chunk, SPLIT=split
        )
        w.line("const int tx = threadIdx.x % TPR, ty = threadIdx.x / TPR;")
        w.line("const int col = blockIdx.x * CHUNK + tx * V;")
        col_ok = "col_ok" if col_guard else None
        if col_guard:
            w.line("const bool col_ok = col < COLS;")
        kw.scalar_prologue()
        if col_values:
            _column_values(kw, col_values, col_ok)
        for n in reds:
            kw.declare_acc(n, v)
        w.line()
        w.comment(f"{trips} step(s) of {step} rows; this block takes every {split}th", "//")
        w.line("#pragma unroll 1")
        with w.block(f"for (int it = 0; it < {trips}; ++it) {{", "}"):
            setup = [
                f"const {kw.idx} row = (({kw.idx})it * SPLIT + blockIdx.y) * {rows_per_step}"
                " + r * TY + ty;"
            ]
            if row_guard:
                setup.append("const bool row_ok = row < ROWS;")
            region = slot_region(
                "r", in_flight, setup, v, row_ok="row_ok" if row_guard else None, col_ok=col_ok
            )
            kw.emit_nest(
                Nest(
                    [region],
                    in_flight,
                    "r",
                    loop_nodes,
                    reductions=reds,
                    acc=lambda n: f"acc_{n.out.name}[i]",
                    reduce_guard="row",
                    row_level=True,
                    store_when={Kind.ROW: "col == 0"},
                )
            )
        w.line()
        if ty_count > 1:
            for n in reds:
                at = acc_type(n.inputs[0].dtype)
                w.line(f"__shared__ {at} part_{n.out.name}[{threads * v}];")
                w.line(
                    f"column_reduce<TPR, TY, V>(acc_{n.out.name}, {REDUCE_FN[n.op]}(), "
                    f"part_{n.out.name});"
                )
        with w.block("if (ty == 0) {", "}"):
            if split > 1:
                w.comment("this block's partial results; the finalize kernel adds them up", "//")
                with w.block(f"if ({col_ok}) {{", "}") if col_ok else nullcontext():
                    for n, (name, _) in zip(reds, ws):
                        w.line("#pragma unroll")
                        w.line(
                            f"for (int i = 0; i < V; ++i) "
                            f"{name}_ptr[blockIdx.y * COLS + col + i] = acc_{n.out.name}[i];"
                        )
            else:
                _epilogue(kw, reds, col_ok)
    if split > 1:
        w.line()
        _finalize(kw, reds, ws)
    return w.text()


def _column_values(kw: CudaKernelWriter, values: list[Value], col_ok: str | None) -> None:
    """COL values the row loop uses: computed once per thread into [V] arrays."""
    w = kw.w
    w.comment("column values every row uses: computed once, kept per thread", "//")
    for x in values:
        w.line(f"{COMPUTE[x.dtype]} {x.name}[V];")
    keep = {x.id for x in values}
    kw.col_arrays |= keep
    nodes = kw.cone(values, lambda x: kw.kind(x) == Kind.SCALAR)
    region = Region("", ["const int c = 0;"], kw.s.vector, col_ok=col_ok)
    kw.emit_nest(Nest([region], 1, "c", nodes, keep=keep))


def _epilogue(kw: CudaKernelWriter, reds: list[Node], col_ok: str | None) -> None:
    """Column results: the reductions rounded to their dtype, the column ops after them,
    the stores."""
    spec = kw.spec
    given = {}
    for n in reds:
        ct = COMPUTE[n.out.dtype]
        total = f"acc_{n.out.name}[i]"
        total = total if acc_type(n.inputs[0].dtype) == ct else f"({ct}){total}"
        given[n.out.id] = round_to(total, n.out.dtype)
    outs = [a.value for a in spec.outputs if a.kind == Kind.COL]
    nodes = kw.cone(outs, lambda x: x.id in kw.col_arrays or kw.kind(x) == Kind.SCALAR)
    region = Region("", ["const int c = 0;"], kw.s.vector, col_ok=col_ok)
    kw.emit_nest(Nest([region], 1, "c", nodes, given=given))


def _finalize(kw: CudaKernelWriter, reds: list[Node], ws: list[tuple[str, str]]) -> None:
    """The finalize launch: FTPR threads x V columns a block; FY thread rows each add every
    FY-th partial, then the thread rows are combined in a fixed order (deterministic)."""
    spec, s, w = kw.spec, kw.s, kw.w
    v, ftpr, fy = s.vector, s.finalize_tpr, s.finalize_rows
    threads = s.finalize_threads
    kw.col_arrays = set()
    kw.arrays = set()
    w.line(kw.signature(spec.name + "_finalize", threads))
    with w.block("{", "}"):
        w.comment(
            f"add the {s.split_rows} partial results of each column in a fixed order: "
            f"{ftpr} threads x {v} columns, {fy} thread rows over the partials",
            "//",
        )
        kw.constants(COLS=spec.cols, V=v, FTPR=ftpr, FY=fy, SPLIT=s.split_rows)
        w.line("const int tx = threadIdx.x % FTPR, ty = threadIdx.x / FTPR;")
        w.line("const int col = blockIdx.x * (FTPR * V) + tx * V;")
        col_ok = "col_ok" if s.finalize_col_guard else None
        if col_ok:
            w.line("const bool col_ok = col < COLS;")
        kw.scalar_prologue()
        for n in reds:
            kw.declare_acc(n, v)
        with w.block(f"if ({col_ok}) {{", "}") if col_ok else nullcontext():
            w.line(f"#pragma unroll {s.finalize_unroll}")
            with w.block("for (int p = ty; p < SPLIT; p += FY) {", "}"):
                for n, (name, _) in zip(reds, ws):
                    acc = f"acc_{n.out.name}[i]"
                    part = f"{name}_ptr[p * COLS + col + i]"
                    w.line("#pragma unroll")
                    w.line(f"for (int i = 0; i < V; ++i) {acc} = {combine(n.op, acc, part)};")
        if fy > 1:
            for n in reds:
                at = acc_type(n.inputs[0].dtype)
                w.line(f"__shared__ {at} part_{n.out.name}[{threads * v}];")
                w.line(
                    f"column_reduce<FTPR, FY, V>(acc_{n.out.name}, {REDUCE_FN[n.op]}(), "
                    f"part_{n.out.name});"
                )
        with w.block("if (ty == 0) {", "}"):
            _epilogue(kw, reds, col_ok)
