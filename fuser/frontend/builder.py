"""Graph building: tensor handles and the node-adding machinery behind FusionDefinition."""

from __future__ import annotations

from typing import Any, Union

import sympy
import torch

from fuser.errors import DefinitionError, ShapeError
from fuser.ir.dtypes import DType, dtype_of, scalar_dtype
from fuser.ir.graph import Dim, Graph, Node, Value, freeze_attrs
from fuser.ir.infer import dims_match, infer
from fuser.ir.ops import Op

Scalar = Union[bool, int, float]


class Tensor:
    """A handle on one value of a FusionDefinition under construction."""

    __slots__ = ("builder", "value")

    def __init__(self, builder: GraphBuilder, value: Value):
        self.builder = builder
        self.value = value

    @property
    def shape(self) -> list[Dim]:
        return list(self.value.shape)

    @property
    def dtype(self) -> Any:
        return self.value.dtype.torch

    @property
    def ndim(self) -> int:
        return self.value.rank

    @property
    def name(self) -> str:
        return self.value.name

    def size(self, dim: int) -> Dim:
        return self.value.shape[dim]

    def __repr__(self) -> str:
        return f"Tensor({self.value!r})"

    def _binary(self, op: Op, other: Any, reverse: bool = False) -> Tensor:
        a, b = (other, self) if reverse else (self, other)
        return self.builder.binary(op, a, b)

    def __add__(self, o: Any) -> Tensor:
        return self._binary(Op.ADD, o)

    def __radd__(self, o: Any) -> Tensor:
        return self._binary(Op.ADD, o, True)

    def __sub__(self, o: Any) -> Tensor:
        return self._binary(Op.SUB, o)

    def __rsub__(self, o: Any) -> Tensor:
        return self._binary(Op.SUB, o, True)

    def __mul__(self, o: Any) -> Tensor:
        return self._binary(Op.MUL, o)

    def __rmul__(self, o: Any) -> Tensor:
        return self._binary(Op.MUL, o, True)

    def __truediv__(self, o: Any) -> Tensor:
        return self._binary(Op.DIV, o)

    def __rtruediv__(self, o: Any) -> Tensor:
        return self._binary(Op.DIV, o, True)

    def __neg__(self) -> Tensor:
        return self.builder.add(Op.NEG, [self], {})[0]


def broadcast_shapes(op: Op, a: Value, b: Value) -> tuple[Dim, ...]:
    """numpy-style broadcast of two shapes, with an error naming the op and operands."""
    rank = max(a.rank, b.rank)
    sa = (1,) * (rank - a.rank) + tuple(a.shape)
    sb = (1,) * (rank - b.rank) + tuple(b.shape)
    out = []
    for x, y in zip(sa, sb):
        if x == 1:
            out.append(y)
        elif y == 1 or (dims_match(x, y) and isinstance(x, int)):
            out.append(x)
        elif dims_match(x, y):
            # x is symbolic: a known size says more; between two symbols take the one of
            # the higher-rank operand, so `bias[H] + x[N, H]` broadcasts only the bias
            out.append(y if isinstance(y, int) or b.rank > a.rank else x)
        else:
            raise ShapeError(
                f"{op.value}: operand {a.name} of shape {list(a.shape)} does not broadcast "
                f"with operand {b.name} of shape {list(b.shape)}"
            )
    return tuple(out)


def _scalar_as_operand_dtype(x: Any, other: Any) -> Any:
    """A Python float next to a float16/bfloat16 tensor, rounded to that dtype.

    Eager add/sub cast a Python scalar to the op's common dtype before computing (CPU
    and CUDA alike): a bf16 tensor plus 0.01 adds bf16(0.01) = 0.010009765625 in float32
    math, not 0.01. Fuser's kernels compute half ops in float32 with the constant as a
    literal, so the constant must hold the rounded value to give eager's answer. (Eager
    mul/div differ by device: CPU keeps the scalar unrounded, CUDA rounds it; fuser
    keeps it, as CPU eager.)
    """
    if isinstance(x, float) and isinstance(other, Tensor):
        dtype = other.value.dtype
        if dtype in (DType.float16, DType.bfloat16):
            return float(torch.tensor(x, dtype=dtype.torch))
    return x


def _negative_int(x: Any) -> bool:
    """A Python int below 0 (not a bool, not a float)."""
    return isinstance(x, int) and not isinstance(x, bool) and x < 0


