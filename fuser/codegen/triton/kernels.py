"""Kernel bodies per schedule kind: pointwise, inner persistent, inner looped, outer."""

from __future__ import annotations

from contextlib import nullcontext

from fuser.codegen.triton.render import (
    TL_DTYPE,
    Chunk,
    TritonKernelWriter,
    _acc_dtype,
    _cone,
    _identity,
)
from fuser.ir.graph import Node
from fuser.ir.ops import REDUCE
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


def _chunk_of(kw: TritonKernelWriter, index: int | None, offset: int | str, width: int) -> Chunk:
    off = "" if offset == 0 else f"{offset} + "
    masked = isinstance(offset, int) and offset + width > kw.spec.cols
    return Chunk(index, off, width, masked)


def inner_persistent(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    chunks = [_chunk_of(kw, i, off, width) for i, (off, width) in enumerate(s.chunks())]
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
        for a, c in streamed:
            kw.load(a, c, rows="first_rows")
            em.loaded.add(em.key(a.value.id, c))
        kw.row_mask = True  # the last sweep may run past n_rows: its stores are masked
        with w.block(f"for step in range(0, {spec.rows}, {grid}):"):
            w.line("rows = step + pid + tl.arange(0, 1)[:, None]")
            w.line(f"row_ok = rows < {spec.rows}")
            w.comment("loads clamp to the last row instead of masking it")
            w.line(f"next_rows = tl.minimum(rows + {grid}, {last})")
            for a, c in streamed:
                kw.load(a, c, rows="next_rows", suffix="_next")
            _persistent_body(kw, em, chunks)
            for a, c in streamed:
                name = kw.name(a.value, c)
                w.line(f"{name} = {name}_next")
    return w.text()


def _persistent_body(kw: TritonKernelWriter, em: Emitter, chunks: list[Chunk]) -> None:
    spec, s, w = kw.spec, kw.s, kw.w
    for node in spec.nodes:
        kind = spec.kinds.get(node.out.id)
        if node.op in REDUCE:
            for c in chunks:
                em.ensure_inputs(node, c)
            # full chunks fold lane by lane first: one cross-thread reduction, not one
            # per chunk (each is a shuffle tree and, across warps, a barrier)
            full = [c for c in chunks if not c.masked and c.width == s.chunk]
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
            w.comment(
                f"{node.op.value} over the row: {len(full)} full chunk(s) folded lane by "
                f"lane, {len(rest)} tail chunk(s)"
            )
            w.line(f"{node.out.name} = ({expr}).to({TL_DTYPE[node.out.dtype]})")
            em.maybe_store(node, None)
        elif kind in (Kind.FULL, Kind.COL):
            for c in chunks:
                em.node(node, c)
        else:
            em.node(node, None)


def inner_looped(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    width = s.chunk * s.unroll
    full_end = spec.cols // width * width
    tail = spec.cols - full_end
    tail_w = 1 << max(tail - 1, 0).bit_length() if tail else 0
    body = Chunk(None, "off + ", width, False)
    # the tail's names differ from the loop body's: Triton wants a variable's shape
    # to stay the same through a loop
    tail_chunk = Chunk("tail", f"{full_end} + ", tail_w, True)
    w.line("@triton.jit")
    with w.block(kw.signature([])):
        w.comment(
            f"one row per program, walked {width} columns at a time "
            f"({spec.rounds} reduction pass(es) + the output pass)"
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
        for rnd in range(1, spec.rounds + 1):
            reds = [n for n in spec.reductions if spec.depth[n.out.id] == rnd]
            cone = _cone(spec, [n.inputs[0] for n in reds], {Kind.FULL, Kind.COL}, rnd)
            w.comment(f"pass {rnd}: " + ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds))
            for n in reds:
                w.line(
                    f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {width}), "
                    f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
                )
            if full_end:
                with w.block(f"for off in range(0, {full_end}, {width}):"):
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
            if tail:
                kw.col_setup(tail_chunk)
                em = Emitter(kw)
                em.done |= scalar_em.done
                for n in cone:
                    em.node(n, tail_chunk)
                for n in reds:
                    em.ensure_inputs(n, tail_chunk)
                    term = kw.reduce_term(n, tail_chunk)
                    w.line(f"{n.out.name} = {kw.combine(n.op, n.out.name, term)}")
            for n in reds:
                w.line(f"{n.out.name} = {n.out.name}.to({TL_DTYPE[n.out.dtype]})")
                scalar_em.done.add((n.out.id, None))
                scalar_em.maybe_store(n, None)
            row_nodes(rnd)
        full_outs = [a.value for a in spec.outputs if a.kind in (Kind.FULL, Kind.COL)]
        if full_outs:
            cone = _cone(spec, full_outs, {Kind.FULL, Kind.COL}, spec.rounds + 1)
            w.comment("output pass")
            for chunk, ctx in ((body, full_end), (tail_chunk, tail)):
                if not ctx:
                    continue
                header = f"for off in range(0, {full_end}, {width}):" if chunk is body else None
                with w.block(header) if header else nullcontext():
                    kw.col_setup(chunk)
                    em = Emitter(kw)
                    em.done |= scalar_em.done
                    for n in cone:
                        em.node(n, chunk)
    return w.text()


def pointwise(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    chunk = Chunk(None, f"tl.program_id(1) * {s.chunk} + ", s.chunk, spec.cols % s.chunk != 0)
    em = Emitter(kw)
    w.line("@triton.jit")
    with w.block(kw.signature([])):
        w.comment(f"a {s.rows_per_block} x {s.chunk} tile per program")
        kw.row_setup("tl.program_id(0)")
        kw.col_setup(chunk)
        for node in spec.nodes:
            em.node(node, chunk)
    return w.text()


def workspaces(kw_spec, schedule) -> list[str]:
    """Names of the fp32/int64 partial-sum buffers a split outer reduction needs."""
    if schedule.kind != "outer_reduction" or schedule.split_rows == 1:
        return []
    return [f"ws_{n.out.name}" for n in kw_spec.reductions]


def outer_reduction(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    kw.row_mask = True
    split = s.split_rows
    ws = workspaces(spec, s)
    extra = [f"{name}_ptr" for name in ws]
    chunk = Chunk(None, f"tl.program_id(0) * {s.chunk} + ", s.chunk, spec.cols % s.chunk != 0)
    em = Emitter(kw)
    reds = list(spec.reductions)
    w.line("@triton.jit")
    with w.block(kw.signature(extra)):
        w.comment(f"column tile {s.chunk}; rows {s.rows_per_block} at a time, split {split} ways")
        kw.col_setup(chunk)
        for n in spec.nodes:
            if (
                spec.kinds.get(n.out.id) == Kind.COL
                and spec.depth[n.out.id] == 0
                and n.op not in REDUCE
            ):
                em.node(n, chunk)
        for n in reds:
            w.line(
                f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {s.chunk}), "
                f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
            )
        step = s.rows_per_block * split
        trips = -(-spec.rows // step)
        with w.block(f"for i in range({trips}):"):
            idx = f"tl.arange(0, {s.rows_per_block})[:, None]"
            pid = "tl.program_id(1).to(tl.int64)" if s.index_bits == 64 else "tl.program_id(1)"
            w.line(f"rows = ({pid} + i * {split}) * {s.rows_per_block} + {idx}")
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
            w.comment(f"add the {split} partial sums of each column in a fixed order")
            kw.col_setup(chunk)
            p2 = 1 << max(split - 1, 0).bit_length()
            w.line(f"parts = tl.arange(0, {p2})[:, None]")
            fin = Emitter(kw)
            for n, name in zip(reds, ws):
                m = f"(parts < {split})" + (" & col_ok" if chunk.masked else "")
                part = (
                    f"tl.load({name}_ptr + parts * {spec.cols} + cols, "
                    f"mask={m}, other={_identity(n.op, n.inputs[0].dtype)})"
                )
                w.line(f"{n.out.name} = {kw.reduce(n, part, axis=0)}")
            _epilogue(kw, fin, reds, chunk)
    return w.text()


def _epilogue(kw: TritonKernelWriter, em: Emitter, reds: list[Node], chunk: Chunk) -> None:
    spec = kw.spec
    for n in reds:
        kw.w.line(f"{n.out.name} = {n.out.name}.to({TL_DTYPE[n.out.dtype]})")
        em.done.add(em.key(n.out.id, chunk))
        em.maybe_store(n, chunk)
    for n in spec.nodes:
        if n.op not in REDUCE and spec.kinds.get(n.out.id) == Kind.COL:
            em.node(n, chunk)


RENDERERS = {
    "pointwise": pointwise,
    "inner_persistent": inner_persistent,
    "inner_looped": inner_looped,
    "outer_reduction": outer_reduction,
}
