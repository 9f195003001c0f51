"""Triton inner-outer kernels: a grid-stride row loop whose rows stay in registers (as in
an inner persistent kernel) and whose column reductions accumulate per-column partials;
a finalize kernel adds the blocks' partial rows in a fixed order and writes the column
outputs."""

from __future__ import annotations

from fuser.codegen.triton.kernels import Emitter, _chunk_of, _reduce_row_constant, row_reduce_expr
from fuser.codegen.triton.render import Chunk, TritonKernelWriter, _acc_dtype, _identity
from fuser.ir.ops import REDUCE
from fuser.segmenter import Kind

# Load the column parameters (the weights) once, before the row loop, instead of every
# step. Off: an experiment's switch (benchmarks/inner_outer_variants.py sets it), not a
# plan decision yet. In a pipelined loop (row_stages) Triton stages the parameters' loads
# like the rows' (their share of each buffer, sm_90: 3 KB of 10.8 at 768 fp32 columns),
# but hoisted they stay in registers: the GPT-2 residual form at 1600 columns took 162
# registers at 3 stages against 128 (a block fewer a SM than its grid needs).
HOIST_COLUMNS = False


def inner_outer(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    chunks = [_chunk_of(i, c) for i, c in enumerate(s.chunks())]
    blocks, rpb = s.grid[0], s.rows_per_block
    row_blocks = -(-spec.rows // rpb)
    columns = [n for p in s.passes for n in p.columns]
    col_ids = {id(n) for n in columns}
    epilogue = {id(n) for n in s.epilogue}
    ws = [buf.name for buf in s.workspaces]
    extra = [f"{name}_ptr" for name in ws]
    w.line("@triton.jit")
    with w.block(kw.signature(extra)):
        w.comment(
            f"{blocks} programs walk the rows {rpb} at a time ({blocks} apart); each row is "
            f"{len(chunks)} chunk(s) kept in registers; the column reductions "
            f"({', '.join(n.out.name for n in columns)}) accumulate per-column partials"
        )
        _col_setup(kw, chunks, rpb)
        for n in columns:
            for c in chunks:
                w.line(
                    f"cacc_{n.out.name}{c.suffix()} = tl.full(({rpb}, {c.width}), "
                    f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
                )
        pid = "tl.program_id(0).to(tl.int64)" if s.index_bits == 64 else "tl.program_id(0)"
        em = Emitter(kw)
        if HOIST_COLUMNS:
            _hoist_columns(kw, em, chunks, epilogue)
        trips = f"0, {row_blocks}, {blocks}"
        if s.row_stages > 1:
            # the loads of the next steps issued ahead, staged in shared memory (else each
            # step's loads wait for the step before: its row reductions, then the column
            # accumulators)
            w.comment(f"the next {s.row_stages - 1} step(s)' loads in flight through shared memory")
            trips = f"tl.range({trips}, num_stages={s.row_stages})"
        else:
            trips = f"range({trips})"
        with w.block(f"for step in {trips}:"):
            w.line(f"rows = (step + {pid}) * {rpb} + tl.arange(0, {rpb})[:, None]")
            if kw.row_mask:
                w.line("row_ok = rows < n_rows")
            for node in spec.nodes:
                kind = spec.kinds.get(node.out.id)
                if id(node) in epilogue:
                    continue
                if id(node) in col_ids:
                    _accumulate(kw, em, node, chunks)
                elif node.op in REDUCE and node.inputs[0].id in spec.row_constant:
                    _reduce_row_constant(kw, em, node, chunks[0])
                elif node.op in REDUCE:
                    _row_reduce(kw, em, node, chunks)
                elif kind in (Kind.FULL, Kind.COL):
                    for c in chunks:
                        em.node(node, c)
                else:
                    em.node(node, None)
            kw.flush_reports()
        w.comment(f"this program's partial row of each column reduction ({rpb} row(s) folded)")
        for n, name in zip(columns, ws):
            for c in chunks:
                part = kw.reduce(n, f"cacc_{n.out.name}{c.suffix()}", axis=0)
                cols = f"cols{c.suffix()}" if rpb == 1 else f"pcols{c.suffix()}"
                m = f", mask={cols} < {spec.cols}" if c.masked else ""
                w.line(f"tl.store({name}_ptr + tl.program_id(0) * {spec.cols} + {cols}, {part}{m})")
    w.line()
    _finalize(kw, extra)
    return w.text()


def _col_setup(kw: TritonKernelWriter, chunks: list[Chunk], rpb: int) -> None:
    """Each chunk's column offsets (and tail mask). With several rows a step they are
    [rows_per_block, width] tiles, so every load of the step (the FULL rows and the COL
    parameters alike) is a tile of one shape and Triton gives them one register layout.
    A [1, width] parameter load got a layout of its own (fewer elements a thread), and
    the step's rows were converted between the two through shared memory: 6 tile
    conversions a step at H=1600 (rpb 2), 15 at H=768 (rpb 4), none left with the tiles."""
    if rpb == 1:
        for c in chunks:
            kw.col_setup(c)
        return
    kw.w.comment(
        f"column offsets as ({rpb}, width) tiles: one register layout for every load of a "
        "step (pcols: the [1, width] columns of the partial rows)"
    )
    for c in chunks:
        sfx = c.suffix()
        kw.w.line(f"pcols{sfx} = {c.offset}tl.arange(0, {c.width})[None, :]")
        kw.w.line(f"cols{sfx} = tl.broadcast_to(pcols{sfx}, ({rpb}, {c.width}))")
        if c.masked:
            kw.w.line(f"col_ok{sfx} = cols{sfx} < {kw.spec.cols}")


def _hoist_columns(
    kw: TritonKernelWriter, em: Emitter, chunks: list[Chunk], epilogue: set[int]
) -> None:
    """The column inputs the row loop reads (the weights), loaded before it (HOIST_COLUMNS)."""
    spec = kw.spec
    read = {v.id for n in spec.nodes if id(n) not in epilogue for v in n.inputs}
    params = [
        a
        for a in spec.inputs
        if a.kind == Kind.COL and a.value.id in read and a.value.id not in spec.gathers
    ]
    if params:
        kw.w.comment("the column parameters, the same for every row: loaded once")
    for a in params:
        for c in chunks:
            kw.load(a, c)
            em.loaded.add(em.key(a.value.id, c))


def _accumulate(kw: TritonKernelWriter, em: Emitter, node, chunks: list[Chunk]) -> None:
    """A column reduction: this step's rows added into the per-column partials (masked
    rows and columns add the identity)."""
    kw.w.comment(f"{node.op.value} over the rows -> {node.out.name}: per-column partials")
    for c in chunks:
        em.ensure_inputs(node, c)
        mask = kw.mask(Kind.FULL, c)
        acc = f"cacc_{node.out.name}{c.suffix()}"
        kw.w.line(f"{acc} = {kw.combine(node.op, acc, kw.reduce_operand(node, c, mask))}")


def _row_reduce(kw: TritonKernelWriter, em: Emitter, node, chunks: list[Chunk]) -> None:
    """A row reduction over the chunks in registers (as the inner persistent kernel's)."""
    w = kw.w
    expr, _, _ = row_reduce_expr(kw, em, node, chunks)
    w.comment(f"{node.op.value} over the row -> {node.out.name}")
    w.line(f"{node.out.name} = {kw.to(f'({expr})', node.out.dtype)}")
    em.maybe_store(node, None)


def _finalize(kw: TritonKernelWriter, extra: list[str]) -> None:
    """Add the programs' partial rows, finalize_rows at a time, in a fixed order; then the
    column epilogue and the stores."""
    spec, s, w = kw.spec, kw.s, kw.w
    columns = [n for p in s.passes for n in p.columns]
    parts, fr, fc = s.split_rows, s.finalize_rows, s.finalize_cols
    chunk = Chunk(None, f"tl.program_id(0) * {fc} + ", fc, s.finalize_col_guard)
    w.line("@triton.jit")
    with w.block(kw.signature(extra).replace(f"def {spec.name}(", f"def {spec.name}_finalize(")):
        w.comment(f"add the {parts} partial rows of each column, {fr} at a time, in a fixed order")
        kw.col_setup(chunk)
        w.line(f"parts = tl.arange(0, {fr})[:, None]")
        for n in columns:
            x = n.inputs[0]
            w.line(
                f"acc_{n.out.name} = tl.full(({fr}, {fc}), {_identity(n.op, x.dtype)}, "
                f"{_acc_dtype(x.dtype)})"
            )
        with w.block(f"for p in range(0, {parts}, {fr}):"):
            for n, ws in zip(columns, s.workspaces):
                m = f"(p + parts < {parts})" + (" & col_ok" if chunk.masked else "")
                load = (
                    f"tl.load({ws.name}_ptr + (p + parts) * {spec.cols} + cols, mask={m}, "
                    f"other={_identity(n.op, n.inputs[0].dtype)})"
                )
                acc = f"acc_{n.out.name}"
                w.line(f"{acc} = {kw.combine(n.op, acc, load)}")
        em = Emitter(kw)
        for n in columns:
            w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=0)}")
            w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
            em.done.add(em.key(n.out.id, chunk))
            em.maybe_store(n, chunk)
        for n in s.epilogue:
            em.node(n, chunk)
        kw.flush_reports()
