"""Kernel bodies per schedule kind: pointwise, inner persistent, inner looped, outer."""

from __future__ import annotations

from contextlib import nullcontext

from fuser.codegen.triton.render import (
    Chunk,
    TritonKernelWriter,
    _acc_dtype,
    _cone,
    _identity,
)
from fuser.codegen.triton.templates import render_op
from fuser.ir.dtypes import accumulator
from fuser.ir.graph import Node
from fuser.ir.ops import REDUCE, Op
from fuser.plan.build import pow2_ceil
from fuser.plan.kernel_plan import RowChunk
from fuser.schedulers.online import OnlinePair
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


def inner_looped(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    plan = s.looped
    width, full_end, tail = s.walk_width, s.walk_end, s.walk_tail
    # the tail walk is one masked tile, the next power of two wide (a tl.arange's width;
    # IGNORED_BY says why not walk_tail_slots chunks); its names differ from the loop
    # body's: Triton wants a variable's shape to stay the same through a loop
    body = Chunk(None, "off + ", width, False)
    tail_chunk = Chunk("tail", f"{full_end} + ", pow2_ceil(tail) if tail else 0, True)
    # the aligned-start walk: a masked head iteration, then the loop from the next one
    # (its tail is up to vector - 1 columns longer: fuser/plan/build.py)
    start = width if s.walk_align else 0
    head = Chunk("head", "", width, True) if s.walk_align else None
    loop = f"for off in range({start}, {full_end}, {width}):"
    w.line("@triton.jit")
    with w.block(kw.signature([])):
        w.comment(
            f"one row per program, walked {width} columns at a time "
            f"({len(plan.passes)} reduction pass(es) + the output pass)"
        )
        kw.row_setup("tl.program_id(0)")
        scalar_em = Emitter(kw)

        def row_nodes(depth: int) -> None:
            for n in spec.nodes:
                k = spec.kinds.get(n.out.id)
                if (
                    n.op not in REDUCE
                    and k in (Kind.ROW, Kind.SCALAR)
                    and spec.depth[n.out.id] == depth
                ):
                    scalar_em.node(n, None)

        row_nodes(0)
        for rounds in plan.passes:
            if plan.pairs_in(rounds, spec):
                _online_pass(kw, scalar_em, rounds, body, full_end, tail, head, loop)
                for rnd in rounds:
                    row_nodes(rnd)
                continue
            rnd = rounds[0]
            reds = [n for n in spec.reductions if spec.depth[n.out.id] == rnd]
            cone = _cone(spec, [n.inputs[0] for n in reds], {Kind.FULL, Kind.COL}, rnd)
            w.comment(f"pass {rnd}: " + ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds))
            for n in reds:
                w.line(
                    f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {width}), "
                    f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
                )
            if full_end > start:
                with w.block(loop):
                    kw.col_setup(body)
                    em = Emitter(kw)
                    em.done |= scalar_em.done
                    for n in cone:
                        em.node(n, body)
                    for n in reds:
                        em.ensure_inputs(n, body)
                        x = kw.reduce_operand(n, body, None)
                        w.line(f"acc_{n.out.name} = {kw.combine(n.op, f'acc_{n.out.name}', x)}")
            for n in reds:
                w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=1)}")
            for edge in (head, tail_chunk if tail else None):
                if edge is None:
                    continue
                kw.col_setup(edge)
                em = Emitter(kw)
                em.done |= scalar_em.done
                for n in cone:
                    em.node(n, edge)
                for n in reds:
                    em.ensure_inputs(n, edge)
                    term = kw.reduce_term(n, edge)
                    w.line(f"{n.out.name} = {kw.combine(n.op, n.out.name, term)}")
            for n in reds:
                w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
                scalar_em.done.add((n.out.id, None))
                scalar_em.maybe_store(n, None)
            row_nodes(rnd)
        full_outs = [a.value for a in spec.outputs if a.kind in (Kind.FULL, Kind.COL)]
        if full_outs:
            cone = _cone(spec, full_outs, {Kind.FULL, Kind.COL}, spec.rounds + 1)
            w.comment("output pass")
            edges = ((head, head is not None), (body, full_end > start), (tail_chunk, tail))
            for chunk, ctx in edges:
                if not ctx:
                    continue
                header = loop if chunk is body else None
                with w.block(header) if header else nullcontext():
                    kw.col_setup(chunk)
                    em = Emitter(kw)
                    em.done |= scalar_em.done
                    for n in cone:
                        em.node(n, chunk)
        kw.flush_reports()  # the row's index checks, once its work is done
    return w.text()


