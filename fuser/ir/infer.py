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
    Op.CROSS_ENTROPY: _cross_entropy,
    Op.CHECK_INDEX: _check_index,
    Op.CONST: _const,
    Op.IOTA: _iota,
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
    Op.CROSS_ENTROPY: 2,
    Op.CHECK_INDEX: 1,
    Op.CONST: 0,
    Op.IOTA: 0,
}


def infer(op: Op, inputs: tuple[Value, ...], attrs: dict) -> Result:
    """Output shapes and dtypes of `op` applied to `inputs`, or a FuserError naming the problem."""
    want = ARITY.get(op)
    if want is not None and len(inputs) != want:
        raise ShapeError(f"{op.value}: expected {want} operands, got {len(inputs)}")
    return RULES[op](op, inputs, attrs)
