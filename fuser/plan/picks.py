"""One-hot selects read as one element a row.

`sum(where(iota_cols == index, x, 0))` over a row is x at column `index` of that row, and
0 where `index` is off the row: exactly, since every other term is 0 (whatever x holds
there, NaN included). The cross-entropy's target logit is such a sum. A looped kernel
summed it a lane at a time on every tile of the row walk (a compare, a select and an add
per logit); the plan marks it as a pick, and the renderer reads that one element after
the walk: one load a row (H100, 16384 x 50257 bf16 cross-entropy: 2.56 -> 2.10 ms,
benchmarks/results/h100-2026-11-27-session11/1-ce-anatomy).
"""

from __future__ import annotations

from dataclasses import dataclass

from fuser.ir.dtypes import DType
from fuser.ir.graph import Node, Value
from fuser.ir.ops import Op
from fuser.schedulers.spec import KernelSpec
from fuser.segmenter import Kind


@dataclass(frozen=True)
class Pick:
    """Row reduction `reduction` is its summand at column `index` (a row or scalar value,
    an integer): evaluated there, masked to 0 where the column is off the row."""

    reduction: Node
    index: Value

    def text(self) -> str:
        return (
            f"{self.reduction.out.name} = the row's column {self.index.name} of the one-hot "
            "select (one element read a row, not a masked sum over the row)"
        )


def one_hot_picks(spec: KernelSpec) -> tuple[Pick, ...]:
    """The row sums of `spec` that are one-hot selects along the columns."""
    producer = spec.producers
    out = []
    for red in spec.reductions:
        if red.op != Op.SUM or spec.kind(red.out) != Kind.ROW:
            continue
        index = _selected_column(spec, producer, red.inputs[0])
        if index is not None and not _checks_columns(spec, producer, red.inputs[0]):
            out.append(Pick(red, index))
    return tuple(out)


def _checks_columns(spec: KernelSpec, producer: dict[int, Node], v: Value) -> bool:
    """Whether computing `v` checks indices along the row (check_index of a full tile):
    the sum walks every column and reports a bad index anywhere; the pick would look
    at one column only."""
    seen: set[int] = set()
    todo = [v]
    while todo:
        n = producer.get(todo.pop().id)
        if n is None or n.out.id in seen or spec.kind(n.out) in (Kind.ROW, Kind.SCALAR):
            continue
        seen.add(n.out.id)
        if n.op == Op.CHECK_INDEX:
            return True
        todo.extend(n.inputs)
    return False


def _selected_column(spec: KernelSpec, producer: dict[int, Node], v: Value) -> Value | None:
    """The row value naming the one column where `v` = where(iota == index, x, 0) may
    be non-zero, or None where `v` is not of that form."""
    w = producer.get(v.id)
    if w is None or w.op != Op.WHERE or not _is_zero(producer, w.inputs[2]):
        return None
    eq = producer.get(w.inputs[0].id)
    if eq is None or eq.op != Op.EQ:
        return None
    for col, other in (eq.inputs, eq.inputs[::-1]):
        it = producer.get(col.id)
        if it is None or it.op != Op.IOTA or it.attr("dim") != len(col.shape) - 1:
            continue
        if not _counts_columns(it.attr("dtype"), spec.cols):
            continue
        index = _row_value(spec, producer, other)
        if index is not None and not index.dtype.is_float and index.dtype.itemsize > 1:
            return index
    return None


def _counts_columns(dtype: DType, cols: int) -> bool:
    """Whether an iota of `dtype` surely holds every column's own index: an int64 one, or
    an int32 one of at most 2**31 columns (it wraps past that). A float one is never taken,
    whatever the columns: it counts exactly only so far (bf16 to 256, fp16 to 2048), past
    which several columns round to one value and the compare selects all of them (eager
    sums them all), not the index's column alone."""
    return dtype == DType.int64 or (dtype == DType.int32 and cols <= 2**31)


def _row_value(spec: KernelSpec, producer: dict[int, Node], v: Value) -> Value | None:
    """`v` itself if it is one value a row (or one for all), or the row value it
    broadcasts along the columns."""
    if spec.kind(v) in (Kind.ROW, Kind.SCALAR):
        return v
    b = producer.get(v.id)
    if b is None or b.op != Op.BROADCAST_IN_DIM:
        return None
    src = b.inputs[0]
    if spec.kind(src) in (Kind.ROW, Kind.SCALAR) and len(src.shape) < len(v.shape):
        return src
    return None


def _is_zero(producer: dict[int, Node], v: Value) -> bool:
    n = producer.get(v.id)
    while n is not None and n.op == Op.BROADCAST_IN_DIM:
        n = producer.get(n.inputs[0].id)
    return n is not None and n.op == Op.CONST and n.attr("value") == 0