def _online_pass(
    kw: TritonKernelWriter,
    scalar_em: Emitter,
    rounds: tuple[int, ...],
    body: Chunk,
    full_end: int,
    tail: int,
    head: Chunk | None = None,
    loop: str = "",
) -> None:
    """One pass over the row for rounds r and r + 1, whose sums of exp(c * (x - max))
    are computed online (fuser/schedulers/online.py): every lane keeps a running max and
    a running sum rescaled when its max grows; the lanes combine after the loop. Plain
    reductions of round r ride along. The tail is one masked tile as wide as the loop's,
    so it updates the same lane state."""
    spec, s, w = kw.spec, kw.s, kw.w
    plan = s.looped
    pairs = plan.pairs_in(rounds, spec)
    reds = plan.reductions(rounds, spec)
    maxes = list({id(p.max): p.max for p in pairs}.values())
    width = body.width
    cone = _cone(spec, [n.inputs[0] for n in reds + maxes], {Kind.FULL, Kind.COL}, rounds[0])
    w.comment(
        f"pass {'+'.join(map(str, rounds))}, online: "
        + ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds + maxes)
        + ", "
        + ", ".join(f"sum(exp(x - max)) -> {p.sum.out.name}" for p in pairs)
    )
    w.comment(
        "each lane keeps a running max and a running sum of exp(x - max), rescaled when\n"
        "its max grows: the row is read once for both rounds, not once per round\n"
        "(every exponent is <= 0, so nothing overflows that the two-pass form does not)"
    )
    for n in reds:
        w.line(
            f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {width}), "
            f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
        )
    for m in maxes:
        w.line(
            f"m_{m.out.name} = tl.full(({s.rows_per_block}, {width}), NEG_INF, "
            f"{_acc_dtype(m.inputs[0].dtype)})"
        )
    for p in pairs:
        w.line(
            f"s_{p.sum.out.name} = tl.full(({s.rows_per_block}, {width}), 0, "
            f"{_acc_dtype(p.sum.inputs[0].dtype)})"
        )

    def step(chunk: Chunk) -> None:
        kw.col_setup(chunk)
        em = Emitter(kw)
        em.done |= scalar_em.done
        for n in cone:
            em.node(n, chunk)
        mask = f"col_ok{chunk.suffix()}" if chunk.masked else None
        for n in reds + maxes:
            em.ensure_inputs(n, chunk)
        for n in reds:
            x = kw.reduce_operand(n, chunk, mask)
            w.line(f"acc_{n.out.name} = {kw.combine(n.op, f'acc_{n.out.name}', x)}")
        for m in maxes:
            mx = f"m_{m.out.name}"
            # masked lanes read -inf: they neither grow the max nor add to the sum
            w.line(f"x_{m.out.name} = {kw.reduce_operand(m, chunk, mask)}")
            w.line(f"grow_{m.out.name} = x_{m.out.name} > {mx}")
            w.comment(
                "a lane's max is -inf until the lane meets a value: 0 stands in for a max "
                "that is not\nfinite, so a -inf x (masked off, or in the data) adds "
                "exp(-inf) = 0 without computing\n-inf - -inf (a +inf or NaN max makes "
                "the row's sum NaN below, whatever the lane adds)"
            )
            w.line(f"fin_{m.out.name} = tl.where(tl.abs({mx}) < POS_INF, {mx}, 0.0)")
            for p in pairs:
                if p.max is not m:
                    continue
                sm, x, grow = f"s_{p.sum.out.name}", f"x_{m.out.name}", f"grow_{m.out.name}"
                # one exp per element, of -|x - m|: exp(c * (x - m)) if the max stays,
                # else the rescale exp(c * (m - x)) of the sum so far (and x adds 1)
                d = f"-tl.abs({x} - fin_{m.out.name})"
                w.line(f"e_{p.sum.out.name} = {_exp(p, d)}")
                e = f"e_{p.sum.out.name}"
                w.line(f"{sm} = tl.where({grow}, {sm} * {e} + 1.0, {sm} + {e})")
            w.line(f"{mx} = {kw.combine(Op.MAX, mx, f'x_{m.out.name}')}")

    if head is not None:
        step(head)
    start = width if head is not None else 0
    if full_end > start:
        with w.block(loop or f"for off in range(0, {full_end}, {width}):"):
            step(body)
    # the tail: tiles as wide as the loop's (the aligned walk's may need two)
    for k in range(-(-tail // width)):
        step(Chunk(f"tail{k}" if k else "tail", f"{full_end + k * width} + ", width, True))
    for n in reds:
        w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=1)}")
    for m in maxes:
        w.line(f"{m.out.name} = {kw.reduce(m, f'm_{m.out.name}', axis=1)}")
    for p in pairs:
        mx, big = f"m_{p.max.out.name}", p.max.out.name
        lanes = f"s_{p.sum.out.name} * {_exp(p, f'({mx} - {big})')}"
        w.line(f"{p.sum.out.name} = tl.sum({lanes}, axis=1, keep_dims=True)")
        w.comment("eager's sum is NaN where the max is not finite (inf - inf, -inf - -inf, NaN)")
        w.line(f"{p.sum.out.name} = tl.where(tl.abs({big}) < POS_INF, {p.sum.out.name}, nan_())")
        kw.helpers.add("nan_")
    for n in reds + maxes + [p.sum for p in pairs]:
        w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
        scalar_em.done.add((n.out.id, None))
        scalar_em.maybe_store(n, None)


def _exp(p: OnlinePair, d: str) -> str:
    """The pair's exp op of c * d."""
    arg = d if p.scale == 1.0 else f"({d}) * {p.scale!r}"
    return render_op(p.exp, [arg])


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
    # takes more than one step (IGNORED_BY), its row_steps trips, row_guard its row mask
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
        with w.block(f"for i in range({s.row_steps}):"):
            idx = f"tl.arange(0, {s.rows_per_block})[:, None]"
            pid = "tl.program_id(1).to(tl.int64)" if s.index_bits == 64 else "tl.program_id(1)"
            w.line(f"rows = ({pid} + i * {split}) * {s.rows_per_block} + {idx}")
            if kw.row_mask:
                w.line("row_ok = rows < n_rows")
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
                w.line(f"part_ok = (p + parts) < {split}" + (" & col_ok" if chunk.masked else ""))
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


def _epilogue(kw: TritonKernelWriter, em: Emitter, reds: list[Node], chunk: Chunk) -> None:
    spec = kw.spec
    for n in reds:
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
    "inner_looped": inner_looped,
    "outer_reduction": outer_reduction,
}
