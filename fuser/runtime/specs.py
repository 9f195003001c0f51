"""From a segmented graph and its inputs' tensors (or their shapes, strides and
alignment) to one KernelSpec per fused segment: each argument's kind, 2D strides (or
per-dim row strides), pointer alignment, and the contiguous copies the runtime makes of
inputs that are not 2D views."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from fuser.ir.broadcast import row_map
from fuser.ir.graph import Graph, Value
from fuser.ir.ops import INDEXED, LAYOUT, Op
from fuser.schedulers.spec import Arg, KernelSpec
from fuser.segmenter import Kind, Segment

# bytes (up to 16) a pointer is aligned to, by its low 4 bits
ALIGN = [16, 1, 2, 1, 4, 1, 2, 1, 8, 1, 2, 1, 4, 1, 2, 1]


def planned_alignment(t: Any) -> int:
    """Bytes (up to 16) a kernel is planned for `t`'s pointer to be aligned to: its own,
    and 16 for a meta tensor (it has no pointer; its data_ptr is the storage offset). The
    one rule that plans (build_specs), the executor's plan keys and the disk cache's key
    share: a plan keyed by another rule than it was made by was taken by a misaligned
    tensor."""
    return 16 if t.is_meta else ALIGN[t.data_ptr() & 15]


def view_2d(t: Any, kind: Kind, rows: int) -> tuple[int, int] | None:
    """(row_stride, col_stride) of `t` seen as [rows, cols], or None if it is not a view."""
    shape, stride = list(t.shape), list(t.stride())
    if kind == Kind.SCALAR:
        return (0, 0)
    if kind == Kind.COL:
        return (0, stride[-1] if shape and shape[-1] != 1 else 1)
    if kind == Kind.FULL and shape:
        col = stride[-1] if shape[-1] != 1 else 1
        lead = [(n, st) for n, st in zip(shape[:-1], stride[:-1]) if n != 1]
    else:
        col = 0
        lead = [(n, st) for n, st in zip(shape, stride) if n != 1]
    # the row dims collapse into one only if each steps over the next one exactly
    for (_, outer), (n, inner) in zip(lead, lead[1:]):
        if outer != inner * n:
            return None
    return (lead[-1][1] if lead else 0, col)


def shape_of(v: Value) -> list[int]:
    """`v`'s shape as ints."""
    return [int(s) for s in v.shape]


def _contig_strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return list(reversed(out))


class _Meta:
    """Shape/stride/pointer facts of a tensor that does not exist yet (an output)."""

    def __init__(self, shape: list[int], ptr: int = 0, stride: Any = None):
        self.shape, self._ptr = shape, ptr
        self._stride = list(stride) if stride is not None else _contig_strides(shape)

    def stride(self) -> list[int]:
        return self._stride

    def data_ptr(self) -> int:
        return self._ptr


# a contiguous pointwise kernel is re-viewed as [total / W, W] for the largest power of
# two W up to this that divides its element count (see _flat_pointwise)
FLAT_WIDTH = 4096
FLAT_MIN_WIDTH = 1024


