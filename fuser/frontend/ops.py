"""`fd.ops`: the op namespace of a FusionDefinition (nvFuser's Python frontend names)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuser.errors import DefinitionError
from fuser.frontend.builder import GraphBuilder, Tensor, broadcast_shapes
from fuser.ir.dtypes import dtype_of
from fuser.ir.graph import Dim, Value
from fuser.ir.guards import index_attrs
from fuser.ir.ops import BINARY, UNARY, Op


def _dims(op: str, dims: Any, dim: Any) -> tuple[int, ...]:
    if dims is None and dim is None:
        raise DefinitionError(f"{op}: give the reduced dims, e.g. dims=[1]")
    d = dims if dims is not None else dim
    return (d,) if isinstance(d, int) else tuple(d)


class Ops:
    """Every op of the IR as a method; binary ops accept Python scalars."""

    def __init__(self, builder: GraphBuilder):
        self._b = builder

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"fd.ops has no op {name!r}")

    # -- elementwise ---------------------------------------------------------------
    def cast(self, x: Tensor, dtype: Any) -> Tensor:
        return self._b.add(Op.CAST, [x], {"dtype": dtype_of(dtype)})[0]

    def where(self, cond: Tensor, a: Any, b: Any) -> Tensor:
        b_ = self._b
        cond, a, b = (b_.operand(Op.WHERE, x, i) for i, x in enumerate((cond, a, b)))
        # numpy broadcast over all three, as torch.where: any of them may be the small one
        values = [x.value for x in (cond, a, b) if x.ndim]
        shape: tuple[Dim, ...] = tuple(values[0].shape) if values else ()
        for i, v in enumerate(values[1:], 1):
            for u in values[:i]:
                broadcast_shapes(Op.WHERE, u, v)  # raises naming the two that clash
            shape = broadcast_shapes(Op.WHERE, Value(v.id, shape, v.dtype), v)
        if shape:
            cond, a, b = (b_.broadcast_to(x, tuple(shape)) for x in (cond, a, b))
        return b_.add(Op.WHERE, [cond, a, b], {})[0]

    # -- shape ---------------------------------------------------------------------
    def broadcast_in_dim(
        self, x: Tensor, shape: Sequence[Dim], broadcast_dims: Sequence[int]
    ) -> Tensor:
        attrs = {"shape": tuple(shape), "broadcast_dims": tuple(broadcast_dims)}
        return self._b.add(Op.BROADCAST_IN_DIM, [x], attrs)[0]

    def slice(self, x: Tensor, dim: int, start: int, stop: int, step: int = 1) -> Tensor:
        """x[..., start:stop:step, ...] along `dim` (static bounds, in range)."""
        attrs = {"dim": dim, "start": start, "stop": stop, "step": step}
        return self._b.add(Op.SLICE, [x], attrs)[0]

    def pad(self, x: Tensor, dim: int, lo: int, hi: int) -> Tensor:
        """`x` with `lo` zeros before and `hi` zeros after it along `dim`."""
        return self._b.add(Op.PAD, [x], {"dim": dim, "lo": lo, "hi": hi})[0]

    def cat(self, xs: Sequence[Tensor], dim: int) -> Tensor:
        """The tensors of `xs` (one dtype) joined along `dim`."""
        return self._b.add(Op.CAT, list(xs), {"dim": dim})[0]

    def view(
        self, x: Tensor, dim: int, size: int, scale: int, offset: int, lo: int, hi: int
    ) -> Tensor:
        """The kernel-level read that slices, pads and cats become (fuser/passes/views.py):
        `size` elements along `dim`, element j read from x[scale * j + offset] for
        lo <= j < hi and 0 elsewhere. For repros of a pipeline's later stages; a fusion
        says what it means with slice, pad and cat."""
        attrs = {"dim": dim, "size": size, "scale": scale, "offset": offset, "lo": lo, "hi": hi}
        return self._b.add(Op.VIEW, [x], attrs)[0]

    def iota(self, shape: Sequence[Dim], dim: int, dtype: Any = "int64") -> Tensor:
        attrs = {"shape": tuple(shape), "dim": dim, "dtype": dtype_of(dtype)}
        return self._b.add(Op.IOTA, [], attrs)[0]

    # -- guards --------------------------------------------------------------------
    def check_index(
        self, x: Tensor, bound: Dim, ignore: int | None = None, what: str = "index"
    ) -> Tensor:
        """`x` itself, checked: every element must lie in [0, bound) or equal `ignore`.
        An element that does not raises OutOfBoundsError ("Target 16 is out of bounds:
        t1[2] (row 2) must lie in [0, 16)", with `what` = "target"); use the result, not
        x, where the index selects something, so the check cannot be left out."""
        attrs = index_attrs(bound, ignore, what)
        return self._b.add(Op.CHECK_INDEX, [x], attrs)[0]

    # -- indexed reads -------------------------------------------------------------
    def gather_rows(self, table: Tensor, index: Tensor) -> Tensor:
        """Rows of a [V, H] `table` at an integer `index` of any shape: out[..., :] =
        table[index[...], :] (shape index.shape + [H]). The index is checked first
        (check_index: an index outside [0, V) raises OutOfBoundsError, never reads)."""
        if table.ndim != 2:
            raise DefinitionError(
                f"gather_rows: table has shape {list(table.shape)}; expected [V, H]"
            )
        bound = table.shape[0]
        made = next((n for n in self._b.nodes if index.value in n.outputs), None)
        already = made is not None and made.op == Op.CHECK_INDEX and made.attr("bound") == bound
        checked = index if already else self.check_index(index, bound, what="index")
        return self._b.add(Op.GATHER_ROWS, [table, checked], {})[0]

    def embedding(self, table: Tensor, index: Tensor) -> Tensor:
        """torch.nn.functional.embedding's forward: gather_rows(table, index)."""
        return self.gather_rows(table, index)

    def index_select(self, table: Tensor, dim: int, index: Tensor) -> Tensor:
        """torch.index_select along dim 0 of a 2-D table with a 1-D index."""
        if dim % max(table.ndim, 1) != 0 or index.ndim != 1:
            raise DefinitionError(
                f"index_select: only dim 0 of a [V, H] table with a 1-D index (got dim {dim}, "
                f"index of rank {index.ndim})"
            )
        return self.gather_rows(table, index)

    # -- reductions ----------------------------------------------------------------
    def _reduce(self, op: Op, x: Tensor, dims: Any, dim: Any, keepdim: bool) -> Tensor:
        attrs = {"dims": _dims(op.value, dims, dim), "keepdim": keepdim}
        return self._b.add(op, [x], attrs)[0]

    def sum(self, x: Tensor, dims: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
        return self._reduce(Op.SUM, x, dims, dim, keepdim)

    def max(self, x: Tensor, dims: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
        return self._reduce(Op.MAX, x, dims, dim, keepdim)

    def min(self, x: Tensor, dims: Any = None, keepdim: bool = False, *, dim: Any = None) -> Tensor:
        return self._reduce(Op.MIN, x, dims, dim, keepdim)

    def mean(
        self, x: Tensor, dims: Any = None, keepdim: bool = False, *, dim: Any = None
    ) -> Tensor:
        return self._reduce(Op.MEAN, x, dims, dim, keepdim)

    def var_mean(
        self,
        x: Tensor,
        dims: Any = None,
        correction: int = 1,
        keepdim: bool = False,
        *,
        dim: Any = None,
    ) -> tuple[Tensor, Tensor]:
        attrs = {"dims": _dims("var_mean", dims, dim), "correction": correction, "keepdim": keepdim}
        var, mean = self._b.add(Op.VAR_MEAN, [x], attrs)
        return var, mean

    # -- composites (torch.nn.functional argument names, over the last dim) --------
    def _norm(self, op: Op, x: Tensor, params: dict[str, Any], attrs: dict) -> list[Tensor]:
        present = {k: v for k, v in params.items() if v is not None}
        attrs = {**attrs, "params": tuple(present)}
        return self._b.add(op, [x, *present.values()], attrs)

    def layer_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
        return_mean_rstd: bool = False,
    ) -> Any:
        attrs = {"eps": float(eps), "return_mean_rstd": bool(return_mean_rstd)}
        outs = self._norm(Op.LAYER_NORM, x, {"weight": weight, "bias": bias}, attrs)
        return tuple(outs) if return_mean_rstd else outs[0]

    def rms_norm(self, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
        return self._norm(Op.RMS_NORM, x, {"weight": weight}, {"eps": float(eps)})[0]

    def gelu(self, x: Tensor, approximate: str = "none") -> Tensor:
        if approximate not in ("none", "tanh"):
            raise DefinitionError(f"gelu: approximate={approximate!r}; expected 'none' or 'tanh'")
        return self._b.add(Op.GELU, [x], {"approximate": approximate})[0]

    def softmax(self, x: Tensor, dim: int = -1) -> Tensor:
        return self._b.add(Op.SOFTMAX, [x], {"dim": dim})[0]

    def log_softmax(self, x: Tensor, dim: int = -1) -> Tensor:
        return self._b.add(Op.LOG_SOFTMAX, [x], {"dim": dim})[0]

    def safe_softmax(self, x: Tensor, dim: int = -1) -> Tensor:
        """softmax, except that a slice of only -inf along `dim` gives zeros, not NaN
        (aten._safe_softmax: attention's fully masked rows)."""
        return self._b.add(Op.SAFE_SOFTMAX, [x], {"dim": dim})[0]

    def cross_entropy(self, logits: Tensor, target: Tensor, ignore_index: int = -100) -> Tensor:
        attrs = {"ignore_index": int(ignore_index)}
        return self._b.add(Op.CROSS_ENTROPY, [logits, target], attrs)[0]


def _unary_method(op: Op) -> Any:
    def method(self: Ops, x: Tensor) -> Tensor:
        return self._b.add(op, [x], {})[0]

    method.__name__ = op.value
    method.__doc__ = f"Elementwise {op.value}."
    return method


def _binary_method(op: Op) -> Any:
    def method(self: Ops, a: Any, b: Any) -> Tensor:
        return self._b.binary(op, a, b)

    method.__name__ = op.value
    method.__doc__ = f"Elementwise {op.value}, with numpy broadcasting and Python scalars."
    return method


for _op in UNARY:
    setattr(Ops, _op.value, _unary_method(_op))
for _op in BINARY:
    setattr(Ops, _op.value, _binary_method(_op))
