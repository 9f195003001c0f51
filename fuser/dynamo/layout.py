"""Lowerings of slice, cat, slice_backward and zero padding: index maps along the last dim.

A fused kernel reads through them (fuser/passes/views.py), so `rotate_half` (two slices,
a neg and a cat) and its backward (slices and slice_backward pads) join the
multiply-adds around them. Along other dims they stay ATen views or copies, except a cat
of one piece that holds something (a KV cache's first cat([empty past, k], dim=-2)): a
copy, which the region writes in the result's layout reading the piece through its own
strides.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

import fuser.dynamo.ce_op  # noqa: F401  (defines fuser::cross_entropy)
from fuser.dynamo.context import (
    LowerCtx,
    NotLowerable,
    arg,
    call_with_value,
    meta_of,
    out_meta,
    register,
    static_shape,
)

aten = torch.ops.aten
_CROSS_ENTROPY = torch.ops.fuser.cross_entropy.default


def _last_dim(node: fx.Node, dim: int, rank: int, what: str) -> int:
    d = dim % rank if rank else 0
    if rank == 0 or d != rank - 1:
        raise NotLowerable(
            f"{what} along dim {d} of a rank-{rank} tensor: only the last dim is an index "
            "map in a fused kernel, so it stays an ATen view or copy"
        )
    return d


def _bounds(start: Any, end: Any, size: int) -> tuple[int, int]:
    """Python slice bounds as ATen normalizes them: negatives from the end, clamped."""
    start = 0 if start is None else int(start)
    end = size if end is None else int(end)
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    return start, min(max(end, start), size)


def _whole(shape: list[int], dim: int, node: fx.Node, step: int) -> bool:
    """Whether a slice along `dim` keeps every element: the identity."""
    size = shape[dim % len(shape)]
    start, end = _bounds(arg(node, 2, "start"), arg(node, 3, "end"), size)
    return (start, end) == (0, size) and (step == 1 or size <= 1)


@register(aten.slice.Tensor, free=True)
def _slice(ctx: LowerCtx, node: fx.Node) -> Any:
    x = ctx.tensor(node.args[0])
    shape = [int(s) for s in x.shape]
    step = int(arg(node, 4, "step", 1))
    if shape and _whole(shape, arg(node, 1, "dim", 0), node, step):
        return ctx.finish(node, [x])  # along any dim: a KV cache's cat, its backward
    d = _last_dim(node, arg(node, 1, "dim", 0), len(shape), "slice")
    start, end = _bounds(arg(node, 2, "start"), arg(node, 3, "end"), shape[d])
    if node.users and all(u.target is _CROSS_ENTROPY for u in node.users):
        # pad_mm.py's logits: a strided view read by the row kernel as it is, with wide
        # aligned accesses; as an index map in the kernel it would split the kernel
        raise NotLowerable("a view of padded logits: the cross-entropy kernel reads it strided")
    return ctx.finish(node, [ctx.ops.slice(x, d, start, end, step)])


@register(aten.slice_backward.default)
def _slice_backward(ctx: LowerCtx, node: fx.Node) -> Any:
    g = ctx.tensor(node.args[0])
    sizes = [int(s) for s in node.args[1]]
    d = _last_dim(node, int(node.args[2]), len(sizes), "slice_backward")
    start, end = _bounds(node.args[3], node.args[4], sizes[d])
    if int(node.args[5]) != 1:
        raise NotLowerable("slice_backward with a step: fuser pads only contiguous ranges")
    if end - start != int(g.shape[d]):
        raise NotLowerable(f"slice_backward: {end - start} columns, the gradient has {g.shape[d]}")
    return ctx.finish(node, [ctx.ops.pad(g, d, start, sizes[d] - end)])


@register(aten.constant_pad_nd.default)
def _constant_pad(ctx: LowerCtx, node: fx.Node) -> Any:
    """Zeros added along the last dim only (pad_mm.py's padded lm-head gradient: the pad
    joins the kernel that makes the gradient instead of copying it again)."""
    x = ctx.tensor(node.args[0])
    pads = [int(p) for p in node.args[1]]
    value = arg(node, 2, "value", 0)
    if value not in (0, 0.0) or x.ndim == 0:
        raise NotLowerable(f"constant_pad_nd with value {value!r} (fuser pads with zeros)")
    if len(pads) % 2 or any(pads[2:]) or min(pads) < 0:
        raise NotLowerable("constant_pad_nd of a dim other than the last, or a negative pad")
    return ctx.finish(node, [ctx.ops.pad(x, x.ndim - 1, pads[0], pads[1])])


def _cat_pieces(node: fx.Node) -> list[fx.Node]:
    """The operands of a cat that hold something: ATen skips legacy empty [0] tensors
    (a KV cache's first step: cat([past, k], dim=-2) with no past) and pieces of no
    extent along the dim add nothing."""
    out = meta_of(node)
    d = arg(node, 1, "dim", 0) % max(out.dim(), 1)
    pieces = []
    for t in node.args[0]:
        v = meta_of(t)
        if list(v.shape) == [0] or (v.dim() == out.dim() and v.shape[d] == 0):
            continue
        pieces.append(t)
    return pieces


def drop_empty_pieces(graph: fx.Graph) -> int:
    """Take the pieces that hold nothing out of every cat (before partitioning), so that a
    fused cat does not take an empty tensor as an input (a fusion with one runs as ATen
    ops); the empty constant a cat alone used goes too. Returns how many cats changed."""
    changed = 0
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target is not aten.cat.default:
            continue
        keep = _cat_pieces(n)
        dropped = [t for t in n.args[0] if t not in keep]
        if not dropped or not keep:
            continue
        # ATen promotes over every piece, empty or not: where an empty one widens the
        # dtype (transformers' KV cache under autocast: an fp32 empty past, made from the
        # rotary embedding's fp32 keys, before bf16 values), the others are cast to it
        dtype = meta_of(n).dtype
        with graph.inserting_before(n):
            keep = [_cast_to(graph, t, dtype) for t in keep]
        n.args = (keep, *n.args[1:])
        changed += 1
        for t in dropped:
            if not t.users and t.target is aten.lift_fresh_copy.default:
                graph.erase_node(t)
    return changed


def _cast_to(graph: fx.Graph, t: fx.Node, dtype: torch.dtype) -> fx.Node:
    if meta_of(t).dtype == dtype:
        return t
    return call_with_value(graph, aten._to_copy.default, (t,), {"dtype": dtype})


@register(aten.cat.default)
def _cat(ctx: LowerCtx, node: fx.Node) -> Any:
    out = out_meta(node)
    shape = static_shape(out, node.name)
    # the pieces that hold something, in the result's dtype
    xs = [ctx.cast(ctx.tensor(t), out.dtype) for t in _cat_pieces(node)]
    if len(xs) == 1:  # a copy, whatever the dim: where the result is a region output in
        # another layout than its input, the region copies it (region.build_definition)
        return ctx.finish(node, xs)
    d = _last_dim(node, arg(node, 1, "dim", 0), len(shape), f"cat of {len(xs)} tensors")
    return ctx.finish(node, [ctx.ops.cat(xs, d)])
