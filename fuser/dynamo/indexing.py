"""Lowerings of indexed row reads: embedding and index_select along dim 0 (forward).

Both become gather_rows(table, index) (fuser/frontend/ops.py), whose index is checked
(an index outside [0, V) raises OutOfBoundsError) and whose table rows a kernel loads at
the rows the index names, fused with what consumes them (GPT-2's tok_emb + pos_emb and
the first LayerNorm). padding_idx and scale_grad_by_freq change only the backward;
embedding_dense_backward (a scatter-add) stays ATen until a deterministic segment- or
sort-based kernel lands (support.py says so in explain).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.dynamo.context import LowerCtx, NotLowerable, meta_of, register

aten = torch.ops.aten


def _table(ctx: LowerCtx, node: fx.Node, arg: Any) -> Any:
    table = ctx.tensor(arg)
    if table.ndim != 2:
        raise NotLowerable(
            f"{node.name}: table of shape {list(table.shape)}; gather_rows reads rows of a "
            "[V, H] table"
        )
    return table


def _gather(ctx: LowerCtx, node: fx.Node, table: Any, index: Any) -> Any:
    if index.dtype not in (torch.int32, torch.int64):
        raise NotLowerable(f"{node.name}: index of dtype {index.dtype}; expected int32/int64")
    out = ctx.ops.gather_rows(table, index)
    ctx.gathers[out.value.id] = (table, index)
    return ctx.finish(node, [out])


@register(aten.embedding.default)
def _embedding(ctx: LowerCtx, node: fx.Node) -> Any:
    # (weight, indices, padding_idx, scale_grad_by_freq, sparse): the last three only
    # change the backward
    table = _table(ctx, node, node.args[0])
    return _gather(ctx, node, table, ctx.tensor(node.args[1]))


@register(aten.index_select.default)
def _index_select(ctx: LowerCtx, node: fx.Node) -> Any:
    src, dim, index = node.args[:3]
    table = _table(ctx, node, src)
    if int(dim) % 2 != 0:
        raise NotLowerable(f"{node.name}: index_select along dim {dim}; only dim 0 lowers")
    idx = ctx.tensor(index)
    if idx.ndim != 1:
        raise NotLowerable(f"{node.name}: index of rank {idx.ndim}; index_select takes 1-D")
    meta_of(node)
    return _gather(ctx, node, table, idx)
