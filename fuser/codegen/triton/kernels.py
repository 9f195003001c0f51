"""Kernel bodies per schedule kind: pointwise, inner persistent, outer; the Emitter the
others share (looped.py, inner_outer.py)."""

from __future__ import annotations

from fuser.codegen.triton.render import (
    Chunk,
    TritonKernelWriter,
    _acc_dtype,
    _identity,
)
from fuser.ir.dtypes import DType, accumulator
from fuser.ir.graph import Node
from fuser.ir.ops import REDUCE, Op
from fuser.plan.kernel_plan import RowChunk
from fuser.segmenter import Kind


class Emitter:
    """Emits nodes for one chunk context, loading inputs on first use."""

    def __init__(self, kw: TritonKernelWriter):
        self.kw = kw
        self.loaded: set[tuple[int, int | None]] = set()
        self.done: set[tuple[int, int | None]] = set()

    def key(self, vid: int, chunk: Chunk | None) -> tuple[int, int | None]:
        kind = self.kw.spec.kinds.get(vid)
        per_chunk = kind in (Kind.FULL, Kind.COL) and chunk is not None
        return (vid, chunk.index if per_chunk else None)

    def ensure_inputs(self, node: Node, chunk: Chunk | None) -> None:
        if node.op == Op.VIEW:  # reads its input itself, at other columns
            return
        for v in node.inputs:
            arg = self.kw.args.get(v.id)
            if arg is not None and not arg.is_output:
                k = self.key(v.id, chunk)
                if k not in self.loaded:
                    self.loaded.add(k)
                    self.kw.load(arg, chunk if arg.kind in (Kind.FULL, Kind.COL) else None)

    def node(self, node: Node, chunk: Chunk | None) -> None:
        k = self.key(node.out.id, chunk)
        if k in self.done:
            return
        self.done.add(k)
        self.ensure_inputs(node, chunk)
        self.kw.compute(node, chunk)
        self.maybe_store(node, chunk)

    def maybe_store(self, node: Node, chunk: Chunk | None) -> None:
        for v in node.outputs:
            arg = self.kw.args.get(v.id)
            if arg is not None and arg.is_output:
                self.kw.store(arg, chunk if arg.kind in (Kind.FULL, Kind.COL) else None)


def _chunk_of(index: int, c: RowChunk) -> Chunk:
    return Chunk(index, "" if c.offset == 0 else f"{c.offset} + ", c.width, c.masked)


