"""The order a row kernel walks its rows in, when they are not one stride apart.

A kernel's rows are its domain's leading dims, enumerated outermost first: row r of a
[B, H, T, D] domain is (b, h, t). Where an argument's rows do not collapse to one stride
(Arg.row_dims: q as transformers makes it, [B, T, H, D] seen as [B, H, T, D]), that
order walks memory in jumps: consecutive rows t, t + 1 are H * D elements apart, and the
rows between them are other blocks' work. Rows of a pointwise or row-reduction kernel are
independent, so they may be taken in any order: here, in the memory order of the kernel's
largest tensors, (b, t, h) for that q, so that consecutive rows are consecutive in memory
as in a contiguous layout (and a cos/sin [B, T, D] broadcast over the heads is read by
consecutive rows). Every FULL and ROW argument is then addressed through row dims in that
order (a contiguous one through its own strides), so all of them agree on what row r is.

Not reordered: column reductions (their partial sums would take another order), gathers
(a row's table index), iotas along a row dim (they name the row), and domains whose order
is already the memory order.
"""

from __future__ import annotations

import math
from dataclasses import replace

from fuser.ir.ops import INDEXED, Op
from fuser.schedulers.spec import Arg
from fuser.segmenter import Kind, Segment


def _dims(a: Arg, lead: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """a's (size, stride) per row dim: its row_dims, or those its row stride implies."""
    if a.row_dims:
        return a.row_dims
    out, inner = [], a.row_stride if a.kind in (Kind.FULL, Kind.ROW) else 0
    for n in reversed(lead):
        out.append((n, inner if n > 1 else 0))
        inner *= n
    return tuple(reversed(out))


def _order(dims: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """The row dims by stride, largest first; dims of size 1 (any stride) outermost, in
    their own order: they take no part in the walk."""
    return tuple(sorted(range(len(dims)), key=lambda i: (dims[i][0] > 1, -dims[i][1], i)))


def _follows(dims: tuple[tuple[int, int], ...], order: tuple[int, ...]) -> bool:
    strides = [dims[i][1] for i in order if dims[i][0] > 1 and dims[i][1]]
    return all(x >= y for x, y in zip(strides, strides[1:]))


def row_order(seg: Segment, args: list[Arg]) -> tuple[int, ...] | None:
    """A permutation of the row dims to walk the rows in (None: the domain's own order),
    taken from the FULL arguments that read or write every row (no broadcast): the one
    order that the most of their bytes follow in memory, the domain's own order on a tie."""
    layout = seg.layout
    if layout is None or layout.outer or layout.inner_outer or len(layout.domain) < 3:
        return None
    if not any(a.row_dims for a in args):
        return None
    if any(n.op in INDEXED for n in seg.nodes):
        return None
    rank = len(layout.domain)
    if any(n.op == Op.IOTA and n.attr("dim") % rank != rank - 1 for n in seg.nodes):
        return None
    lead = tuple(layout.domain[:-1])
    full = [_dims(a, lead) for a in args if a.kind == Kind.FULL]
    full = [d for d in full if all(st or n == 1 for n, st in d)]  # every row its own
    if not full:
        return None
    identity = tuple(range(len(lead)))
    candidates = [identity] + [o for o in map(_order, full) if o != identity]
    best = max(candidates, key=lambda o: sum(_follows(d, o) for d in full))  # first on a tie
    return None if best == identity else best


def reorder_rows(args: list[Arg], order: tuple[int, ...], lead: tuple[int, ...]) -> list[Arg]:
    """`args` addressed with their row dims taken in `order` (FULL and ROW ones; column
    vectors and scalars do not depend on the row)."""
    out = []
    for a in args:
        if a.kind not in (Kind.FULL, Kind.ROW):
            out.append(a)
            continue
        dims = _dims(a, lead)
        dims = tuple(dims[i] for i in order)
        strides = [st for _, st in dims if st]
        out.append(replace(a, row_dims=dims, row_stride=math.gcd(*strides) if strides else 0))
    return out