class GraphBuilder:
    """Collects nodes in definition order; `graph()` freezes them into a Graph."""

    def __init__(self) -> None:
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.outputs: list[Value] = []
        self._ids = 0
        self._frozen = False  # set once graph() hands the definition out

    def _check_open(self, what: str) -> None:
        if self._frozen:
            raise DefinitionError(
                f"{what}: the fusion is already finalized; define ops inside the `with` block"
            )

    def _new_value(self, shape: tuple[Dim, ...], dtype: DType) -> Value:
        v = Value(self._ids, tuple(shape), dtype)
        self._ids += 1
        return v

    def define_input(self, shape: list[int], dtype: Any) -> Tensor:
        self._check_open("define_tensor")
        dtype = dtype_of(dtype)
        vid = self._ids
        dims: list[Dim] = []
        for i, s in enumerate(shape):
            if not isinstance(s, int) or s < -1:
                raise DefinitionError(
                    f"define_tensor: size {s!r} at dim {i} must be a non-negative int or -1"
                )
            dims.append(
                sympy.Symbol(f"t{vid}.shape[{i}]", integer=True, nonnegative=True) if s == -1 else s
            )
        v = self._new_value(tuple(dims), dtype)
        self.inputs.append(v)
        return Tensor(self, v)

    def operand(self, op: Op, x: Any, position: int) -> Tensor:
        if isinstance(x, Tensor):
            if x.builder is not self:
                raise DefinitionError(
                    f"{op.value}: operand {position} ({x.name}) belongs to another FusionDefinition"
                )
            return x
        if isinstance(x, (bool, int, float, sympy.Expr)):
            return self.const(x)
        raise DefinitionError(
            f"{op.value}: operand {position} is a {type(x).__name__}; expected a fuser Tensor "
            "or a Python number"
        )

    def const(self, value: Scalar | sympy.Expr, dtype: Any = None) -> Tensor:
        """A scalar constant; a sympy expression (a size known only at execute) stays symbolic."""
        if isinstance(value, sympy.Expr) and value.is_number:
            value = int(value) if value.is_integer else float(value)
        if isinstance(value, sympy.Expr):
            dtype = (DType.int64 if value.is_integer else DType.float32) if dtype is None else dtype
            return self.add(Op.CONST, [], {"value": value, "dtype": dtype_of(dtype)})[0]
        dtype = scalar_dtype(value) if dtype is None else dtype_of(dtype)
        value = (
            bool(value) if dtype == DType.bool else float(value) if dtype.is_float else int(value)
        )
        return self.add(Op.CONST, [], {"value": value, "dtype": dtype})[0]

    def add(self, op: Op, inputs: list[Any], attrs: dict[str, Any]) -> list[Tensor]:
        self._check_open(op.value)
        handles = [self.operand(op, x, i) for i, x in enumerate(inputs)]
        values = tuple(h.value for h in handles)
        results = infer(op, values, attrs)
        outs = tuple(self._new_value(shape, dtype) for shape, dtype in results)
        self.nodes.append(Node(op, values, outs, freeze_attrs(attrs)))
        return [Tensor(self, v) for v in outs]

    def broadcast_to(self, x: Tensor, shape: tuple[Dim, ...]) -> Tensor:
        if x.ndim == 0 or tuple(x.shape) == tuple(shape):
            return x
        lead = len(shape) - x.ndim  # numpy rule: align trailing dims, size 1 expands
        return self.add(
            Op.BROADCAST_IN_DIM,
            [x],
            {"shape": tuple(shape), "broadcast_dims": tuple(range(lead, len(shape)))},
        )[0]

    def binary(self, op: Op, a: Any, b: Any) -> Tensor:
        if op in (Op.ADD, Op.SUB):
            a, b = (_scalar_as_operand_dtype(x, y) for x, y in ((a, b), (b, a)))
        if (
            op == Op.POW
            and _negative_int(b)
            and isinstance(a, Tensor)
            and not a.value.dtype.is_float
        ):
            # as torch.pow; a tensor exponent's negative elements give torch's 1, +-1 or 0
            raise DefinitionError(
                f"pow: {a.name} is {a.value.dtype.short} and its exponent {b}: integers to "
                "negative integer powers are not allowed (as in torch)"
            )
        a, b = self.operand(op, a, 0), self.operand(op, b, 1)
        if a.ndim and b.ndim:
            shape = broadcast_shapes(op, a.value, b.value)
            a, b = self.broadcast_to(a, shape), self.broadcast_to(b, shape)
        return self.add(op, [a, b], {})[0]

    def add_output(self, x: Any) -> None:
        self._check_open("add_output")
        if not isinstance(x, Tensor) or x.builder is not self:
            raise DefinitionError(f"add_output: {x!r} is not a tensor of this FusionDefinition")
        if x.value.id in {v.id for v in self.inputs}:
            raise DefinitionError(
                f"add_output: {x.name} is an input; an output must be computed by the fusion"
            )
        self.outputs.append(x.value)

    def graph(self) -> Graph:
        if not self.outputs:
            raise DefinitionError("the fusion has no outputs; call fd.add_output(tensor)")
        self._frozen = True
        return Graph(tuple(self.inputs), tuple(self.nodes), tuple(self.outputs))
