"""Lowerings of the normalization, activation and loss ops, forward and backward.

Forward ops map onto fuser's composites (layer_norm, gelu, softmax, log_softmax,
safe_softmax); their backward ops are written here in fuser primitives, computing in
float32 as ATen does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from fuser.dynamo.context import LowerCtx, NotLowerable, arg, meta_of, register
from fuser.frontend.builder import Tensor

aten = torch.ops.aten


def _float(ctx: LowerCtx, node: fx.Node, what: str) -> Tensor:
    t = ctx.tensor(node)
    if not t.dtype.is_floating_point:
        raise NotLowerable(f"{what} has dtype {t.dtype}; expected a float")
    return t


def _rows(ctx: LowerCtx, t: Tensor, like: Tensor) -> Tensor:
    """A per-row value ([..., 1] or [...]) broadcast over the rows of `like`."""
    if t.ndim == like.ndim:  # keepdim form: the size-1 last dim expands
        return ctx.broadcast(t, like.shape, range(like.ndim))
    return ctx.broadcast(t, like.shape, range(like.ndim - 1))


def _cols(ctx: LowerCtx, t: Tensor, like: Tensor) -> Tensor:
    """A [C] value broadcast over the rows of `like`."""
    return ctx.broadcast(t, like.shape, [like.ndim - 1])


def _last_dim_only(node: fx.Node, normalized_shape: Any) -> None:
    if len(normalized_shape) != 1:
        raise NotLowerable(f"layer norm over {len(normalized_shape)} dims (fuser: the last dim)")


@register(aten.native_layer_norm.default)
def _layer_norm(ctx: LowerCtx, node: fx.Node) -> Any:
    x, shape, w, b, eps = node.args
    _last_dim_only(node, shape)
    xt = _float(ctx, x, "input")
    weight = _float(ctx, w, "weight") if w is not None else None
    bias = _float(ctx, b, "bias") if b is not None else None
    y, mean, rstd = ctx.ops.layer_norm(xt, weight, bias, eps=eps, return_mean_rstd=True)
    return ctx.finish(node, [y, mean, rstd])


@register(aten.native_layer_norm_backward.default)
def _layer_norm_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    go, x, shape, mean, rstd, w, b, mask = node.args
    _last_dim_only(node, shape)
    ops = ctx.ops
    xf, g = ctx.up(_float(ctx, x, "input")), ctx.up(_float(ctx, go, "grad"))
    n, last = int(xf.shape[-1]), xf.ndim - 1
    rstd_b = _rows(ctx, ctx.up(ctx.tensor(rstd)), xf)
    xhat = ops.mul(ops.sub(xf, _rows(ctx, ctx.up(ctx.tensor(mean)), xf)), rstd_b)
    wg = ops.mul(g, _cols(ctx, ctx.up(ctx.tensor(w)), xf)) if w is not None else g
    lead = list(range(last))
    dx = dw = db = None
    if mask[0]:
        c1 = ops.div(ops.sum(ops.mul(wg, xhat), dims=[last]), float(n))
        c2 = ops.div(ops.sum(wg, dims=[last]), float(n))
        inner = ops.sub(ops.sub(wg, ops.mul(xhat, _rows(ctx, c1, xf))), _rows(ctx, c2, xf))
        dx = ops.mul(rstd_b, inner)
    if mask[1] and w is not None:
        dw = ops.mul(g, xhat)
        dw = ops.sum(dw, dims=lead) if lead else dw
    if mask[2] and b is not None:
        db = ops.sum(g, dims=lead) if lead else g
    return ctx.finish(node, [dx, dw, db])


@register(aten.gelu.default)
def _gelu(ctx: LowerCtx, node: fx.Node) -> Any:
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    x = _float(ctx, node.args[0], "input")
    return ctx.finish(node, [ctx.ops.gelu(x, approximate=approximate)])


@register(aten.gelu_backward.default)
def _gelu_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    approximate = node.kwargs.get("approximate", node.args[2] if len(node.args) > 2 else "none")
    ops = ctx.ops
    g = ctx.up(_float(ctx, node.args[0], "grad"))
    x = ctx.up(_float(ctx, node.args[1], "input"))
    if approximate == "tanh":
        k, c = math.sqrt(2.0 / math.pi), 0.044715
        x2 = ops.mul(x, x)
        t = ops.tanh(ops.mul(ops.add(x, ops.mul(ops.mul(x2, x), c)), k))
        d_left = ops.mul(ops.add(t, 1.0), 0.5)
        d_inner = ops.mul(ops.add(ops.mul(x2, 3.0 * c), 1.0), k)
        d_right = ops.mul(ops.mul(ops.mul(x, 0.5), ops.sub(1.0, ops.mul(t, t))), d_inner)
        dydx = ops.add(d_left, d_right)
    elif approximate == "none":
        cdf = ops.mul(ops.add(ops.erf(ops.mul(x, math.sqrt(0.5))), 1.0), 0.5)
        pdf = ops.mul(ops.exp(ops.mul(ops.mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
        dydx = ops.add(cdf, ops.mul(x, pdf))
    else:
        raise NotLowerable(f"gelu approximate={approximate!r}")
    return ctx.finish(node, [ops.mul(g, dydx)])


def _softmax_input(ctx: LowerCtx, node: fx.Node) -> tuple[Tensor, int]:
    x, dim, half_to_float = node.args
    xt = _float(ctx, x, "input")
    return (ctx.cast(xt, torch.float32) if half_to_float else xt), dim  # type: ignore


@register(aten._softmax.default)
def _softmax(ctx: LowerCtx, node: fx.Node) -> Any:
    x, dim = _softmax_input(ctx, node)
    return ctx.finish(node, [ctx.ops.softmax(x, dim=dim)])


@register(aten._log_softmax.default)
def _log_softmax(ctx: LowerCtx, node: fx.Node) -> Any:
    x, dim = _softmax_input(ctx, node)
    return ctx.finish(node, [ctx.ops.log_softmax(x, dim=dim)])


@register(aten._safe_softmax.default)
def _safe_softmax(ctx: LowerCtx, node: fx.Node) -> Any:
    """What SDPA's math path and eager attention reach in current PyTorch: softmax, but a
    row of only -inf (a fully masked query) gives zeros. Its gradient is softmax's
    (_softmax_backward_data of its result), lowered above."""
    x = ctx.tensor(node.args[0])
    dtype = arg(node, 2, "dtype")
    if dtype is not None:
        x = ctx.cast(x, dtype)  # type: ignore[assignment]
    if not x.dtype.is_floating_point:
        raise NotLowerable(f"_safe_softmax of a {x.dtype} tensor; expected a float")
    return ctx.finish(node, [ctx.ops.safe_softmax(x, dim=arg(node, 1, "dim"))])


def _row_sum(ctx: LowerCtx, t: Tensor, dim: int) -> Tensor:
    """The sum over `dim`, kept; a 0-d tensor is its own sum (softmax of a scalar)."""
    return ctx.ops.sum(t, dims=[dim % t.ndim], keepdim=True) if t.ndim else t


@register(aten._softmax_backward_data.default)
def _softmax_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    go, out, dim = node.args[:3]
    ops = ctx.ops
    g, y = ctx.up(_float(ctx, go, "grad")), ctx.up(_float(ctx, out, "output"))
    dot = _row_sum(ctx, ops.mul(g, y), dim)
    return ctx.finish(node, [ops.mul(y, ops.sub(g, dot))])


@register(aten._log_softmax_backward_data.default)
def _log_softmax_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    go, out, dim = node.args[:3]
    ops = ctx.ops
    g, y = ctx.up(_float(ctx, go, "grad")), ctx.up(_float(ctx, out, "output"))
    total = _row_sum(ctx, g, dim)
    return ctx.finish(node, [ops.sub(g, ops.mul(ops.exp(y), total))])


# -- nll_loss: reduction 1 = mean, 2 = sum (torch's Reduction enum) -------------------
def _nll_check(ctx: LowerCtx, node: fx.Node, logp: Any, weight: Any, reduction: int) -> None:
    if weight is not None:
        raise NotLowerable("nll_loss with class weights")
    if reduction not in (1, 2):
        raise NotLowerable("nll_loss with reduction='none'")
    if meta_of(logp).dim() != 2:
        raise NotLowerable("nll_loss of a non-2D input (fuser: [rows, classes])")


def _target_hits(ctx: LowerCtx, shape: list, target: Tensor, ignore_index: int) -> tuple:
    """(target == class index, per [rows, classes]; target != ignore_index, per row)."""
    ops = ctx.ops
    if target.dtype not in (torch.int32, torch.int64):
        raise NotLowerable(f"nll_loss target of dtype {target.dtype}")
    # a target that matches no class would select nothing: checked, as ATen's nll_loss does
    target = ops.check_index(target, bound=shape[1], ignore=ignore_index, what="target")
    cls = ops.iota(shape, dim=1, dtype=target.dtype)
    hit = ops.eq(cls, ctx.broadcast(target, shape, [0]))
    valid = ops.ne(target, ctx.scalar(ignore_index, target.dtype))
    return hit, valid


@register(aten.nll_loss_forward.default)
def _nll_loss(ctx: LowerCtx, node: fx.Node) -> Any:
    logp, target, weight, reduction, ignore_index = node.args
    _nll_check(ctx, node, logp, weight, reduction)
    ops = ctx.ops
    lp = ctx.up(_float(ctx, logp, "input"))
    hit, valid = _target_hits(ctx, lp.shape, ctx.tensor(target), ignore_index)
    picked = ops.sum(ops.where(hit, lp, 0.0), dims=[1])
    loss = ops.where(valid, ops.neg(picked), 0.0)
    total = ops.sum(loss, dims=[0])
    count = ops.sum(ops.cast(valid, lp.dtype), dims=[0])
    out = ops.div(total, count) if reduction == 1 else total
    return ctx.finish(node, [out, count])


@register(aten.nll_loss_backward.default)
def _nll_loss_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    go, logp, target, weight, reduction, ignore_index, total_weight = node.args
    _nll_check(ctx, node, logp, weight, reduction)
    ops = ctx.ops
    lp_meta = meta_of(logp)
    shape = [int(s) for s in lp_meta.shape]
    g = ctx.up(_float(ctx, go, "grad"))
    if g.ndim:
        raise NotLowerable("nll_loss_backward with a non-scalar grad")
    scale = ops.neg(g)
    if reduction == 1:
        scale = ops.div(scale, ctx.up(ctx.tensor(total_weight)))
    hit, valid = _target_hits(ctx, shape, ctx.tensor(target), ignore_index)
    keep = ops.logical_and(hit, ctx.broadcast(valid, shape, [0]))
    return ctx.finish(node, [ops.where(keep, scale, 0.0)])


def _rms_parts(ctx: LowerCtx, x: Any, shape: Any, eps: Any) -> tuple[Tensor, float]:
    _last_dim_only(None, shape)  # type: ignore[arg-type]
    xt = _float(ctx, x, "input")
    return xt, float(torch.finfo(xt.dtype).eps) if eps is None else float(eps)


@register(aten._fused_rms_norm.default)
def _fused_rms_norm(ctx: LowerCtx, node: fx.Node) -> Any:
    """F.rms_norm as current PyTorch hands it over: (y, rstd), rstd [..., 1] in float32."""
    x, shape, w, eps = node.args
    xt, eps = _rms_parts(ctx, x, shape, eps)
    ops, xf = ctx.ops, ctx.up(xt)
    last = xf.ndim - 1
    ms = ops.div(ops.sum(ops.mul(xf, xf), dims=[last]), float(xf.shape[-1]))
    rstd = ops.rsqrt(ops.add(ms, eps))
    y = ops.mul(xf, _rows(ctx, rstd, xf))
    if w is not None:
        y = ops.mul(y, _cols(ctx, ctx.up(_float(ctx, w, "weight")), xf))
    stat = ctx.broadcast(rstd, list(xf.shape[:-1]) + [1], range(last))
    return ctx.finish(node, [y, stat])


@register(aten._fused_rms_norm_backward.default)
def _fused_rms_norm_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    go, x, shape, rstd, w, mask = node.args
    xt, _ = _rms_parts(ctx, x, shape, None)
    ops = ctx.ops
    xf, g = ctx.up(xt), ctx.up(_float(ctx, go, "grad"))
    last = xf.ndim - 1
    rstd_b = _rows(ctx, ctx.up(ctx.tensor(rstd)), xf)
    xhat = ops.mul(xf, rstd_b)
    wg = ops.mul(g, _cols(ctx, ctx.up(ctx.tensor(w)), xf)) if w is not None else g
    dx = dw = None
    if mask[0]:
        c = ops.div(ops.sum(ops.mul(wg, xhat), dims=[last]), float(xf.shape[-1]))
        dx = ops.mul(rstd_b, ops.sub(wg, ops.mul(xhat, _rows(ctx, c, xf))))
    if mask[1] and w is not None:
        lead = list(range(last))
        dw = ops.mul(g, xhat)
        dw = ops.sum(dw, dims=lead) if lead else dw
    return ctx.finish(node, [dx, dw])
