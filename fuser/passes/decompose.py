"""Decompose composites (layer_norm, softmax, gelu, ...) into primitives.

Each decomposition follows what ATen computes: half and bfloat16 inputs are upcast to
float32, the math runs in float32, and the result is rounded once to the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

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


class _Moments(NamedTuple):
    mean: Tensor  # over the reduced dims
    m2: Tensor  # the sum of squared deviations from the mean
    deviation: Tensor  # xf - guess, full shape: xf - mean is deviation - shift
    shift: Tensor  # mean - guess, over the reduced dims (before the NaN guard)


def _moments(ops: Ops, xf: Tensor, dims: tuple[int, ...], kept: list[int], n: object) -> _Moments:
    """Mean and squared deviations of `xf` over `dims`, by the corrected two-pass.

    A float32 sum of a constant row is not n * x (20480 copies of 734.5 round), so
    x - sum(x)/n is a few ulps, not 0, and a plain two-pass variance of a constant row
    is ~1e-6 where eager's Welford gives exactly 0 (then rstd is off by percents next to
    eps=1e-5). Here the first mean is a guess g; the second pass sums both d = x - g and
    d * d, which moves the mean to g + sum(d)/n (exactly x for a constant row: the sum
    of identical small d is exact, and g + d rounds to the representable x) and takes
    sum(d)^2/n off the squares (Chan, Golub and LeVeque's correction; 0 for a constant
    row). Same passes over the row as two-pass, one more sum in the second; more
    accurate for every row, not only constant ones. A caller that needs xf - mean takes
    d - sum(d)/n (x dies once d exists: a persistent row holds one copy in registers).
    """
    guess = ops.div(ops.sum(xf, dims=dims), n)
    d = ops.sub(xf, _bcast(ops, guess, xf, kept))
    s1 = ops.sum(d, dims=dims)
    s2 = ops.sum(ops.mul(d, d), dims=dims)
    shift = ops.div(s1, n)
    # a row holding an infinity: guess is +-inf, d NaN; keep torch.mean's inf as the mean
    mean = ops.add(guess, ops.where(ops.isnan(shift), 0.0, shift))
    # rounding may leave the difference a hair below 0; NaN stays NaN
    m2 = ops.maximum(ops.sub(s2, ops.mul(s1, shift)), 0.0)
    return _Moments(mean, m2, d, shift)


def _var_mean(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    dims, kept = _norm_dims(x, node.attr("dims"))
    keep, n = node.attr("keepdim"), _count(x, dims)
    mean, m2, _, _ = _moments(ops, _up(ops, x), dims, kept, n)
    var = ops.div(m2, n - node.attr("correction"))
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
    mean, m2, d, shift = _moments(ops, xf, (last,), list(range(last)), n)
    var = ops.div(m2, n)
    rstd = ops.rsqrt(ops.add(var, node.attr("eps")))
    # (d - shift) * rstd as d * rstd - shift * rstd: every row element then waits for
    # rstd, so the compiler cannot start on d - shift while the sum of squares is still
    # in flight and hold both (ptxas: 75 registers instead of 62 at H=16384, which
    # halved the blocks per SM). A constant row still gives exactly 0: d == shift.
    normalized = ops.sub(
        ops.mul(d, _row_stat(ops, rstd, xf)), _row_stat(ops, ops.mul(shift, rstd), xf)
    )
    y = _affine(ops, normalized, params)
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


def _softmax_parts(ops: Ops, node: Node, x: Tensor) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    dim = node.attr("dim") % max(x.ndim, 1)
    kept = [i for i in range(x.ndim) if i != dim]
    xf = _up(ops, x)
    shifted = ops.sub(xf, _bcast(ops, ops.max(xf, dims=[dim]), xf, kept))
    total = ops.sum(ops.exp(shifted), dims=[dim])
    return xf, shifted, total, kept


def _softmax(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    xf, shifted, total, kept = _softmax_parts(ops, node, x)
    y = ops.div(ops.exp(shifted), _bcast(ops, total, xf, kept))
    return [_down(ops, y, x)]


def _log_softmax(ops: Ops, node: Node, x: Tensor) -> list[Tensor]:
    xf, shifted, total, kept = _softmax_parts(ops, node, x)
    y = ops.sub(shifted, _bcast(ops, ops.log(total), xf, kept))
    return [_down(ops, y, x)]


def _cross_entropy(ops: Ops, node: Node, logits: Tensor, target: Tensor) -> list[Tensor]:
    lf = _up(ops, logits)
    rowmax = ops.max(lf, dims=[1])
    shifted = ops.sub(lf, _bcast(ops, rowmax, lf, [0]))
    lse = ops.add(ops.log(ops.sum(ops.exp(shifted), dims=[1])), rowmax)
    cls = ops.iota(lf.shape, dim=1, dtype=target.value.dtype)
    hit = ops.eq(cls, _bcast(ops, target, lf, [0]))
    picked = ops.sum(ops.where(hit, lf, 0.0), dims=[1])
    valid = ops.ne(target, node.attr("ignore_index"))
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
