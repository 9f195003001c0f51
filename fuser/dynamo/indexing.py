"""Indexed rows in torch.compile graphs: reads (embedding, index_select) and their
backward, the scatter-add (embedding_dense_backward, index_add, index_put with accumulate).

Reads become gather_rows(table, index) (fuser/frontend/ops.py), whose index is checked
(an index outside [0, V) raises OutOfBoundsError) and whose table rows a kernel loads at
the rows the index names, fused with what consumes them (GPT-2's tok_emb + pos_emb and
the first LayerNorm). padding_idx and scale_grad_by_freq change only the backward.

Scatter-adds are not region ops: `lower_scatters` (called by lower.prepare, as the
attention template is) makes each one it takes a call of fuser's row scatter-add kernel
(runtime/scatter.py: sorted and deterministic by default, FUSER_SCATTER=atomic for fp32
atomics), keeping the node, its arguments' order and its result; explain lists each with
its plan, and each one left to ATen with the reason.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.config import config
from fuser.dynamo.context import LowerCtx, NotLowerable, meta_of, register
from fuser.runtime.scatter import FLOATS, plan_for, scatter_add_rows
from fuser.runtime.triton_backend import device_problem
from fuser.schedulers.scatter import ScatterPlan

aten = torch.ops.aten
META = "fuser_scatter"


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


# -- scatter-adds ------------------------------------------------------------------------
class ScatterCall:
    """FX target replacing a scatter-add node: the same arguments, the same result."""

    def __init__(self, kind: str, plan: ScatterPlan, note: str):
        self.kind, self.plan, self.note = kind, plan, note
        self.__name__ = f"fuser_{kind}"

    def __call__(self, *args: Any) -> torch.Tensor:
        how = self.plan.mode
        if self.kind == "embedding_backward":
            grad, indices, num_weights, padding_idx, by_freq = args
            pad = None if padding_idx < 0 else int(padding_idx)
            return scatter_add_rows(
                grad, indices, int(num_weights), padding_idx=pad, scale_by_freq=by_freq, how=how
            )
        if self.kind == "index_add":
            base, index, src, alpha = args
            return scatter_add_rows(src, index, base.shape[0], base=base, alpha=alpha, how=how)
        base, index, src = args  # index_put with accumulate
        return scatter_add_rows(src, index, base.shape[0], base=base, how=how)

    def __repr__(self) -> str:
        return f"ScatterCall({self.kind}, {self.plan.name})"


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, fx.Node) else None


def _static_int(x: Any) -> int | None:
    """x as an int: an int, or a node whose traced value is one; None otherwise."""
    v = _val(x) if isinstance(x, fx.Node) else x
    return v if type(v) is int else None


def _concrete(*vals: Any) -> str | None:
    for v in vals:
        if not isinstance(v, torch.Tensor):
            return "no traced shape"
        if not all(isinstance(d, int) for d in v.shape):
            return "symbolic sizes (lowered again for each concrete size)"
    return None


def _common(src: Any, index: Any, out: Any) -> str | None:
    """Why the kernel cannot take this scatter-add, or None."""
    why = _concrete(src, index, out)
    if why:
        return why
    if index.dtype not in (torch.int32, torch.int64):
        return f"an index of dtype {index.dtype} (the kernel takes int32/int64)"
    if src.dtype not in FLOATS or out.dtype not in FLOATS:
        return f"{src.dtype} rows (the kernel adds floating-point rows)"
    if out.dim() != 2:
        return f"a result of rank {out.dim()} (the kernel writes [V, H] rows)"
    return device_problem(out.device.type)


def _embedding_backward(n: fx.Node) -> tuple[str, tuple, Any] | str:
    grad, indices, num_weights, padding_idx, by_freq = (list(n.args) + [None] * 5)[:5]
    g, i, out = _val(grad), _val(indices), _val(n)
    why = _common(g, i, out)
    if why:
        return why
    if g.dim() < 1 or g.shape[:-1].numel() != i.numel():
        return f"grad {list(g.shape)} does not hold one row per index {list(i.shape)}"
    rows, padding = _static_int(num_weights), _static_int(padding_idx)
    if rows is None or (padding_idx is not None and padding is None):
        # a size node a run-time specialization has not made a constant (lower._fold_sizes)
        return "num_weights or padding_idx is not a constant (dynamic shapes)"
    pad = None if padding is None or padding < 0 else padding
    plan = plan_for(g, i, rows, out.dtype, bool(by_freq), pad, how=config.scatter)
    return "embedding_backward", (grad, indices, num_weights, padding_idx, bool(by_freq)), plan


def _index_add(n: fx.Node) -> tuple[str, tuple, Any] | str:
    base, dim, index, src = n.args[:4]
    alpha = n.kwargs.get("alpha", n.args[4] if len(n.args) > 4 else 1)
    b, i, s, out = _val(base), _val(index), _val(src), _val(n)
    why = _common(s, i, out)
    if why:
        return why
    if (
        int(dim) % out.dim() != 0
        or i.dim() != 1
        or s.dim() != 2
        or s.shape != (i.numel(), out.shape[1])
    ):
        return "index_add along a dim other than 0, or not [V, H] rows from [N, H] at a 1-D index"
    if isinstance(alpha, fx.Node) or not isinstance(alpha, (int, float)):
        return "a traced alpha"
    plan = plan_for(
        s, i, out.shape[0], b.dtype, has_base=True, alpha=float(alpha), how=config.scatter
    )
    return "index_add", (base, index, src, float(alpha)), plan


def _index_put(n: fx.Node) -> tuple[str, tuple, Any] | str:
    base, indices, values = n.args[:3]
    accumulate = n.kwargs.get("accumulate", n.args[3] if len(n.args) > 3 else False)
    if not accumulate:
        return "index_put without accumulate: a plain store, stays ATen"
    if not isinstance(indices, (list, tuple)) or len(indices) != 1 or indices[0] is None:
        return "index_put with more than one index tensor (the kernel takes rows at one index)"
    b, i, v, out = _val(base), _val(indices[0]), _val(values), _val(n)
    why = _common(v, i, out)
    if why:
        return why
    if i.dim() != 1 or v.dim() != 2 or tuple(v.shape) != (i.numel(), out.shape[1]):
        return "index_put(accumulate) that is not [N, H] rows added at a 1-D index of [V, H]"
    plan = plan_for(v, i, out.shape[0], b.dtype, has_base=True, how=config.scatter)
    return "index_put", (base, indices[0], values), plan


SCATTERS = {
    aten.embedding_dense_backward.default: ("embedding backward", _embedding_backward),
    aten.index_add.default: ("index_add", _index_add),
    aten.index_put.default: ("index_put", _index_put),
}


def lower_scatters(gm: fx.GraphModule) -> list[str]:
    """Make each scatter-add of `gm` the kernel takes a call of it; one note per
    scatter-add (taken, with its plan, or left to ATen, with the reason)."""
    notes = []
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in SCATTERS:
            continue
        what, rule = SCATTERS[n.target]
        got = rule(n)
        if isinstance(got, str):
            n.meta[META] = f"{what}: stays ATen: {got}"
            notes.append(f"{what} {n.name}: stays ATen: {got}")
            continue
        kind, args, plan = got
        note = f"{what} {n.name} ({plan.shape.line()}): {plan.line()}"
        n.meta[META] = f"{what}: fuser's {plan.line()}"
        n.target, n.args, n.kwargs = ScatterCall(kind, plan, note), args, {}
        notes.append(note)
    if any(isinstance(n.target, ScatterCall) for n in gm.graph.nodes):
        gm.recompile()
    return notes