def inner_persistent(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    chunks = [_chunk_of(i, c) for i, c in enumerate(s.chunks())]
    em = Emitter(kw)
    w.line("@triton.jit")
    with w.block(kw.signature([])):
        w.comment(
            f"{s.rows_per_block} row(s) per program; each row is {len(chunks)} chunk(s) "
            "kept in registers"
        )
        for c in chunks:
            kw.col_setup(c)
        if not s.programs:
            kw.row_setup("tl.program_id(0)")
            _persistent_body(kw, em, chunks)
            return w.text()
        grid = s.grid[0]
        streamed = [(a, c) for a in spec.inputs if a.kind == Kind.FULL for c in chunks]
        pid = "tl.program_id(0).to(tl.int64)" if s.index_bits == 64 else "tl.program_id(0)"
        w.comment(
            f"{grid} resident programs walk the rows {grid} apart; each loads its next "
            "row while it reduces this one"
        )
        w.line(f"pid = {pid}")
        last = spec.rows - 1
        w.line(f"first_rows = tl.minimum(pid + tl.arange(0, 1)[:, None], {last})")
        kw.gather_loads("first_rows")
        for a, c in streamed:
            kw.load(a, c, rows="first_rows")
            em.loaded.add(em.key(a.value.id, c))
        with w.block(f"for step in range(0, {spec.rows}, {grid}):"):
            w.line("rows = step + pid + tl.arange(0, 1)[:, None]")
            if s.row_guard:  # the last step runs past the rows: its stores are masked
                w.line(f"row_ok = rows < {spec.rows}")
            w.comment("loads clamp to the last row instead of masking it")
            w.line(f"next_rows = tl.minimum(rows + {grid}, {last})")
            kw.gather_loads("next_rows")
            for a, c in streamed:
                kw.load(a, c, rows="next_rows", suffix="_next")
            _persistent_body(kw, em, chunks)
            for a, c in streamed:
                name = kw.name(a.value, c)
                w.line(f"{name} = {name}_next")
    return w.text()


def _persistent_body(kw: TritonKernelWriter, em: Emitter, chunks: list[Chunk]) -> None:
    spec, w = kw.spec, kw.w
    for node in spec.nodes:
        kind = spec.kinds.get(node.out.id)
        if node.op in REDUCE and node.inputs[0].id in spec.row_constant:
            _reduce_row_constant(kw, em, node, chunks[0])
        elif node.op in REDUCE:
            expr, full, rest = row_reduce_expr(kw, em, node, chunks)
            w.comment(
                f"{node.op.value} over the row: {full} full chunk(s) folded lane by "
                f"lane, {rest} tail chunk(s)"
            )
            w.line(f"{node.out.name} = {kw.to(f'({expr})', node.out.dtype)}")
            em.maybe_store(node, None)
        elif kind in (Kind.FULL, Kind.COL):
            for c in chunks:
                em.node(node, c)
        else:
            em.node(node, None)
    kw.flush_reports()  # the row's index checks, once its work is done


def row_reduce_expr(
    kw: TritonKernelWriter, em: Emitter, node: Node, chunks: list[Chunk]
) -> tuple[str, int, int]:
    """(the expression of a row reduction over the chunks in registers, how many full
    chunks, how many tail ones). Full chunks fold lane by lane first: one cross-thread
    reduction, not one per chunk (each is a shuffle tree and, across warps, a barrier)."""
    for c in chunks:
        em.ensure_inputs(node, c)
    full = [c for c in chunks if not c.masked and c.width == kw.s.chunk]
    rest = [c for c in chunks if c not in full]
    terms = [kw.reduce_term(node, c) for c in rest]
    if full:
        lanes = kw.reduce_operand(node, full[0], None)
        for c in full[1:]:
            lanes = kw.combine(node.op, lanes, kw.reduce_operand(node, c, None))
        terms.insert(0, kw.reduce(node, lanes, axis=1))
    expr = terms[0]
    for t in terms[1:]:
        expr = kw.combine(node.op, expr, t)
    return expr, len(full), len(rest)


def _reduce_row_constant(kw: TritonKernelWriter, em: Emitter, node: Node, chunk: Chunk) -> None:
    """A reduction of a value that is the same across the row (a per-row value broadcast
    over it): n * x for a sum, x itself for a max or min. Not a tl.sum of the broadcast:
    Triton gives a [R, 1] value broadcast to [R, C] a layout in which every thread holds
    the whole row, and sums it serially. 20480 copies of 746.5 came to 15287396, not
    15288320, and a layer_norm of that row had rstd 22 instead of 316 (soak seed 14)."""
    spec, s, w = kw.spec, kw.s, kw.w
    em.ensure_inputs(node, chunk)
    x = node.inputs[0]
    wide = kw.to(kw.name(x, chunk), accumulator(x.dtype), x.dtype)
    value = f"({wide}) * {spec.cols}" if node.op == Op.SUM else wide
    w.comment(f"{node.op.value} over the row of a value the same in every column")
    zeros = f"tl.zeros(({s.rows_per_block}, 1), {_acc_dtype(x.dtype)})"
    w.line(f"{node.out.name} = {kw.to(f'({zeros} + {value})', node.out.dtype)}")
    em.maybe_store(node, None)


def pointwise(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    chunk = Chunk(None, f"tl.program_id(1) * {s.chunk} + ", s.chunk, s.col_guard)
    em = Emitter(kw)
    w.line("@triton.jit")
    with w.block(kw.signature([])):
        w.comment(f"a {s.rows_per_block} x {s.chunk} tile per program")
        kw.row_setup("tl.program_id(0)")
        kw.col_setup(chunk)
        for node in spec.nodes:
            em.node(node, chunk)
        kw.flush_reports()
    return w.text()


def outer_reduction(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    # a step is one [rows_per_block, chunk] tile: the plan's row_step wherever the loop
    # takes more than one step (IGNORED_BY), its row_steps trips (row_stages deep),
    # row_guard the row mask of a last step past the rows
    split = s.split_rows
    ws = [buf.name for buf in s.workspaces]
    extra = [f"{name}_ptr" for name in ws]
    chunk = Chunk(None, f"tl.program_id(0) * {s.chunk} + ", s.chunk, s.col_guard)
    em = Emitter(kw)
    reds = list(spec.reductions)
    w.line("@triton.jit")
    with w.block(kw.signature(extra)):
        w.comment(f"column tile {s.chunk}; rows {s.rows_per_block} at a time, split {split} ways")
        kw.col_setup(chunk)
        for n in spec.nodes:  # what every row uses: column and scalar values
            if (
                spec.kinds.get(n.out.id) in (Kind.COL, Kind.SCALAR)
                and spec.depth[n.out.id] == 0
                and n.op not in REDUCE
            ):
                em.node(n, chunk)
        for n in reds:
            w.line(
                f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {s.chunk}), "
                f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
            )
        # row_stages: the loads of the next steps issued ahead, staged in shared memory
        steps = (
            f"tl.range({s.row_steps}, num_stages={s.row_stages})"
            if s.row_stages > 1
            else f"range({s.row_steps})"
        )
        with w.block(f"for i in {steps}:"):
            _outer_step(kw, em, chunk)
        for n in reds:
            w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=0)}")
        if split > 1:
            for n, name in zip(reds, ws):
                m = ", mask=col_ok" if chunk.masked else ""
                w.line(
                    f"tl.store({name}_ptr + tl.program_id(1) * {spec.cols} + cols, {n.out.name}{m})"
                )
        else:
            _epilogue(kw, em, reds, chunk)
    if split > 1:
        w.line()
        w.line("@triton.jit")
        with w.block(
            kw.signature(extra).replace(f"def {spec.name}(", f"def {spec.name}_finalize(")
        ):
            fcols, fy = s.finalize_cols, s.finalize_rows
            w.comment(
                f"add the {split} partial sums of each column in a fixed order: "
                f"{fcols} columns a program, {fy} partials a step"
            )
            chunk = Chunk(None, f"tl.program_id(0) * {fcols} + ", fcols, s.finalize_col_guard)
            kw.col_setup(chunk)
            w.line(f"parts = tl.arange(0, {fy})[:, None]")
            fin = Emitter(kw)
            for n in reds:
                w.line(
                    f"acc_{n.out.name} = tl.full(({fy}, {fcols}), "
                    f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
                )
            with w.block(f"for p in range(0, {split}, {fy}):"):
                # parenthesized: in Python `&` binds tighter than `<`
                part_ok = f"(p + parts) < {split}"
                w.line(
                    f"part_ok = ({part_ok}) & col_ok" if chunk.masked else f"part_ok = {part_ok}"
                )
                for n, name in zip(reds, ws):
                    part = (
                        f"tl.load({name}_ptr + (p + parts) * {spec.cols} + cols, "
                        f"mask=part_ok, other={_identity(n.op, n.inputs[0].dtype)})"
                    )
                    acc = f"acc_{n.out.name}"
                    w.line(f"{acc} = {kw.combine(n.op, acc, part)}")
            for n in reds:
                w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=0)}")
            _epilogue(kw, fin, reds, chunk)
    return w.text()


