"""Decompose composites (layer_norm, softmax, gelu, ...) into primitives.

Each decomposition follows what ATen computes: half and bfloat16 inputs are upcast to
float32, the math runs in float32, and the result is rounded once to the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fuser.frontend.builder import Tensor
from fuser.frontend.ops import Ops
from fuser.ir.dtypes import DType
from fuser.ir.graph import Graph, Node
from fuser.ir.ops import COMPOSITE, Op
from fuser.passes.rewriter import Rewriter


def _compute_dtype(t: Tensor) -> DType:
    d = t.value.dtype
    return DType.float64 if d == DType.float64 else DType.float32


def _up(ops: Ops, t: Tensor) -> Tensor:
    d = _compute_dtype(t)
    return t if t.value.dtype == d else ops.cast(t, d)


def _down(ops: Ops, t: Tensor, like: Tensor) -> Tensor:
    return t if t.value.dtype == like.value.dtype else ops.cast(t, like.value.dtype)


def _count(x: Tensor, dims: tuple[int, ...]) -> object:
    n = 1
    for d in dims:
        n = n * x.shape[d]
    return n


def _bcast(ops: Ops, t: Tensor, like: Tensor, kept: list[int]) -> Tensor:
    return ops.broadcast_in_dim(t, shape=like.shape, broadcast_dims=kept)


def _norm_dims(x: Tensor, dims: tuple[int, ...]) -> tuple[tuple[int, ...], list[int]]:
    red = tuple(sorted(d % x.ndim for d in dims))
    return red, [i for i in range(x.ndim) if i not in red]


def _mean(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    dims, _ = _norm_dims(x, node.attr("dims"))
    xf = _up(ops, x)
    s = ops.sum(xf, dims=dims, keepdim=node.attr("keepdim"))
    return [_down(ops, ops.div(s, _count(x, dims)), x)]


def _var_mean(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    dims, kept = _norm_dims(x, node.attr("dims"))
    keep, n = node.attr("keepdim"), _count(x, dims)
    xf = _up(ops, x)
    mean = ops.div(ops.sum(xf, dims=dims), n)
    d = ops.sub(xf, _bcast(ops, mean, xf, kept))
    var = ops.div(ops.sum(ops.mul(d, d), dims=dims), n - node.attr("correction"))
    if keep:
        shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
        var, mean = (ops.broadcast_in_dim(t, shape=shape, broadcast_dims=kept) for t in (var, mean))
    return [_down(ops, var, x), _down(ops, mean, x)]


def _row_stat(ops: Ops, t: Tensor, like: Tensor) -> Tensor:
    return _bcast(ops, t, like, list(range(like.ndim - 1)))


def _affine(ops: Ops, y: Tensor, params: dict[str, Tensor]) -> Tensor:
    last = [y.ndim - 1]
    if "weight" in params:
        y = ops.mul(y, _bcast(ops, _up(ops, params["weight"]), y, last))
    if "bias" in params:
        y = ops.add(y, _bcast(ops, _up(ops, params["bias"]), y, last))
    return y


def _layer_norm(ops: Ops, node: Node, x: Tensor, *rest: Tensor) -> list[Tensor]:
    params = dict(zip(node.attr("params"), rest))
    last, n = x.ndim - 1, x.shape[-1]
    xf = _up(ops, x)
    mean = ops.div(ops.sum(xf, dims=[last]), n)
    d = ops.sub(xf, _row_stat(ops, mean, xf))
    var = ops.div(ops.sum(ops.mul(d, d), dims=[last]), n)
    rstd = ops.rsqrt(ops.add(var, node.attr("eps")))
    y = _affine(ops, ops.mul(d, _row_stat(ops, rstd, xf)), params)
    out = [_down(ops, y, x)]
    if node.attr("return_mean_rstd"):
        stat = list(x.shape[:-1]) + [1]
        kept = list(range(x.ndim - 1))
        out += [ops.broadcast_in_dim(t, shape=stat, broadcast_dims=kept) for t in (mean, rstd)]
    return out


def _rms_norm(ops: Ops, node: Node, x: Tensor, *rest: Tensor) -> list[Tensor]:
    params = dict(zip(node.attr("params"), rest))
    xf = _up(ops, x)
    ms = ops.div(ops.sum(ops.mul(xf, xf), dims=[x.ndim - 1]), x.shape[-1])
    rstd = ops.rsqrt(ops.add(ms, node.attr("eps")))
    y = _affine(ops, ops.mul(xf, _row_stat(ops, rstd, xf)), params)
    return [_down(ops, y, x)]


def _gelu(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    xf = _up(ops, x)
    if node.attr("approximate") == "tanh":
        inner = ops.mul(
            ops.add(xf, ops.mul(ops.mul(ops.mul(xf, xf), xf), 0.044715)), math.sqrt(2.0 / math.pi)
        )
        cdf = ops.add(ops.tanh(inner), 1.0)
    else:
        cdf = ops.add(ops.erf(ops.mul(xf, 1.0 / math.sqrt(2.0))), 1.0)
    return [_down(ops, ops.mul(ops.mul(xf, 0.5), cdf), x)]


def _softmax_parts(
    ops: Ops, node: Node, x: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, list[int]]:
    """(x in float, its max along dim, x - max, sum(exp(x - max))); and the kept dims."""
    dim = node.attr("dim") % max(x.ndim, 1)
    kept = [i for i in range(x.ndim) if i != dim]
    xf = _up(ops, x)
    top = ops.max(xf, dims=[dim])
    shifted = ops.sub(xf, _bcast(ops, top, xf, kept))
    total = ops.sum(ops.exp(shifted), dims=[dim])
    return xf, top, shifted, total, kept


def _softmax(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    xf, _, shifted, total, kept = _softmax_parts(ops, node, x)
    y = ops.div(ops.exp(shifted), _bcast(ops, total, xf, kept))
    return [_down(ops, y, x)]


def _safe_softmax(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    """softmax, except that a slice of only -inf along dim gives zeros: its max is -inf (a
    NaN anywhere makes the max NaN, so that slice stays NaN, as in ATen). The max and the
    sum are softmax's, so a looped kernel still takes them in one online pass; the NaN
    they give such a slice (-inf - -inf) is selected away, never stored."""
    xf, top, shifted, total, kept = _softmax_parts(ops, node, x)
    y = ops.div(ops.exp(shifted), _bcast(ops, total, xf, kept))
    masked = _bcast(ops, ops.eq(top, float("-inf")), xf, kept)
    return [_down(ops, ops.where(masked, 0.0, y), x)]


def _log_softmax(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    xf, _, shifted, total, kept = _softmax_parts(ops, node, x)
    y = ops.sub(shifted, _bcast(ops, ops.log(total), xf, kept))
    return [_down(ops, y, x)]


def _cross_entropy(ops: Ops, node: Node, logits: Tensor, target: Tensor) -> list[Tensor]:
    lf = _up(ops, logits)
    rowmax = ops.max(lf, dims=[1])
    shifted = ops.sub(lf, _bcast(ops, rowmax, lf, [0]))
    lse = ops.add(ops.log(ops.sum(ops.exp(shifted), dims=[1])), rowmax)
    # a target that matches no class would pick nothing and add 0: checked, as ATen does
    ignore = node.attr("ignore_index")
    target = ops.check_index(target, bound=lf.shape[1], ignore=ignore, what="target")
    cls = ops.iota(lf.shape, dim=1, dtype=target.value.dtype)
    hit = ops.eq(cls, _bcast(ops, target, lf, [0]))
    picked = ops.sum(ops.where(hit, lf, 0.0), dims=[1])
    valid = ops.ne(target, ignore)
    loss = ops.where(valid, ops.sub(lse, picked), 0.0)
    count = ops.sum(ops.cast(valid, lf.value.dtype), dims=[0])
    return [_down(ops, ops.div(ops.sum(loss, dims=[0]), count), logits)]


DECOMPOSITIONS: dict[Op, Callable[..., list[Tensor]]] = {
    Op.MEAN: _mean,
    Op.VAR_MEAN: _var_mean,
    Op.LAYER_NORM: _layer_norm,
    Op.RMS_NORM: _rms_norm,
    Op.GELU: _gelu,
    Op.SOFTMAX: _softmax,
    Op.LOG_SOFTMAX: _log_softmax,
    Op.SAFE_SOFTMAX: _safe_softmax,
    Op.CROSS_ENTROPY: _cross_entropy,
}
assert set(DECOMPOSITIONS) == COMPOSITE


def decompose(graph: Graph) -> Graph:
    """Replace every composite node by the primitives it is made of."""
    rw = Rewriter(graph, "decompose")
    for node in graph.nodes:
        if node.op in COMPOSITE:
            rw.replace(node, DECOMPOSITIONS[node.op](rw.ops, node, *rw.args(node)))
        else:
            rw.keep(node)
    return rw.finish()
