"""The dtypes of the IR and torch's type promotion rules, restricted to them."""

from __future__ import annotations

import enum

import torch

from fuser.errors import DTypeError


class DType(enum.Enum):
    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int64 = "int64"
    int32 = "int32"
    bool = "bool"

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.value)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in FLOATS

    @property
    def is_int(self) -> bool:
        return self in (DType.int32, DType.int64)

    @property
    def short(self) -> str:
        return _SHORT[self]

    def __repr__(self) -> str:
        return f"torch.{self.value}"


FLOATS = (DType.float64, DType.float32, DType.float16, DType.bfloat16)
_ITEMSIZE = {
    DType.float64: 8,
    DType.float32: 4,
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.int64: 8,
    DType.int32: 4,
    DType.bool: 1,
}
_SHORT = {
    DType.float64: "f64",
    DType.float32: "f32",
    DType.float16: "f16",
    DType.bfloat16: "bf16",
    DType.int64: "i64",
    DType.int32: "i32",
    DType.bool: "b1",
}
_FROM_TORCH = {d.torch: d for d in DType}


def dtype_of(value: object) -> DType:
    """The IR dtype of a torch dtype, an IR dtype or a dtype name."""
    if isinstance(value, DType):
        return value
    if isinstance(value, torch.dtype) and value in _FROM_TORCH:
        return _FROM_TORCH[value]
    if isinstance(value, str) and value in DType.__members__:
        return DType[value]
    supported = ", ".join(d.value for d in DType)
    raise DTypeError(f"unsupported dtype {value!r}; fuser supports {supported}")


def scalar_dtype(value: object) -> DType:
    """The dtype torch gives a Python scalar on its own (bool, int64, float32)."""
    if isinstance(value, bool):
        return DType.bool
    if isinstance(value, int):
        return DType.int64
    if isinstance(value, float):
        return DType.float32
    raise DTypeError(f"unsupported scalar {value!r} of type {type(value).__name__}")


def _category(d: DType) -> int:
    return 2 if d.is_float else 1 if d.is_int else 0


def promote(tensors: list[DType], scalars: list[DType] = ()) -> DType:
    """torch.result_type for tensor operands of equal rank plus Python scalars.

    Tensors decide the dtype; a scalar only lifts the category (an int tensor plus a
    float scalar gives float32, a half tensor plus a float scalar stays half).
    """
    pool = list(tensors) or list(scalars)
    best = pool[0]
    for d in pool[1:]:
        best = _promote_pair(best, d)
    for s in scalars if tensors else ():
        if _category(s) > _category(best):
            best = DType.float32 if s.is_float else DType.int64
    return best


def _promote_pair(a: DType, b: DType) -> DType:
    if a == b:
        return a
    return dtype_of(torch.promote_types(a.torch, b.torch))


def accumulator(dtype: DType) -> DType:
    """The dtype reductions of `dtype` accumulate in: float64 stays, other floats sum in
    float32, integers and bools in int64."""
    if dtype == DType.float64:
        return DType.float64
    return DType.float32 if dtype.is_float else DType.int64