def _outer_step(kw: TritonKernelWriter, em: Emitter, chunk: Chunk) -> None:
    """Step i of the row loop: its [rows_per_block, chunk] tile loaded, computed, stored
    and added to the accumulators. A last step past the rows (row_guard) is masked row by
    row: a branch around the step instead would keep Triton from pipelining the loop's
    loads (row_stages), which is worth more (benchmarks/outer_variants.py: 1.33x against
    1.11x for the branch at 16384 x 3072)."""
    s, w = kw.s, kw.w
    idx = f"tl.arange(0, {s.rows_per_block})[:, None]"
    pid = "tl.program_id(1).to(tl.int64)" if s.index_bits == 64 else "tl.program_id(1)"
    w.line(f"rows = ({pid} + i * {s.split_rows}) * {s.rows_per_block} + {idx}")
    if kw.row_mask:
        w.line("row_ok = rows < n_rows")
    _outer_body(kw, em, chunk)


def _outer_body(kw: TritonKernelWriter, em: Emitter, chunk: Chunk) -> None:
    spec, w = kw.spec, kw.w
    inner = Emitter(kw)
    inner.done |= em.done
    inner.loaded |= em.loaded
    for n in spec.nodes:
        if n.op in REDUCE:
            inner.ensure_inputs(n, chunk)
            # acc keeps the rows apart; they are folded once after the loop
            x = kw.reduce_operand(n, chunk, kw.mask(Kind.FULL, chunk))
            acc = f"acc_{n.out.name}"
            w.line(f"{acc} = {kw.combine(n.op, acc, x)}")
        elif spec.kinds.get(n.out.id) in (Kind.FULL, Kind.ROW):
            inner.node(n, chunk)
    kw.flush_reports()  # these rows' index checks


def _epilogue(kw: TritonKernelWriter, em: Emitter, reds: list[Node], chunk: Chunk) -> None:
    spec = kw.spec
    after = [n for n in spec.nodes if n.op not in REDUCE and spec.kinds.get(n.out.id) == Kind.COL]
    used = {v.id for n in after for v in n.inputs}
    for n in reds:
        if chunk.masked and n.out.id in used and n.out.dtype != DType.bool:
            # the columns past the last hold the identity (a sum's 0, a max's -inf): the
            # column ops after it see 1 there, as from a masked load (log(0) was -inf and
            # a numpy warning in the interpreter; those lanes are never stored). Before the
            # cast, on the accumulator: the interpreter has no bf16 scalar constant
            one = "1.0" if n.out.dtype.is_float else "1"
            kw.w.line(f"{n.out.name} = tl.where(col_ok{chunk.suffix()}, {n.out.name}, {one})")
        kw.w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
        em.done.add(em.key(n.out.id, chunk))
        em.maybe_store(n, chunk)
    for n in spec.nodes:  # a finalize kernel computes the scalar values again
        if n.op not in REDUCE and spec.kinds.get(n.out.id) in (Kind.COL, Kind.SCALAR):
            em.node(n, chunk)
    kw.flush_reports()


RENDERERS = {
    "pointwise": pointwise,
    "inner_persistent": inner_persistent,
    "outer_reduction": outer_reduction,
}
