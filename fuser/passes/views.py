"""Lower slice, pad and cat along the last dim to reads of kernel inputs (index maps).

A slice, pad or cat is no copy: its consumer reads its operand at another column. Each
is pushed down through the elementwise ops (and column broadcasts, iotas) that compute
its operand until it reaches a value a kernel takes as input; there it becomes one VIEW
node, out[j] = x[scale * j + offset] for lo <= j < hi, the composition of every map on
the way. A pad keeps its zeros and a cat chooses its pieces with a select on the column
index (`where(iota < n0, piece0, piece1)`), so a VIEW's value outside [lo, hi) is never
used. Views along other dims stay SLICE/PAD/CAT nodes, which the segmenter leaves to ATen.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuser.frontend.builder import Tensor
from fuser.ir.broadcast import row_map
from fuser.ir.graph import Graph, Node, Value
from fuser.ir.ops import ELEMENTWISE, LAYOUT, Op
from fuser.passes.rewriter import Rewriter


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ColMap:
    """A read along the last dim, for a result of `size` columns: column j holds the
    source's column scale * j + offset for lo <= j < hi (anything elsewhere)."""

    size: int
    scale: int = 1
    offset: int = 0
    lo: int = 0
    hi: int = -1

    def __post_init__(self) -> None:
        if self.hi < 0:
            object.__setattr__(self, "hi", self.size)

    def through(self, inner: ColMap) -> ColMap:
        """This read of a value that is itself `inner`'s read of a source."""
        lo = max(self.lo, _cdiv(inner.lo - self.offset, self.scale))
        hi = min(self.hi, _cdiv(inner.hi - self.offset, self.scale))
        return ColMap(
            self.size,
            inner.scale * self.scale,
            inner.scale * self.offset + inner.offset,
            lo,
            max(hi, lo),
        )

    def identity(self, src: int) -> bool:
        return (self.scale, self.offset, self.lo) == (1, 0, 0) and self.hi == self.size == src


def is_last_dim(node: Node) -> bool:
    x = node.inputs[0]
    return x.rank > 0 and node.attr("dim") % x.rank == x.rank - 1


