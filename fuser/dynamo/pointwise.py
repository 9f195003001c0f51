"""Lowerings of elementwise ATen ops, casts, and the views fuser IR can express."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.dynamo.context import (
    LowerCtx,
    NotLowerable,
    arg,
    compute_dtype,
    meta_of,
    out_meta,
    register,
    static_shape,
)
from fuser.frontend.builder import Tensor

aten = torch.ops.aten
prims = torch.ops.prims

UNARY = {
    aten.neg.default: "neg",
    aten.abs.default: "abs",
    aten.exp.default: "exp",
    aten.exp2.default: "exp2",
    aten.log.default: "log",
    aten.log2.default: "log2",
    aten.log1p.default: "log1p",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.reciprocal.default: "reciprocal",
    aten.tanh.default: "tanh",
    aten.erf.default: "erf",
    aten.sigmoid.default: "sigmoid",
    aten.relu.default: "relu",
    aten.sin.default: "sin",
    aten.cos.default: "cos",
    aten.floor.default: "floor",
    aten.ceil.default: "ceil",
}
PREDICATES = {aten.logical_not.default: "logical_not", aten.isnan.default: "isnan"}
ARITH = {
    aten.add.Tensor: "add",
    aten.add.Scalar: "add",
    aten.sub.Tensor: "sub",
    aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul",
    aten.mul.Scalar: "mul",
    aten.div.Tensor: "div",
    aten.div.Scalar: "div",
    aten.maximum.default: "maximum",
    aten.minimum.default: "minimum",
    aten.pow.Tensor_Tensor: "pow",
    aten.pow.Scalar: "pow",
}
COMPARE = {
    **{getattr(aten, n).Tensor: n for n in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{getattr(aten, n).Scalar: n for n in ("eq", "ne", "lt", "le", "gt", "ge")},
}
LOGICAL = {aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or"}


def _probe(x: Any) -> Any:
    """A stand-in with the dtype and the scalar-ness of an operand, for torch.result_type."""
    if isinstance(x, fx.Node):
        m = meta_of(x)
        return torch.empty((1,) if m.dim() else (), dtype=m.dtype)
    return x


def result_type(*args: Any) -> torch.dtype:
    return torch.result_type(*[_probe(a) for a in args]) if len(args) == 2 else _probe(args[0])


@register(*UNARY)
def _unary(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    x = ctx.cast(ctx.tensor(node.args[0]), compute_dtype(out.dtype))
    return ctx.finish(node, [getattr(ctx.ops, UNARY[node.target])(x)])


@register(*PREDICATES)
def _predicate(ctx: LowerCtx, node: fx.Node) -> Any:
    return ctx.finish(node, [getattr(ctx.ops, PREDICATES[node.target])(ctx.tensor(node.args[0]))])


@register(*ARITH)
def _arith(ctx: LowerCtx, node: fx.Node) -> Any:
    name = ARITH[node.target]
    out = out_meta(node)
    dtype = compute_dtype(out.dtype)
    a, b = (ctx.expand_to(ctx.cast(ctx.operand(x), dtype), out.shape) for x in node.args[:2])
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        b = ctx.ops.mul(b, ctx.scalar(alpha, dtype))
    if rounding := node.kwargs.get("rounding_mode"):
        raise NotLowerable(f"div with rounding_mode={rounding!r}")
    return ctx.finish(node, [getattr(ctx.ops, name)(a, b)])


@register(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    dtype = compute_dtype(out.dtype)
    a, b = (ctx.expand_to(ctx.cast(ctx.operand(x), dtype), out.shape) for x in node.args[:2])
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        a = ctx.ops.mul(a, ctx.scalar(alpha, dtype))
    return ctx.finish(node, [ctx.ops.sub(b, a)])


@register(aten.div.Tensor_mode)
def _div_mode(ctx: LowerCtx, node: fx.Node) -> Any:
    if node.kwargs.get("rounding_mode") is not None:
        raise NotLowerable(f"div with rounding_mode={node.kwargs['rounding_mode']!r}")
    return _arith_like(ctx, node, "div")


def _arith_like(ctx: LowerCtx, node: fx.Node, name: str) -> Any:
    out = out_meta(node)
    dtype = compute_dtype(out.dtype)
    a, b = (ctx.expand_to(ctx.cast(ctx.operand(x), dtype), out.shape) for x in node.args[:2])
    return ctx.finish(node, [getattr(ctx.ops, name)(a, b)])


@register(aten.pow.Tensor_Scalar)
def _pow_scalar(ctx: LowerCtx, node: fx.Node) -> Any:
    # the exponents ATen special-cases (pow_tensor_scalar_optimized_kernel), done the same way
    dtype = compute_dtype(out_meta(node).dtype)
    x = ctx.cast(ctx.tensor(node.args[0]), dtype)
    e, ops = node.args[1], ctx.ops
    special = {
        1: lambda: x,
        2: lambda: ops.mul(x, x),
        3: lambda: ops.mul(ops.mul(x, x), x),
        0.5: lambda: ops.sqrt(x),
        -0.5: lambda: ops.rsqrt(x),
        -1: lambda: ops.reciprocal(x),
        -2: lambda: ops.reciprocal(ops.mul(x, x)),
    }
    if isinstance(e, (int, float)) and not isinstance(e, bool) and e in special:
        if not dtype.is_floating_point and e < 0:
            raise NotLowerable("integer pow with a negative exponent")
        return ctx.finish(node, [special[e]()])
    return ctx.finish(node, [ops.pow(x, ctx.scalar(e, dtype))])


def _operands(ctx: LowerCtx, node: fx.Node, args: Any) -> tuple[list[Any], torch.dtype]:
    """Each operand in the result's compute dtype, broadcast to the result's shape."""
    out = out_meta(node)
    dtype = compute_dtype(out.dtype)
    return [ctx.expand_to(ctx.cast(ctx.operand(x), dtype), out.shape) for x in args], dtype


# addcmul, addcdiv and lerp are lowered, not decomposed: torch's decompositions round
# each step to a half type (addcdiv in bf16 was 0.17 off eager, which rounds once)
@register(aten.addcmul.default, aten.addcdiv.default)
def _addc(ctx: LowerCtx, node: fx.Node) -> Any:
    (x, t1, t2), dtype = _operands(ctx, node, node.args[:3])
    value = node.kwargs.get("value", 1)
    ops = ctx.ops
    if value != 1:
        t1 = ops.mul(ctx.scalar(value, dtype), t1)  # ATen's order: value * t1 op t2
    prod = ops.mul(t1, t2) if node.target == aten.addcmul.default else ops.div(t1, t2)
    return ctx.finish(node, [ops.add(x, prod)])


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx: LowerCtx, node: fx.Node) -> Any:
    """ATen's lerp (Lerp.h): from the nearer end, so weight 1 gives `end` exactly."""
    (start, end, w), dtype = _operands(ctx, node, node.args[:3])
    ops = ctx.ops
    diff = ops.sub(end, start)
    near = ops.add(start, ops.mul(w, diff))
    far = ops.sub(end, ops.mul(diff, ops.sub(ctx.scalar(1, dtype), w)))
    weight = node.args[2]
    if not isinstance(weight, fx.Node):  # a Python number: the branch is known now
        return ctx.finish(node, [near if abs(weight) < 0.5 else far])
    small = ops.lt(ops.abs(w), ctx.scalar(0.5, dtype))
    return ctx.finish(node, [ops.where(small, near, far)])


