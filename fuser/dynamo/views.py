"""Move row views out of the way of fusion, on the FX graph, before partitioning.

A "row view" reshapes the leading dims and keeps the last one ([B, T, C] <-> [B*T, C]).
fuser IR has no reshape, so a row view between two fusible ops splits their region; but
the kernels' [rows, cols] iteration space is the same on both sides of it. Two rewrites
take such views out of the middle:

- a reduction over all leading dims of a row view reduces the source instead:
  sum(view(x, [N, C]), [0]) -> view(sum(x, [0, 1]), ...)   (bias gradients)
- an elementwise op whose full-shape tensor operands are row views of same-shaped sources
  (or contiguous tensors, viewed the same way) runs on the sources, and its result is
  viewed instead:
  gelu_backward(view(a), view(b)) -> view(gelu_backward(a, b))
  when that helps: a source is itself fusible (the op joins its region), or the result
  reaches, through elementwise ops, a view back (they cancel) or a foldable reduction

and chains of views collapse (view(view(x)) -> view(x), or x when the shapes agree).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.dynamo import pointwise
from fuser.dynamo.context import LOWERINGS
from fuser.dynamo.reductions import reduce_dims

aten = torch.ops.aten
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default}
ELEMENTWISE = (
    set(pointwise.UNARY)
    | set(pointwise.PREDICATES)
    | set(pointwise.ARITH)
    | set(pointwise.COMPARE)
    | set(pointwise.LOGICAL)
    | {aten.gelu.default, aten.gelu_backward.default, aten.clone.default, aten.alias.default}
    | {aten._to_copy.default, torch.ops.prims.convert_element_type.default}
    # the elementwise ops pointwise.py lowers one by one (a chain of them, a GELU written
    # out as transformers' NewGELU does, was split at every row view it crossed)
    | {aten.rsub.Scalar, aten.rsub.Tensor, aten.pow.Tensor_Scalar, aten.div.Tensor_mode}
    | {aten.addcmul.default, aten.addcdiv.default, aten.lerp.Scalar, aten.lerp.Tensor}
    | {aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar}
    | {aten.masked_fill.Scalar, aten.masked_fill.Tensor}
    | {aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor}
    | {aten.clamp_max.default, aten.clamp_max.Tensor}
)


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _shape(n: fx.Node) -> list | None:
    v = _val(n)
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def is_row_view(n: Any) -> bool:
    """A view whose input and output share the last dim (only leading dims change)."""
    if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target in VIEWS):
        return False
    src, dst = _shape(n.args[0]), _shape(n)
    return bool(src and dst and src[-1] == dst[-1] and src != dst)


def _contiguous(n: fx.Node) -> bool:
    v = _val(n)
    return isinstance(v, torch.Tensor) and v.is_contiguous()


def _view(graph: fx.Graph, x: fx.Node, shape: list) -> fx.Node:
    if _shape(x) == shape:
        return x
    # reshape, not view: if x ends up an ATen result with other strides, it still works
    v = graph.call_function(aten.reshape.default, (x, shape))
    v.meta["val"] = _val(x).reshape(shape)
    return v


def _fold_reduction(graph: fx.Graph, n: fx.Node) -> bool:
    v = n.args[0]
    if not is_row_view(v) or len(n.args) < 2 or n.kwargs.get("dtype") is not None:
        return False
    rank, src = len(_shape(v)), v.args[0]
    if reduce_dims(rank, n.args[1]) != list(range(rank - 1)) or rank < 2:
        return False
    src_rank = len(_shape(src))
    keepdim = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
    dims = list(range(src_rank - 1))
    with graph.inserting_before(n):
        r = graph.call_function(n.target, (src, dims, keepdim))
        r.meta["val"] = n.target(_val(src), dims, keepdim)
        out = _view(graph, r, _shape(n))
    n.replace_all_uses_with(out)
    graph.erase_node(n)
    return True


def _sink_through(graph: fx.Graph, n: fx.Node, helps: set) -> bool:
    """Run elementwise n on its row views' sources (see the module docstring)."""
    out_shape = _shape(n)
    tensors = [a for a in n.args if isinstance(a, fx.Node)]
    if not out_shape or not tensors or any(isinstance(a, (list, tuple)) for a in n.args):
        return False
    full = [a for a in tensors if _shape(a) == out_shape]
    views = [a for a in full if is_row_view(a)]
    # an operand of the full shape that is not a row view is viewed like the others (a
    # free reshape when it is contiguous: the zero gradient autograd gives an unused
    # output, added to the cross-entropy's)
    plain = [a for a in full if a not in views]
    if not views or not all(_contiguous(a) for a in plain):
        return False
    src_shape = _shape(views[0].args[0])
    if any(_shape(a.args[0]) != src_shape for a in views):
        return False
    # other tensor operands must broadcast the same way against both shapes
    for a in tensors:
        if a not in full and len(_shape(a) or [0, 0]) > 1:
            return False
    fusible_source = any(a.args[0].target in LOWERINGS for a in views)
    if not (fusible_source or n in helps):
        return False
    back = [u for u in n.users if is_row_view(u) and _shape(u) == src_shape]

    def fake(a: Any) -> Any:
        if a in views:
            return _val(a.args[0])
        if a in plain:
            return _val(a).reshape(src_shape)
        return _val(a) if isinstance(a, fx.Node) else a

    try:
        val = n.target(*[fake(a) for a in n.args], **n.kwargs)
    except Exception:
        return False
    with graph.inserting_before(n):
        args = tuple(
            a.args[0] if a in views else _view(graph, a, src_shape) if a in plain else a
            for a in n.args
        )
        m = graph.call_function(n.target, args, dict(n.kwargs))
        m.meta["val"] = val
        shaped = _view(graph, m, out_shape)
    for u in back:
        u.replace_all_uses_with(m)
        graph.erase_node(u)
    n.replace_all_uses_with(shaped)
    graph.erase_node(n)
    return True


def _collapse(graph: fx.Graph, n: fx.Node) -> bool:
    """view(view(x)) -> view(x), or x itself when the shapes agree."""
    inner = n.args[0]
    if not (isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target in VIEWS):
        return False
    src = inner.args[0]
    if _shape(src) == _shape(n):
        n.replace_all_uses_with(src)
    else:
        with graph.inserting_before(n):
            v = _view(graph, src, _shape(n))
        n.replace_all_uses_with(v)
    graph.erase_node(n)
    return True


def _helped(graph: fx.Graph) -> set:
    """Elementwise nodes whose result reaches, through elementwise ops, a row view or a
    reduction over the leading dims of a row view: moving a view below them pays off."""
    helps: set = set()
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and n.target in ELEMENTWISE:
            for u in n.users:
                if is_row_view(u) or (u.target in ELEMENTWISE and u in helps):
                    helps.add(n)
                    break
    return helps


def sink_row_views(graph: fx.Graph) -> int:
    """Apply the rewrites in program order; returns how many were made."""
    made = 0
    helps = _helped(graph)
    for n in list(graph.nodes):
        if n.op != "call_function" or getattr(n, "_erased", False):
            continue
        if n.target in REDUCTIONS:
            made += _fold_reduction(graph, n)
        elif n.target in ELEMENTWISE:
            made += _sink_through(graph, n, helps)
        elif n.target in VIEWS and _shape(n) is not None:
            made += _collapse(graph, n)
    for n in reversed(list(graph.nodes)):  # views left without users
        if n.op == "call_function" and n.target in VIEWS and not n.users:
            graph.erase_node(n)
    return made
