"""Lowerings of fuser::cross_entropy and fuser::cross_entropy_grad (ce_op.py).

The forward is one pass over each row of logits: the online max and sum of exp (fuser's
looped kernels pair them, fuser/schedulers/online.py), the loss of the row, and, in the
output pass, the gradient for an upstream gradient of 1 in the logits' dtype:

    grad = (softmax(x) - ((1 - eps) * onehot(t) + eps / V)) * scale(row)

with scale = 1/count for a mean (count: the targets that are not ignore_index, a sum over
all rows made by a small kernel before the row kernel and read there as a 0-d value, so
nothing waits on the host), 1 for a sum or 'none', and 0 on ignored rows. The logits are
upcast inside the kernel (never materialized in float32). The targets are checked as
nll_loss checks them (check_index): one out of range raises OutOfBoundsError.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

import fuser.dynamo.ce_op  # noqa: F401  (defines the ops registered here)
from fuser.dynamo.context import LowerCtx, NotLowerable, meta_of, register
from fuser.frontend.builder import Tensor

_OPS = torch.ops.fuser


def _rows(ctx: LowerCtx, t: Tensor, shape: list[int]) -> Tensor:
    return ctx.broadcast(t, shape, [0])


def _target(ctx: LowerCtx, node: fx.Node, bound: int, ignore: int) -> Tensor:
    t = ctx.tensor(node)
    if t.dtype not in (torch.int32, torch.int64):
        raise NotLowerable(f"cross_entropy target of dtype {t.dtype}")
    return ctx.ops.check_index(t, bound=bound, ignore=ignore, what="target")


def _column_and_target(ctx: LowerCtx, t: Tensor, shape: list[int]) -> tuple[Tensor, Tensor]:
    """The column index of each logit and the row's target, for the one-hot compare: in
    int32 where the row is shorter than 2**31 (a 64-bit compare of every logit costs
    twice the instructions), the target clamped to [-1, V] first so that no value out of
    range (ignore_index, or a bad one that check_index reports) wraps onto a column."""
    ops, v = ctx.ops, shape[1]
    if v >= 2**31 - 1:
        return ops.iota(shape, dim=1, dtype=t.dtype), _rows(ctx, t, shape)
    narrow = ops.cast(ops.minimum(ops.maximum(t, -1), v), torch.int32)
    return ops.iota(shape, dim=1, dtype=torch.int32), _rows(ctx, narrow, shape)


@register(_OPS.cross_entropy.default)
def _cross_entropy(ctx: LowerCtx, node: fx.Node) -> Any:
    # the seventh argument (aligned) sets the gradient's strides, which the region's
    # output layout carries out (fd.output_strides); nothing to lower here
    logits, target, reduction, ignore, smoothing, _upcast = node.args[:6]
    x = ctx.tensor(logits)
    if not x.dtype.is_floating_point or x.ndim != 2:
        raise NotLowerable(f"cross_entropy of {x.dtype} logits of rank {x.ndim}")
    ops = ctx.ops
    xf = ctx.up(x)
    shape = [int(s) for s in xf.shape]
    v = shape[1]
    t = _target(ctx, target, v, ignore)
    # the target's logit first: its last use of x comes before the exp-sum, so that a row
    # kept in registers holds one form of it across that reduction (x - max), not two
    hit = ops.eq(*_column_and_target(ctx, t, shape))
    picked = ops.sum(ops.where(hit, xf, 0.0), dims=[1])
    # the row's max and sum of exp: one online pass; lse = log(sum) + max
    m = ops.max(xf, dims=[1])
    shifted = ops.sub(xf, _rows(ctx, m, shape))
    e = ops.exp(shifted)
    s = ops.sum(e, dims=[1])
    log_s = ops.log(s)
    lse = ops.add(log_s, m)
    row = ops.sub(lse, picked)
    target_dist = ops.cast(hit, xf.dtype)
    if smoothing:
        # eager: (1 - eps) * nll + eps / V * sum_j -log p_j, with -sum log p = V*lse - sum x
        smooth = ops.sub(ops.mul(lse, float(v)), ops.sum(xf, dims=[1]))
        row = ops.add(ops.mul(row, 1.0 - smoothing), ops.mul(smooth, smoothing / v))
        target_dist = ops.add(ops.mul(target_dist, 1.0 - smoothing), smoothing / v)
    raw = ctx.tensor(target)
    # which targets count: from the unchecked targets, so that the count's kernel (a sum
    # over [N]) takes nothing of the [N, V] work with it. Defined after the row's work:
    # the segmenter merges groups in the order of their first node, and a count defined
    # first took the masking of the row losses below into its kernel, which then ran
    # after the row kernel; with float32 logits (no upcast node to start the row's group
    # first) the gradient's division by the count became a kernel of its own, a [N, V]
    # float32 round trip through memory
    valid = ops.ne(raw, ctx.scalar(ignore, raw.dtype))
    count = ops.sum(ops.cast(valid, xf.dtype), dims=[0]) if reduction == 1 else None
    row = ops.where(valid, row, 0.0)
    # softmax as eager's log_softmax backward makes it, exp((x - max) - log(sum)): no
    # division per element (exp(x - max) / sum cost a correctly rounded division of every
    # logit), and x - max first, as eager rounds it (x - lse loses ulp(max) of large logits)
    prob = ops.exp(ops.sub(shifted, _rows(ctx, log_s, shape)))
    grad = ops.sub(prob, target_dist)
    if reduction == 1:  # mean over the valid targets: 0/0 = nan when there are none
        loss = ops.div(ops.sum(row, dims=[0]), count)
        # eager scales by the upstream gradient over the count, divided once: so here
        grad = ops.mul(grad, ctx.broadcast(ops.reciprocal(count), shape, []))
    elif reduction == 2:
        loss = ops.sum(row, dims=[0])
    elif reduction == 0:
        loss = row
    else:
        raise NotLowerable(f"cross_entropy reduction {reduction}")
    grad = ops.where(_rows(ctx, valid, shape), grad, 0.0)
    return ctx.finish(node, [loss, grad])


@register(_OPS.cross_entropy_grad.default)
def _cross_entropy_grad(ctx: LowerCtx, node: fx.Node) -> Any:
    grad, upstream = node.args
    g = ctx.tensor(grad)
    u = ctx.up(ctx.tensor(upstream))
    shape = [int(s) for s in g.shape]
    if u.ndim == 1:
        u = _rows(ctx, u, shape)
    elif u.ndim == 0:
        u = ctx.broadcast(u, shape, [])
    else:
        raise NotLowerable(f"an upstream gradient of rank {u.ndim}")
    out = ctx.ops.mul(ctx.up(g), u)
    if meta_of(node).dtype != g.dtype:
        raise NotLowerable("cross_entropy_grad changes the dtype")
    return ctx.finish(node, [out])
