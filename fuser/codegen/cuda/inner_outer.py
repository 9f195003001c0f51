"""CUDA inner-outer kernels: BLOCKS blocks walk the rows (grid-stride, RPB rows a step);
each row stays in registers through its row reductions as in an inner persistent kernel,
and the column reductions accumulate per-column partials in registers (`cacc_*[c][i]`)
across the block's rows. The thread rows of a block fold their partials (a fixed-order
tree through shared memory) and the block writes one partial row per workspace; the
finalize kernel adds the partial rows of each column in a fixed order and writes the
column outputs."""

from __future__ import annotations

from fuser.codegen.cuda.render import (
    CudaKernelWriter,
    Nest,
    Region,
    chunk_regions,
    identity_of,
    row_nodes,
)
from fuser.codegen.cuda.templates import COMPUTE, REDUCE_FN, acc_type, combine, round_to
from fuser.ir.graph import Node
from fuser.segmenter import Kind


def inner_outer(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, rpb, batch, tail_v = (
        s.vector,
        s.threads_per_row,
        s.rows_per_block,
        s.persistent_batch,
        s.tail_vector,
    )
    nchunks = batch + (1 if tail_v else 0)
    blocks = s.grid[0]
    columns = [n for p in s.passes for n in p.columns]
    ws = kw.workspaces()
    w.line(kw.signature(spec.name, s.threads))
    with w.block("{", "}"):
        w.comment(
            f"{blocks} blocks walk the rows {rpb} at a time, {blocks * rpb} apart; a row is "
            f"{tpr} threads keeping {batch} chunk(s) of {v} columns"
            + (f" and a tail of {tail_v}" if tail_v else "")
            + " in registers; the column reductions "
            + f"({', '.join(n.out.name for n in columns)}) accumulate per-column partials",
            "//",
        )
        names = dict(ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, RPB=rpb, CHUNK=s.chunk)
        names |= dict(BATCH=batch, NCHUNKS=nchunks, BLOCKS=blocks)
        kw.constants(**names | (dict(TAIL_V=tail_v) if tail_v else {}))
        w.line(
            "const int lane = threadIdx.x % TPR;" if rpb > 1 else "const int lane = threadIdx.x;"
        )
        row_ok = "row_ok" if s.row_guard else None
        regions = chunk_regions(batch, v, tail_v, s.col_guard, row_ok)
        kw.scalar_prologue()
        w.comment("per-column partials of the column reductions, over this block's rows", "//")
        for n in columns:
            at = acc_type(n.inputs[0].dtype)
            w.line(f"{at} cacc_{n.out.name}[NCHUNKS][V];")
            w.line("#pragma unroll")
            with w.block("for (int c = 0; c < NCHUNKS; ++c) {", "}"):
                w.line("#pragma unroll")
                w.line(f"for (int i = 0; i < V; ++i) cacc_{n.out.name}[c][i] = {identity_of(n)};")
        w.line("#pragma unroll 1")
        first = f"({kw.idx})blockIdx.x * RPB"
        with w.block(f"for ({kw.idx} base = {first}; base < ROWS; base += BLOCKS * RPB) {{", "}"):
            w.line(f"const {kw.idx} row = base" + (" + threadIdx.x / TPR;" if rpb > 1 else ";"))
            if row_ok:
                w.line("const bool row_ok = row < ROWS;")
            _rows(kw, regions, nchunks, row_ok)
            if tpr > 32:
                w.comment("the row reductions' shared scratch is written again next row", "//")
                w.line("__syncthreads();")
        w.line()
        _partials(kw, columns, ws, regions)
    w.line()
    _finalize(kw, columns, ws)
    return w.text()


def _rows(kw: CudaKernelWriter, regions: list[Region], nchunks: int, row_ok: str | None) -> None:
    """The passes over one row: row reductions, FULL outputs, column accumulation."""
    s, w = kw.s, kw.w
    kw.thread_inputs((Kind.ROW,), row_ok)
    store_row = " && ".join(c for c in ("lane == 0", row_ok) if c)
    kw.thread_nodes(row_nodes(kw, 0), store_row)
    kept = dict(s.kept)
    for p in s.passes:
        keep = {vid for vid, d in kept.items() if d == p.index}
        what = [f"{n.op.value} -> {n.out.name}" for n in p.reductions]
        what += [f"column {n.op.value} -> {n.out.name}" for n in p.columns]
        w.line()
        w.comment(
            f"pass {p.index} over the row's registers: {', '.join(what) or 'the outputs'}", "//"
        )
        for vid in sorted(keep):
            val = kw.value(vid)
            w.line(f"{COMPUTE[val.dtype]} {val.name}[{nchunks}][V];  // kept for later passes")
        kw.arrays |= keep
        for n in p.reductions:
            kw.declare_acc(n)
        nest = Nest(
            regions,
            nchunks,
            "c",
            list(p.nodes),
            reductions=list(p.reductions),
            keep=keep,
            store_when={Kind.COL: "row == 0"},
            columns=list(p.columns),
        )
        kw.emit_nest(nest)
        for n in p.reductions:
            kw.row_reduce(n, s.threads_per_row, s.rows_per_block)
            kw.store_value(n.out, store_row)
        kw.thread_nodes(row_nodes(kw, p.index + 1), store_row)


def _partials(
    kw: CudaKernelWriter, columns: list[Node], ws: list[tuple[str, str]], regions: list[Region]
) -> None:
    """Fold the thread rows' partials (RPB > 1) and write this block's partial rows."""
    s, w = kw.s, kw.w
    if s.rows_per_block > 1:
        w.comment("fold the block's thread rows: a fixed-order tree through shared memory", "//")
        at = acc_type(columns[0].inputs[0].dtype)
        w.line(f"__shared__ {at} fold[{s.column_rows_shared} / sizeof({at})];")
        for n in columns:
            w.line("#pragma unroll")
            w.line(
                f"for (int c = 0; c < NCHUNKS; ++c) column_reduce<TPR, RPB, V>("
                f"cacc_{n.out.name}[c], {REDUCE_FN[n.op]}(), fold);"
            )
    w.comment("this block's partial rows; the finalize kernel adds them up", "//")
    cond = "threadIdx.x < TPR" if s.rows_per_block > 1 else None
    with w.block(f"if ({cond}) {{" if cond else "{", "}"):
        for r in regions:
            with kw.region(r):
                for n, (name, _) in zip(columns, ws):
                    guard = "col + i < COLS" if s.col_guard else None
                    store = f"{name}_ptr[blockIdx.x * COLS + col + i] = cacc_{n.out.name}[c][i];"
                    w.line("#pragma unroll")
                    w.line(
                        f"for (int i = 0; i < {r.width}; ++i) "
                        + (f"if ({guard}) {store}" if guard else store)
                    )


def _finalize(kw: CudaKernelWriter, columns: list[Node], ws: list[tuple[str, str]]) -> None:
    """FC columns a block, FR thread rows each adding every FR-th partial row, then a
    fixed-order fold of the FR sums; then the column epilogue and its stores."""
    spec, s, w = kw.spec, kw.s, kw.w
    fc, fr = s.finalize_cols, s.finalize_rows
    kw.col_arrays = set()
    kw.arrays = set()
    w.line(kw.signature(spec.name + "_finalize", s.finalize_threads))
    with w.block("{", "}"):
        w.comment(
            f"add the {s.split_rows} partial rows of each column: {fr} thread rows take every "
            f"{fr}th, then their sums are folded in a fixed order",
            "//",
        )
        kw.constants(COLS=spec.cols, PARTS=s.split_rows, FC=fc, FR=fr)
        w.line("const int tx = threadIdx.x % FC, ty = threadIdx.x / FC;")
        w.line("const int col = blockIdx.x * FC + tx;")
        col_ok = "col_ok" if s.finalize_col_guard else None
        if col_ok:
            w.line("const bool col_ok = col < COLS;")
        kw.scalar_prologue()
        for n, (name, at) in zip(columns, ws):
            w.line(f"{at} acc_{n.out.name} = {identity_of(n)};")
            w.line(f"#pragma unroll {s.finalize_unroll}")
            w.line(
                "for (int p = ty; p < PARTS; p += FR) "
                + (f"if ({col_ok}) " if col_ok else "")
                + f"acc_{n.out.name} = "
                f"{combine(n.op, f'acc_{n.out.name}', f'{name}_ptr[p * COLS + col]')};"
            )
            w.line(f"__shared__ {at} fold_{n.out.name}[FR][FC];")
            w.line(f"fold_{n.out.name}[ty][tx] = acc_{n.out.name};")
        w.line("__syncthreads();")
        with w.block("if (ty == 0) {", "}"):
            given = {}
            for n in columns:
                acc = f"acc_{n.out.name}"
                w.line("#pragma unroll")
                w.line(
                    f"for (int r = 1; r < FR; ++r) {acc} = "
                    f"{combine(n.op, acc, f'fold_{n.out.name}[r][tx]')};"
                )
                ct = COMPUTE[n.out.dtype]
                total = acc if acc_type(n.inputs[0].dtype) == ct else f"({ct}){acc}"
                given[n.out.id] = round_to(total, n.out.dtype)
            region = Region("", ["const int c = 0;"], 1, col_ok=col_ok)
            kw.emit_nest(Nest([region], 1, "c", list(s.epilogue), given=given))