@register(*COMPARE)
def _compare(ctx: LowerCtx, node: fx.Node) -> Any:
    common = result_type(*node.args[:2])
    dtype = compute_dtype(common)
    ops_in = []
    for x in node.args[:2]:
        v = ctx.operand(x)
        if not isinstance(v, Tensor) and common.is_floating_point:
            v = torch.tensor(v, dtype=common).item()  # ATen rounds the scalar to `common`
        ops_in.append(ctx.expand_to(ctx.cast(v, dtype), out_meta(node).shape))
    return ctx.finish(node, [getattr(ctx.ops, COMPARE[node.target])(*ops_in)])


@register(*LOGICAL)
def _logical(ctx: LowerCtx, node: fx.Node) -> Any:
    """ATen's logical ops take any dtype as x != 0 (NaN is true)."""
    shape = out_meta(node).shape
    ops_in = []
    for x in node.args[:2]:
        t = ctx.tensor(x)
        if t.dtype != torch.bool:
            t = ctx.ops.ne(t, ctx.scalar(0, t.dtype))
        ops_in.append(ctx.expand_to(t, shape))
    return ctx.finish(node, [getattr(ctx.ops, LOGICAL[node.target])(*ops_in)])


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)  # selection is exact: no need for the compute dtype
    cond = ctx.expand_to(ctx.tensor(node.args[0]), out.shape)
    a, b = (ctx.expand_to(ctx.cast(ctx.operand(x), out.dtype), out.shape) for x in node.args[1:3])
    return ctx.finish(node, [ctx.ops.where(cond, a, b)])


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    x = ctx.expand_to(ctx.cast(ctx.tensor(node.args[0]), out.dtype), out.shape)
    mask = ctx.expand_to(ctx.tensor(node.args[1]), out.shape)
    value = ctx.expand_to(ctx.cast(ctx.operand(node.args[2]), out.dtype), out.shape)
    return ctx.finish(node, [ctx.ops.where(mask, value, x)])


