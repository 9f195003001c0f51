"""Lowerings of ATen reductions: sum, mean, amax, amin, var_mean, var."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx

from fuser.dynamo.context import LowerCtx, NotLowerable, arg, compute_dtype, out_meta, register
from fuser.frontend.builder import Tensor

aten = torch.ops.aten


def reduce_dims(rank: int, dims: Any) -> list[int]:
    """ATen's dim argument as sorted non-negative dims (None or [] means every dim; a 0-d
    tensor's dim 0 or -1 means none: there is nothing to reduce)."""
    if rank == 0:
        return []
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % rank for d in dims})


def reduce(ctx: LowerCtx, name: str, x: Tensor, dims: list[int], keepdim: bool) -> Tensor:
    """`name` over `dims`, split into the two kinds of reduction fuser schedules.

    The segmenter fuses a reduction over the last dim (row) or over all leading dims
    (column); anything else that includes the last dim is done as the last dim first,
    then the rest, so each step is one of those two kinds.
    """
    if not dims:
        return x
    last = x.ndim - 1
    fn = getattr(ctx.ops, name)
    if last in dims and len(dims) > 1 and not keepdim:
        row = fn(x, dims=[last])
        return reduce(ctx, name, row, [d for d in dims if d != last], False)
    return fn(x, dims=dims, keepdim=keepdim)


@register(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default)
def _sum_mean(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    x = ctx.tensor(node.args[0])
    default = node.target in (aten.sum.default, aten.mean.default)
    dims = reduce_dims(x.ndim, None if default else arg(node, 1, "dim"))
    keepdim = False if default else bool(arg(node, 2, "keepdim", False))
    acc = torch.int64 if not out.dtype.is_floating_point else compute_dtype(out.dtype)
    if out.dtype == torch.bool:
        raise NotLowerable("sum with a bool result")
    total = reduce(ctx, "sum", ctx.cast(x, acc), dims, keepdim)  # type: ignore[arg-type]
    if node.target in (aten.mean.dim, aten.mean.default):
        count = math.prod(int(x.shape[d]) for d in dims)
        total = ctx.ops.div(total, ctx.scalar(count, acc))
    return ctx.finish(node, [total])


@register(aten.amax.default, aten.amin.default)
def _amax(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    x = ctx.tensor(node.args[0])
    if x.dtype == torch.bool:
        raise NotLowerable("amax/amin of a bool tensor")
    dims = reduce_dims(x.ndim, arg(node, 1, "dim"))
    keepdim = bool(arg(node, 2, "keepdim", False))
    name = "max" if node.target == aten.amax.default else "min"
    y = reduce(ctx, name, ctx.cast(x, compute_dtype(out.dtype)), dims, keepdim)  # type: ignore
    return ctx.finish(node, [y])


def _correction(node: fx.Node) -> int:
    c = node.kwargs.get("correction")
    c = 1 if c is None else c
    if c != int(c):
        raise NotLowerable(f"fractional correction {c}")
    return int(c)


@register(aten.var_mean.correction, aten.var.correction)
def _var_mean(ctx: LowerCtx, node: fx.Node) -> Any:
    x = ctx.up(ctx.tensor(node.args[0]))
    if not x.dtype.is_floating_point:
        raise NotLowerable(f"variance of a {x.dtype} tensor")
    dims = reduce_dims(x.ndim, arg(node, 1, "dim"))
    keepdim = bool(node.kwargs.get("keepdim", False))
    var, mean = ctx.ops.var_mean(x, dims=dims, correction=_correction(node), keepdim=keepdim)
    return ctx.finish(node, [var, mean] if node.target == aten.var_mean.correction else [var])
