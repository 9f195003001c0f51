"""Shape and dtype inference: one function per op group, one table for all ops.

Used by the builder (to type new nodes), the verifier (to re-check every node after a
pass) and concretization (to check symbolic sizes once inputs bind them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fuser.errors import DTypeError, ShapeError
from fuser.ir.dtypes import DType, promote
from fuser.ir.graph import Dim, Shape, Value
from fuser.ir.ops import (
    ARITH,
    BINARY,
    COMPARE,
    LOGICAL,
    REDUCE,
    UNARY_BOOL,
    UNARY_FLOAT,
    UNARY_SAME,
    Op,
)

Result = list[tuple[Shape, DType]]


def dims_match(a: Dim, b: Dim) -> bool:
    """False only when both sizes are known and differ (symbolic sizes are checked at execute)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return True


def shapes_match(a: Shape, b: Shape) -> bool:
    return len(a) == len(b) and all(dims_match(x, y) for x, y in zip(a, b))


def _where(op: Op) -> str:
    return f"{op.value}"


def normalize_dims(op: Op, x: Value, dims: Any) -> tuple[int, ...]:
    """Reduction/softmax dims as sorted non-negative ints, with an error naming the op."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    out = []
    for d in dims:
        if not isinstance(d, int) or not -max(x.rank, 1) <= d < max(x.rank, 1):
            raise ShapeError(
                f"{_where(op)}: dim {d!r} is out of range for operand {x.name} of rank {x.rank}"
            )
        out.append(d % max(x.rank, 1))
    if len(set(out)) != len(out):
        raise ShapeError(f"{_where(op)}: repeated dim in {list(dims)} for operand {x.name}")
    return tuple(sorted(out))


def _same_shapes(op: Op, xs: tuple[Value, ...]) -> Shape:
    tensors = [x for x in xs if x.rank > 0]
    if not tensors:
        return ()
    ref = tensors[0]
    for x in tensors[1:]:
        if not shapes_match(ref.shape, x.shape):
            raise ShapeError(
                f"{_where(op)}: operand {x.name} has shape {list(x.shape)} but operand "
                f"{ref.name} has shape {list(ref.shape)}; broadcast one of them explicitly"
            )
    return ref.shape


def _unary(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    if op in UNARY_BOOL:
        return [(x.shape, DType.bool)]
    if x.dtype == DType.bool and op not in (Op.ABS,):
        raise DTypeError(f"{_where(op)}: operand {x.name} is bool; {op.value} needs a number")
    if op in UNARY_FLOAT and not x.dtype.is_float:
        return [(x.shape, DType.float32)]
    if op in (Op.FLOOR, Op.CEIL) and not x.dtype.is_float:
        raise DTypeError(f"{_where(op)}: operand {x.name} is {x.dtype.value}; expected a float")
    return [(x.shape, x.dtype)]


def _binary(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    shape = _same_shapes(op, xs)
    tensors = [x.dtype for x in xs if x.rank > 0]
    scalars = [x.dtype for x in xs if x.rank == 0]
    if op in COMPARE or op in LOGICAL:
        return [(shape, DType.bool)]
    dtype = promote(tensors, scalars)
    if dtype == DType.bool and op in ARITH and op not in (Op.MAXIMUM, Op.MINIMUM, Op.MUL):
        raise DTypeError(f"{_where(op)}: operands are bool; {op.value} needs numbers")
    if op == Op.DIV and not dtype.is_float:
        dtype = DType.float32  # true division, as torch.div
    return [(shape, dtype)]


def _where_op(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    cond, a, b = xs
    if cond.dtype != DType.bool:
        raise DTypeError(
            f"where: condition {cond.name} has dtype {cond.dtype.value}; expected bool"
        )
    shape = _same_shapes(op, xs)
    tensors = [x.dtype for x in (a, b) if x.rank > 0]
    scalars = [x.dtype for x in (a, b) if x.rank == 0]
    return [(shape, promote(tensors, scalars))]


def _cast(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    return [(xs[0].shape, attrs["dtype"])]


def _broadcast(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    shape, bdims = tuple(attrs["shape"]), tuple(attrs["broadcast_dims"])
    if len(bdims) != x.rank:
        raise ShapeError(
            f"broadcast_in_dim: operand {x.name} has rank {x.rank} but broadcast_dims "
            f"{list(bdims)} has {len(bdims)} entries"
        )
    if any(not 0 <= d < len(shape) for d in bdims) or list(bdims) != sorted(set(bdims)):
        raise ShapeError(
            f"broadcast_in_dim: broadcast_dims {list(bdims)} must be increasing and within "
            f"the output rank {len(shape)} (operand {x.name})"
        )
    for i, d in enumerate(bdims):
        if x.shape[i] != 1 and not dims_match(x.shape[i], shape[d]):
            raise ShapeError(
                f"broadcast_in_dim: dim {i} of operand {x.name} has size {x.shape[i]}, "
                f"expected 1 or {shape[d]} (output dim {d})"
            )
    return [(shape, x.dtype)]


def _reduce(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    dims = normalize_dims(op, x, attrs["dims"])
    keep = attrs.get("keepdim", False)
    shape = (
        tuple(1 if i in dims else s for i, s in enumerate(x.shape))
        if keep
        else tuple(s for i, s in enumerate(x.shape) if i not in dims)
    )
    dtype = x.dtype
    if op == Op.SUM and not dtype.is_float:
        dtype = DType.int64
    if op in (Op.MAX, Op.MIN) and dtype == DType.bool:
        raise DTypeError(f"{op.value}: operand {x.name} is bool; expected a number")
    if op == Op.MEAN and not dtype.is_float:
        raise DTypeError(f"mean: operand {x.name} is {dtype.value}; expected a float")
    return [(shape, dtype)]


def _var_mean(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    if not x.dtype.is_float:
        raise DTypeError(f"var_mean: operand {x.name} is {x.dtype.value}; expected a float")
    ((shape, dtype),) = _reduce(Op.SUM, xs, attrs)
    return [(shape, x.dtype), (shape, x.dtype)]


def _float_input(op: Op, x: Value) -> None:
    if not x.dtype.is_float:
        raise DTypeError(f"{op.value}: operand {x.name} is {x.dtype.value}; expected a float")


def _norm(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    x, *params = xs
    _float_input(op, x)
    if x.rank == 0:
        raise ShapeError(f"{op.value}: operand {x.name} is a scalar; expected a tensor")
    for p in params:
        _float_input(op, p)
        if p.rank != 1 or not dims_match(p.shape[0], x.shape[-1]):
            raise ShapeError(
                f"{op.value}: parameter {p.name} has shape {list(p.shape)}, expected "
                f"[{x.shape[-1]}] (the last dim of {x.name})"
            )
    out = [(x.shape, x.dtype)]
    if op == Op.LAYER_NORM and attrs.get("return_mean_rstd"):
        stat_dtype = DType.float64 if x.dtype == DType.float64 else DType.float32
        stat = tuple(x.shape[:-1]) + (1,)
        out += [(stat, stat_dtype), (stat, stat_dtype)]
    return out


def _same_float(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    _float_input(op, x)
    if "dim" in attrs:
        normalize_dims(op, x, attrs["dim"])
    return [(x.shape, x.dtype)]


def _cross_entropy(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    logits, target = xs
    _float_input(op, logits)
    if logits.rank != 2:
        raise ShapeError(
            f"cross_entropy: logits {logits.name} has rank {logits.rank}; expected [rows, classes]"
        )
    if not target.dtype.is_int:
        raise DTypeError(
            f"cross_entropy: target {target.name} has dtype {target.dtype.value}; expected int64"
        )
    if target.rank != 1 or not dims_match(target.shape[0], logits.shape[0]):
        raise ShapeError(
            f"cross_entropy: target {target.name} has shape {list(target.shape)}, expected "
            f"[{logits.shape[0]}] (the rows of {logits.name})"
        )
    return [((), logits.dtype)]


def _check_index(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    if not x.dtype.is_int:
        raise DTypeError(
            f"check_index: operand {x.name} has dtype {x.dtype.value}; expected an integer index"
        )
    bound = attrs["bound"]
    if isinstance(bound, bool) or (isinstance(bound, int) and bound < 0):
        raise ShapeError(f"check_index: bound {bound!r} of {x.name} is not a size")
    return [(x.shape, x.dtype)]


def _gather_rows(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    table, index = xs
    if table.rank != 2:
        raise ShapeError(
            f"gather_rows: table {table.name} has shape {list(table.shape)}; expected [V, H]"
        )
    if not index.dtype.is_int:
        raise DTypeError(
            f"gather_rows: index {index.name} has dtype {index.dtype.value}; expected an "
            "integer index"
        )
    return [(tuple(index.shape) + (table.shape[1],), table.dtype)]


def _static_dim(op: Op, x: Value, dim: Any) -> int:
    """`dim` of `x` as a non-negative int whose size is known: layout ops are static."""
    (d,) = normalize_dims(op, x, dim)
    if x.rank == 0:
        raise ShapeError(f"{op.value}: operand {x.name} is a scalar; expected a tensor")
    if not isinstance(x.shape[d], int):
        raise ShapeError(
            f"{op.value}: dim {d} of {x.name} has symbolic size {x.shape[d]}; "
            "layout ops need sizes known at compile time"
        )
    return d


def _with_dim(x: Value, d: int, size: int) -> Shape:
    return tuple(x.shape[:d]) + (size,) + tuple(x.shape[d + 1 :])


def _slice(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    d = _static_dim(op, x, attrs["dim"])
    start, stop, step, n = attrs["start"], attrs["stop"], attrs["step"], x.shape[d]
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in (start, stop, step)):
        raise ShapeError(f"slice: start/stop/step of {x.name} must be ints")
    if step < 1 or not 0 <= start <= stop <= n:
        raise ShapeError(
            f"slice: [{start}:{stop}:{step}] is out of range for dim {d} of {x.name} "
            f"(size {n}); expected 0 <= start <= stop <= {n} and step >= 1"
        )
    return [(_with_dim(x, d, len(range(start, stop, step))), x.dtype)]


def _pad(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    d = _static_dim(op, x, attrs["dim"])
    lo, hi = attrs["lo"], attrs["hi"]
    if not all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in (lo, hi)):
        raise ShapeError(f"pad: lo={lo!r}, hi={hi!r} of {x.name} must be ints >= 0")
    return [(_with_dim(x, d, lo + x.shape[d] + hi), x.dtype)]


def _cat(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    if not xs:
        raise ShapeError("cat: expected at least one operand")
    first = xs[0]
    d = _static_dim(op, first, attrs["dim"])
    for x in xs[1:]:
        if x.dtype != first.dtype:
            raise DTypeError(
                f"cat: operand {x.name} is {x.dtype.value} but {first.name} is "
                f"{first.dtype.value}; cast them to one dtype first"
            )
        if x.rank != first.rank or not all(
            dims_match(a, b) for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != d
        ):
            raise ShapeError(
                f"cat: operand {x.name} has shape {list(x.shape)}, {first.name} has "
                f"{list(first.shape)}; all dims but {d} must match"
            )
        _static_dim(op, x, d)
    return [(_with_dim(first, d, sum(x.shape[d] for x in xs)), first.dtype)]


def _view(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    (x,) = xs
    d = _static_dim(op, x, attrs["dim"])
    size, scale, offset = attrs["size"], attrs["scale"], attrs["offset"]
    lo, hi = attrs["lo"], attrs["hi"]
    if scale < 1 or not 0 <= lo < hi <= size:
        raise ShapeError(
            f"view: scale {scale}, range [{lo}, {hi}) of size {size} is not a read of {x.name}"
        )
    first, last = scale * lo + offset, scale * (hi - 1) + offset
    if first < 0 or last >= x.shape[d]:
        raise ShapeError(
            f"view: reads elements {first}..{last} of dim {d} of {x.name} (size {x.shape[d]})"
        )
    return [(_with_dim(x, d, size), x.dtype)]


def _const(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    return [((), attrs["dtype"])]


def _iota(op: Op, xs: tuple[Value, ...], attrs: dict) -> Result:
    shape = tuple(attrs["shape"])
    if not 0 <= attrs["dim"] < len(shape):
        raise ShapeError(f"iota: dim {attrs['dim']} is out of range for shape {list(shape)}")
    return [(shape, attrs["dtype"])]


RULES: dict[Op, Callable[[Op, tuple[Value, ...], dict], Result]] = {
    **{op: _unary for op in UNARY_FLOAT | UNARY_SAME | UNARY_BOOL},
    **{op: _binary for op in BINARY},
    Op.WHERE: _where_op,
    Op.CAST: _cast,
    Op.BROADCAST_IN_DIM: _broadcast,
    **{op: _reduce for op in REDUCE | {Op.MEAN}},
    Op.VAR_MEAN: _var_mean,
    Op.LAYER_NORM: _norm,
    Op.RMS_NORM: _norm,
    Op.GELU: _same_float,
    Op.SOFTMAX: _same_float,
    Op.LOG_SOFTMAX: _same_float,
    Op.SAFE_SOFTMAX: _same_float,
    Op.CROSS_ENTROPY: _cross_entropy,
    Op.CHECK_INDEX: _check_index,
    Op.GATHER_ROWS: _gather_rows,
    Op.CONST: _const,
    Op.IOTA: _iota,
    Op.SLICE: _slice,
    Op.PAD: _pad,
    Op.CAT: _cat,
    Op.VIEW: _view,
}

ARITY = {
    **{op: 1 for op in UNARY_FLOAT | UNARY_SAME | UNARY_BOOL | REDUCE},
    **{op: 2 for op in BINARY},
    Op.WHERE: 3,
    Op.CAST: 1,
    Op.BROADCAST_IN_DIM: 1,
    Op.MEAN: 1,
    Op.VAR_MEAN: 1,
    Op.GELU: 1,
    Op.SOFTMAX: 1,
    Op.LOG_SOFTMAX: 1,
    Op.SAFE_SOFTMAX: 1,
    Op.CROSS_ENTROPY: 2,
    Op.CHECK_INDEX: 1,
    Op.GATHER_ROWS: 2,
    Op.CONST: 0,
    Op.IOTA: 0,
    Op.SLICE: 1,
    Op.PAD: 1,
    Op.VIEW: 1,
}


def infer(op: Op, inputs: tuple[Value, ...], attrs: dict) -> Result:
    """Output shapes and dtypes of `op` applied to `inputs`, or a FuserError naming the problem."""
    want = ARITY.get(op)
    if want is not None and len(inputs) != want:
        raise ShapeError(f"{op.value}: expected {want} operands, got {len(inputs)}")
    return RULES[op](op, inputs, attrs)