def _flat_pointwise(seg: Segment, args: list[Arg]) -> tuple[Segment, list[Arg]] | None:
    """A pointwise segment whose tensors are all contiguous and of the full domain does not
    care where rows end: seen as [total / W, W] its rows are all aligned and W is a power
    of two, so accesses are 16 bytes wide and tails disappear (16384 x 50257, whose odd
    rows allow only 2-byte accesses, becomes 201032 x 4096). None when that does not
    apply: a reduction, a broadcast operand, an op that reads the column index (an iota,
    or a slice, pad or cat read through its index map: a rotary embedding's rotate_half),
    an indexed read, a strided tensor, or no power-of-two width of at least
    FLAT_MIN_WIDTH that helps."""
    layout = seg.layout
    if layout is None or layout.inner or layout.outer or len(layout.domain) < 2:
        return None
    if any(n.op == Op.IOTA or n.op in LAYOUT or n.op in INDEXED for n in seg.nodes):
        return None
    rows, cols = layout.rows, layout.cols
    for a in args:
        if a.kind == Kind.SCALAR:
            continue
        if a.kind != Kind.FULL or a.col_stride != 1 or (rows > 1 and a.row_stride != cols):
            return None
        if a.row_dims:
            return None
    total = rows * cols
    width = min(total & -total, FLAT_WIDTH)  # the largest power of two dividing total
    if width < FLAT_MIN_WIDTH or cols % width == 0:
        return None
    flat = replace(layout, domain=(total // width, width))
    args = [replace(a, row_stride=width, col_stride=1) if a.kind == Kind.FULL else a for a in args]
    return replace(seg, layout=flat), args


def strided_rows(seg: Segment, v: Value, t: Any, kind: Kind) -> tuple:
    """(row_dims, row_stride, col_stride) of kernel input `v` (tensor facts `t`) when its
    rows are not one stride apart: it is the operand of a broadcast over part of the row
    dims (ir.broadcast.row_map), or a FULL/ROW view whose row dims do not collapse (a
    transposed q). () otherwise: view_2d's strides, or a contiguous copy."""
    layout = seg.layout
    assert layout is not None
    lead = layout.domain[:-1]
    stride, shape = list(t.stride()), list(t.shape)
    bcast = next(
        (n for n in seg.nodes if n.op == Op.BROADCAST_IN_DIM and n.inputs[0].id == v.id), None
    )
    if any(v.id in (o.id for o in n.outputs) for n in seg.nodes):
        bcast = None  # an output of this kernel: only its own strides
    mapping = row_map(bcast, layout.domain) if bcast is not None else None
    if mapping is not None:
        dims = tuple((n, stride[i] if i >= 0 else 0) for n, i in zip(lead, mapping))
        real = [i for i, d in enumerate(bcast.attr("broadcast_dims")) if d == len(lead)]
        col = stride[real[0]] if real and shape[real[0]] != 1 else 1
    elif kind in (Kind.FULL, Kind.ROW) and len(lead) > 1 and view_2d(t, kind, 0) is None:
        if tuple(shape[: len(lead)]) != tuple(lead) or any(n.op in INDEXED for n in seg.nodes):
            return ()
        dims = tuple((n, st if n != 1 else 0) for n, st in zip(lead, stride))
        col = (stride[-1] if shape[-1] != 1 else 1) if kind == Kind.FULL else 0
    else:
        return ()
    if kind == Kind.ROW:
        col = 0
    return dims, math.gcd(*(st for _, st in dims)), col


def _wanted_strides(
    graph: Graph, segments: list[Segment], out_strides: dict[int, tuple[int, ...]]
) -> dict[int, tuple[int, ...]]:
    """Value id -> strides for the fusion outputs asked in a layout of their own that a
    kernel makes as a full tile (its domain's shape); others stay contiguous (the caller
    copies them, as before)."""
    out = {}
    for i, stride in out_strides.items():
        if i >= len(graph.outputs) or stride is None:
            continue
        v = graph.outputs[i]
        seg = next(
            (s for s in segments if v.id in (o.id for n in s.nodes for o in n.outputs)), None
        )
        if seg is None or not seg.fused or tuple(shape_of(v)) != tuple(seg.layout.domain):
            continue
        if any(n.op in INDEXED for n in seg.nodes):  # a gathered table sets the rows
            continue
        if list(stride) != _contig_strides(shape_of(v)) and v.id not in out:
            out[v.id] = tuple(int(x) for x in stride)
    return out


def build_specs(
    graph: Graph,
    segments: list[Segment],
    inputs: list[Any],
    name: str,
    copied: set[tuple[int, int]],
    notes: list[str] | None = None,
    out_strides: dict[int, tuple[int, ...]] | None = None,
    alloc: dict[int, tuple[int, ...]] | None = None,
) -> dict[int, KernelSpec]:
    """One KernelSpec per fused segment. `out_strides`: output position -> the strides
    the fusion's caller wants it in (fd.output_strides); each such output a kernel makes
    is allocated so (recorded in `alloc`) and written in place."""
    wanted = _wanted_strides(graph, segments, out_strides or {})
    if alloc is not None:
        alloc.update(wanted)
    facts: dict[int, tuple[Any, int]] = {}
    for v, t in zip(graph.inputs, inputs):
        facts[v.id] = (t, planned_alignment(t))
    specs = {}
    for seg in segments:
        for v in (x for n in seg.nodes for x in n.outputs):
            facts.setdefault(v.id, (_Meta(shape_of(v), stride=wanted.get(v.id)), 16))
        if not seg.fused:
            continue
        layout = seg.layout
        args = []
        for is_out, values in ((False, seg.inputs), (True, seg.outputs)):
            for v in values:
                kind = layout.kind(v)
                if any(n.op.value == "const" and n.out.id == v.id for n in seg.nodes):
                    continue
                t, align = facts[v.id]
                dims = () if is_out and v.id not in wanted else strided_rows(seg, v, t, kind)
                if dims:  # read in place through its own row strides (Arg.row_dims)
                    args.append(Arg(v, kind, is_out, *dims[1:], align, row_dims=dims[0]))
                    continue
                st = (
                    view_2d(t, kind, layout.rows)
                    if not is_out or v.id in wanted
                    else view_2d(_Meta(shape_of(v)), kind, layout.rows)
                )
                if st is None:  # not a 2D view: the runtime passes a contiguous copy
                    st = view_2d(_Meta(shape_of(v)), kind, layout.rows)
                    align = 16
                    copied.add((seg.index, v.id))
                args.append(Arg(v, kind, is_out, st[0], st[1], align))
        flat = _flat_pointwise(seg, args)
        if flat is not None:
            if notes is not None:
                d = flat[0].layout.domain  # type: ignore[union-attr]
                notes.append(
                    f"{name}_k{seg.index}: contiguous pointwise {layout.rows} x {layout.cols} "
                    f"run as {d[0]} x {d[1]} (aligned rows, wider accesses, no tails)"
                )
            seg, args = flat
        specs[seg.index] = KernelSpec(f"{name}_k{seg.index}", seg, tuple(args))
    return specs