class _Views:
    def __init__(self, graph: Graph):
        self.rw = Rewriter(graph, "views")
        self.ops = self.rw.ops
        self.memo: dict[tuple[int, ColMap], Value] = {}
        self.seen = 0
        self.producer: dict[int, Node] = {}

    def _producer(self, v: Value) -> Node | None:
        nodes = self.rw.builder.nodes
        for n in nodes[self.seen :]:
            for o in n.outputs:
                self.producer[o.id] = n
        self.seen = len(nodes)
        return self.producer.get(v.id)

    def t(self, v: Value) -> Tensor:
        return Tensor(self.rw.builder, v)

    def shape(self, v: Value, m: ColMap) -> tuple:
        return tuple(v.shape[:-1]) + (m.size,)

    def read(self, v: Value, m: ColMap) -> Value:
        """`v` read through `m` (new-graph values)."""
        if v.rank == 0 or m.identity(v.shape[-1]):
            return v
        key = (v.id, m)
        if key not in self.memo:
            self.memo[key] = self._read(v, m)
        return self.memo[key]

    def _read(self, v: Value, m: ColMap) -> Value:
        ops, p = self.ops, self._producer(v)
        if m.lo >= m.hi:  # nothing of v is used: any value of the shape
            zero = self.rw.builder.const(0, v.dtype)
            return ops.broadcast_in_dim(zero, self.shape(v, m), []).value
        if p is None:
            return self.view(v, m)
        if p.op in ELEMENTWISE:
            args = [self.t(x if x.rank == 0 else self.read(x, m)) for x in p.inputs]
            return self.rw.builder.add(p.op, args, dict(p.attrs))[0].value
        if p.op == Op.VIEW:
            inner = ColMap(*(p.attr(k) for k in ("size", "scale", "offset", "lo", "hi")))
            return self.read(p.inputs[0], m.through(inner))
        if p.op == Op.IOTA and p.attr("dim") != v.rank - 1:
            return ops.iota(self.shape(v, m), p.attr("dim"), p.attr("dtype")).value
        if p.op == Op.IOTA:
            i = ops.iota(self.shape(v, m), v.rank - 1, p.attr("dtype"))
            if m.scale != 1:
                i = ops.mul(i, self.rw.builder.const(m.scale, v.dtype))
            if m.offset:
                i = ops.add(i, self.rw.builder.const(m.offset, v.dtype))
            return i.value
        if p.op == Op.BROADCAST_IN_DIM:
            return self.broadcast(p, v, m)
        return self.view(v, m)

    def broadcast(self, p: Node, v: Value, m: ColMap) -> Value:
        """A read of a broadcast: a new broadcast when the last dim is broadcast (a row
        value), or of the source read through `m` when the source's last dim is the
        result's (a column [D], or cos/sin [B, T, D] broadcast over heads); otherwise
        the broadcast result is read (it is materialized either way)."""
        src, bdims = p.inputs[0], tuple(p.attr("broadcast_dims"))
        last = v.rank - 1
        shape = self.shape(v, m)
        if last not in bdims or src.shape[bdims.index(last)] == 1:
            return self.ops.broadcast_in_dim(self.t(src), shape, bdims).value
        if bdims.index(last) == src.rank - 1 and row_map(p, tuple(v.shape)) is not None:
            # a broadcast over part of the row dims (cos/sin [B, T, D] over q's heads):
            # the view reads the broadcast of each kernel input under it, which a kernel
            # reads from that input at mapped rows (classify.row_map), at the view's
            # columns. A view under the broadcast would be a [B, T, D] value of its own,
            # a kernel of its own.
            read = self.row_broadcast_read(src, bdims, tuple(v.shape), m)
            if read is not None:
                return read
        if bdims.index(last) == src.rank - 1:
            # the source's last dim is the result's: the column read commutes with the
            # broadcast of the other dims
            return self.ops.broadcast_in_dim(self.t(self.read(src, m)), shape, bdims).value
        return self.view(v, m)

    def row_broadcast_read(self, src: Value, bdims: tuple, shape: tuple, m: ColMap) -> Value | None:
        """broadcast_in_dim(src, shape, bdims) read through `m`, as a view of the
        broadcast of the kernel input under `src`, with the casts between them (of a
        bf16 sin) applied after: None where other math is under it. A cast costs nothing
        per element; other math (a sin computed from positions) would run once per head
        after the broadcast, and the view under it is cheaper."""
        casts = []
        p = self._producer(src)
        while p is not None and p.op == Op.CAST:
            casts.append(p)
            src = p.inputs[0]
            p = self._producer(src)
        if p is not None:
            return None
        out = self.view(self.ops.broadcast_in_dim(self.t(src), shape, list(bdims)).value, m)
        for c in reversed(casts):
            out = self.rw.builder.add(Op.CAST, [self.t(out)], dict(c.attrs))[0].value
        return out

    def view(self, v: Value, m: ColMap) -> Value:
        attrs = {
            "dim": v.rank - 1,
            "size": m.size,
            "scale": m.scale,
            "offset": m.offset,
            "lo": m.lo,
            "hi": m.hi,
        }
        return self.rw.builder.add(Op.VIEW, [self.t(v)], attrs)[0].value

    def select(self, size: int, pieces: list[tuple[int, int, Value]], like: Value) -> Value:
        """Columns [start, stop) from each piece's value (the rest: zeros)."""
        ops = self.ops
        shape = tuple(like.shape[:-1]) + (size,)
        col = ops.iota(shape, len(shape) - 1, "int32")
        zero = self.rw.builder.const(0, like.dtype)
        out: Tensor | None = None
        for _, stop, val in reversed(pieces):
            if out is None:
                out = self.t(val)
                if stop < size:
                    out = ops.where(ops.lt(col, stop), out, zero)
            else:
                out = ops.where(ops.lt(col, stop), self.t(val), out)
        assert out is not None
        if pieces[0][0] > 0:
            out = ops.where(ops.ge(col, pieces[0][0]), out, zero)
        return out.value

    def lower(self, node: Node) -> Value:
        x = self.rw.env[node.inputs[0].id]
        size = node.out.shape[-1]
        if node.op == Op.SLICE:
            m = ColMap(size, node.attr("step"), node.attr("start"))
            return self.read(x, m)
        if node.op == Op.PAD:
            lo, n = node.attr("lo"), x.shape[-1]
            piece = self.read(x, ColMap(size, 1, -lo, lo, lo + n))
            return self.select(size, [(lo, lo + n, piece)], x)
        pieces, start = [], 0
        for old in node.inputs:
            v = self.rw.env[old.id]
            n = v.shape[-1]
            piece = self.read(v, ColMap(size, 1, -start, start, start + n))
            pieces.append((start, start + n, piece))
            start += n
        return self.select(size, pieces, x)


def lower_views(graph: Graph) -> Graph:
    """Slices, pads and cats along the last dim as VIEW reads (see the module notes)."""
    lw = _Views(graph)
    for node in graph.nodes:
        if node.op in LAYOUT and node.op != Op.VIEW and is_last_dim(node):
            lw.rw.replace(node, [lw.lower(node)])
        else:
            lw.rw.keep(node)
    return lw.rw.finish()


def has_views(graph: Graph) -> bool:
    return any(n.op in LAYOUT for n in graph.nodes)