@register(
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.clamp_min.default,
    aten.clamp_min.Tensor,
    aten.clamp_max.default,
    aten.clamp_max.Tensor,
)
def _clamp(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    dtype = compute_dtype(out.dtype)
    x = ctx.expand_to(ctx.cast(ctx.tensor(node.args[0]), dtype), out.shape)
    if node.target in (aten.clamp_min.default, aten.clamp_min.Tensor):
        lo, hi = node.args[1], None
    elif node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, node.args[1]
    else:
        lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    if lo is not None:
        x = ctx.ops.maximum(x, ctx.expand_to(ctx.cast(ctx.operand(lo), dtype), out.shape))
    if hi is not None:
        x = ctx.ops.minimum(x, ctx.expand_to(ctx.cast(ctx.operand(hi), dtype), out.shape))
    return ctx.finish(node, [x])


# -- casts and identities ------------------------------------------------------------
@register(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(ctx: LowerCtx, node: fx.Node) -> Any:
    x_meta, out = meta_of(node.args[0]), out_meta(node)
    if out.device != x_meta.device:
        raise NotLowerable(f"copy from {x_meta.device} to {out.device}")
    if node.kwargs.get("layout") not in (None, torch.strided):
        raise NotLowerable(f"copy to layout {node.kwargs['layout']}")
    return ctx.finish(node, [ctx.tensor(node.args[0])])


@register(aten.clone.default, aten.alias.default, free=True)
def _identity(ctx: LowerCtx, node: fx.Node) -> Any:
    return ctx.finish(node, [ctx.tensor(node.args[0])])


# -- views that are broadcasts ---------------------------------------------------------
def expand_dims(src: list[int], dst: list[int]) -> list[int] | None:
    """numpy broadcasting of `src` to `dst`: where each dim of `src` lands, or None."""
    lead = len(dst) - len(src)
    if lead < 0 or not all(s in (1, d) for s, d in zip(src, dst[lead:])):
        return None
    return list(range(lead, len(dst)))


def inserted_dims(src: list[int], dst: list[int]) -> list[int] | None:
    """Where each dim of `src` lands when `dst` is `src` with size-1 dims inserted, or None."""
    dims, j = [], 0
    for i, d in enumerate(dst):
        if j < len(src) and src[j] == d:
            dims.append(i)
            j += 1
        elif d != 1:
            return None
    return dims if j == len(src) else None


@register(
    aten.expand.default,
    aten.unsqueeze.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    free=True,
)
def _view(ctx: LowerCtx, node: fx.Node) -> Any:
    x = ctx.tensor(node.args[0])
    src = [int(s) for s in x.shape]
    dst = static_shape(out_meta(node), node.name)
    if src == dst:
        return ctx.finish(node, [x])
    expand = node.target == aten.expand.default
    dims = expand_dims(src, dst) if expand else inserted_dims(src, dst)
    if dims is None:
        raise NotLowerable(
            "a reshape: fuser IR only inserts and broadcasts dims, so it stays an ATen view (free)"
        )
    return ctx.finish(node, [ctx.broadcast(x, dst, dims)])


# -- constants -----------------------------------------------------------------------
@register(aten.full.default, free=True)
def _full(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    value = ctx.scalar(node.args[1], out.dtype)
    shape = static_shape(out, node.name)
    y = ctx.broadcast(value, shape, []) if shape else value
    return ctx.finish(node, [y])


@register(aten.scalar_tensor.default, free=True)
def _scalar_tensor(ctx: LowerCtx, node: fx.Node) -> Any:
    return ctx.finish(node, [ctx.scalar(node.args[0], out_meta(node).dtype)])
