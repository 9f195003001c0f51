"""Move row views out of the way of fusion, on the FX graph, before partitioning.

A "row view" reshapes the leading dims and keeps the last one ([B, T, C] <-> [B*T, C]).
fuser IR has no reshape, so a row view between two fusible ops splits their region; but
the kernels' [rows, cols] iteration space is the same on both sides of it. Two rewrites
take such views out of the middle:

- a reduction over all leading dims of a row view reduces the source instead:
  sum(view(x, [N, C]), [0]) -> view(sum(x, [0, 1]), ...)   (bias gradients)
- so does a reduction over the last dim, kept: mean(view(x, [B, T, C]), [-1], True) ->
  view(mean(x, [-1], True), [B, T, 1])   (RMSNorm written out, as transformers does)
- an elementwise op whose full-shape tensor operands are row views of same-shaped sources
  (or contiguous tensors, viewed the same way) runs on the sources, and its result is
  viewed instead:
  gelu_backward(view(a), view(b)) -> view(gelu_backward(a, b))
  when that helps: a source is itself fusible (the op joins its region), or the result
  reaches, through elementwise ops, a view back (they cancel) or a foldable reduction;
  an operand that broadcasts along the last dim ([B, T, 1], a kept reduction's result) may
  be a row view too, of a source of the same leading dims as the others ([B*T, 1])

and chains of views collapse (view(view(x)) -> view(x), or x when the shapes agree).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import fx

from fuser.dynamo import pointwise
from fuser.dynamo.context import LOWERINGS
from fuser.dynamo.reductions import reduce_dims
from fuser.dynamo.tidy import escaping

aten = torch.ops.aten
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
SUNK = "fuser_row_view_sunk"  # meta key of an op this pass ran on its views' sources
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


def _reduces(n: fx.Node, rank: int) -> str | None:
    """What reduction `n` does to its rank-`rank` operand that a row view commutes with:
    "rows" (over all leading dims: a bias gradient), "last" (over the last dim, kept: the
    mean of a written-out RMSNorm), or None."""
    if n.target not in REDUCTIONS or len(n.args) < 2 or rank < 2:
        return None
    keepdim = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
    dims = reduce_dims(rank, n.args[1])
    if dims == list(range(rank - 1)):
        return "rows"
    return "last" if dims == [rank - 1] and keepdim else None


def _fold_reduction(graph: fx.Graph, n: fx.Node) -> bool:
    v = n.args[0]
    if not is_row_view(v):
        return False
    src = v.args[0]
    kind = _reduces(n, len(_shape(v)))
    if kind == "rows" and src.op == "call_function" and src.target is aten.cat.default:
        # the bias gradient of a cat (GPT-2's q, k, v gradients made one [B*T, 3C] tensor
        # for the matmuls): folded, the sum joins the cat's region and its column
        # reduction reads the three pieces through views, 1.44 ms a GPT-2 step on an
        # H200 against 0.60 for the cat and a sum of its result (session 18, call f)
        return False
    if kind is None:
        return False
    src_rank = len(_shape(src))
    if kind == "rows" and src_rank < 2:
        # a [C] source viewed as [1, C]: no leading dims to reduce, and an empty dim list
        # would make ATen's sum reduce everything (F.linear of a vector, its bias gradient)
        return False
    # "last": the result [..., 1] is a row view of the source's [rows, 1], which the
    # elementwise ops after it can sink through too (see _sink_through)
    dims = list(range(src_rank - 1)) if kind == "rows" else [src_rank - 1]
    keepdim = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
    # a dtype (CUDA autocast gives sum one: dtype=float32) is the same on both sides
    kwargs = {k: a for k, a in n.kwargs.items() if k != "keepdim"}
    with graph.inserting_before(n):
        r = graph.call_function(n.target, (src, dims, keepdim), kwargs)
        r.meta["val"] = n.target(_val(src), dims, keepdim, **kwargs)
        out = _view(graph, r, _shape(n))
    n.replace_all_uses_with(out)
    graph.erase_node(n)
    return True


def _sink_through(graph: fx.Graph, n: fx.Node, helps: dict) -> bool:
    """Run elementwise n on its row views' sources (see the module docstring)."""
    out_shape = _shape(n)
    tensors = [a for a in n.args if isinstance(a, fx.Node)]
    if not out_shape or not tensors or any(isinstance(a, (list, tuple)) for a in n.args):
        return False
    if n.meta.get(SUNK):  # moved once: a later pass would move it back
        return False
    full = [a for a in tensors if _shape(a) == out_shape]
    views = [a for a in full if is_row_view(a)]
    # an operand of the full shape that is not a row view is viewed like the others (a
    # free reshape when it is contiguous: the zero gradient autograd gives an unused
    # output, added to the cross-entropy's)
    plain = [a for a in full if a not in views]
    if not all(_contiguous(a) for a in plain):
        return False
    if views:
        src_shape = _shape(views[0].args[0])
        if any(_shape(a.args[0]) != src_shape for a in views):
            return False
    elif helps.get(n) == "view" and len(out_shape) > 2 and plain and not any(map(_fused, plain)):
        # no view among the operands (saved activations of [B, T, C]), but the result
        # is viewed as rows later: run it on [B*T, C] views of them, which are free (a
        # fusible operand would find the view between it and this op instead)
        src_shape = [math.prod(out_shape[:-1]), out_shape[-1]]
    else:
        return False
    # other tensor operands must broadcast the same way against both shapes: a vector
    # along the last dim does; so does [..., 1] with the same leading dims, a row view
    # of [rows, 1] or a contiguous tensor viewed so
    rowwise = [a for a in tensors if a not in full and _rowwise(a, out_shape, src_shape)]
    for a in tensors:
        if a not in full and a not in rowwise and len(_shape(a) or [0, 0]) > 1:
            return False
    fusible_source = any(a.args[0].target in LOWERINGS for a in views)
    if not (fusible_source or n in helps):
        return False
    back = [u for u in n.users if is_row_view(u) and _shape(u) == src_shape]
    rows_of = {a: [*src_shape[:-1], _shape(a)[-1]] for a in plain + rowwise}

    def source(a: Any) -> Any:  # the operand on the sources' side, as a value
        if a in views or (a in rowwise and is_row_view(a)):
            return _val(a.args[0])
        if a in rows_of:
            return _val(a).reshape(rows_of[a])
        return _val(a) if isinstance(a, fx.Node) else a

    try:
        val = n.target(*[source(a) for a in n.args], **n.kwargs)
    except Exception:
        return False
    with graph.inserting_before(n):
        args = tuple(
            a.args[0]
            if a in views or (a in rowwise and is_row_view(a))
            else _view(graph, a, rows_of[a])
            if a in rows_of
            else a
            for a in n.args
        )
        m = graph.call_function(n.target, args, dict(n.kwargs))
        m.meta["val"] = val
        m.meta[SUNK] = True
        shaped = _view(graph, m, out_shape)
    for u in back:
        u.replace_all_uses_with(m)
        graph.erase_node(u)
    n.replace_all_uses_with(shaped)
    graph.erase_node(n)
    return True


def _rowwise(a: fx.Node, out_shape: list, src_shape: list) -> bool:
    """Whether `a`, an operand of shape [..., 1] of an op of `out_shape`, broadcasts along
    the last dim alike on both sides of the view: it has the op's leading dims and is a
    row view of [*src_shape's leading dims, 1], or contiguous (viewed so for free)."""
    shape = _shape(a)
    if not (shape and shape[-1] == 1 and shape[:-1] == out_shape[:-1] and out_shape[-1] > 1):
        return False
    if is_row_view(a):
        return _shape(a.args[0]) == [*src_shape[:-1], 1]
    return _contiguous(a) and not _fused(a)


def _fused(a: fx.Node) -> bool:
    """Whether `a` is the result of an op fuser lowers (a view put after it would split
    its region from its users')."""
    if a.op == "call_function" and a.target is operator.getitem:  # native_layer_norm's
        a = a.args[0]
    return isinstance(a, fx.Node) and a.op == "call_function" and a.target in LOWERINGS


def _sink_expand(graph: fx.Graph, n: fx.Node) -> bool:
    """expand(view(x), [..., C]) -> view(expand(x, [rows, C])) for a row view of [..., 1]
    expanded along the last dim only (a kept row reduction's result, broadcast back)."""
    v, sizes = n.args[0], _shape(n)
    shape = _shape(v)
    if not (is_row_view(v) and sizes and shape and shape[-1] == 1):
        return False
    if len(sizes) != len(shape) or sizes[:-1] != shape[:-1]:
        return False
    src = v.args[0]
    target = [*_shape(src)[:-1], sizes[-1]]
    with graph.inserting_before(n):
        e = graph.call_function(aten.expand.default, (src, target))
        e.meta["val"] = _val(src).expand(target)
        out = _view(graph, e, sizes)
    n.replace_all_uses_with(out)
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


def _helped(graph: fx.Graph) -> dict:
    """Elementwise nodes whose result reaches, through elementwise ops, a row view
    ("view") or a reduction over all its leading dims or its last dim kept, which
    _fold_reduction folds once a view is moved below the op ("reduction"): moving a view
    below them pays off. Ops without a view among their operands move only for "view"."""
    helps: dict = {}
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and n.target in ELEMENTWISE:
            kinds = {
                "view"
                if is_row_view(u)
                else "reduction"
                if _folds(u, n)
                else helps.get(u)
                if u.target in ELEMENTWISE
                else None
                for u in n.users
            }
            if kinds - {None}:
                helps[n] = "view" if "view" in kinds else "reduction"
    return helps


def _folds(u: fx.Node, n: fx.Node) -> bool:
    """Whether reduction `u` of `n` would fold were `n` a row view (_fold_reduction)."""
    shape = _shape(n)
    return u.args[0] is n and bool(shape) and len(shape) > 2 and _reduces(u, len(shape)) is not None


def sink_row_views(graph: fx.Graph, passes: int = 16) -> int:
    """Apply the rewrites in program order, pass after pass while a pass changes the
    graph (a view moved below one op can make the op before it worth moving, as the
    saved [B, T, C] activations of a backward show), at most `passes` times; returns
    how many were made. The tiny Llama's backward settles in 2 passes; the same model at
    B=16 on a GPU (other rewrites before this one, another node order) needed more
    than 4: its RMSNorm backward stayed three regions."""
    made = 0
    for _ in range(passes):
        before = made
        helps = _helped(graph)
        for n in list(graph.nodes):
            if n.op != "call_function" or getattr(n, "_erased", False):
                continue
            if n.target in REDUCTIONS:
                made += _fold_reduction(graph, n)
            elif n.target in ELEMENTWISE:
                made += _sink_through(graph, n, helps)
            elif n.target is aten.expand.default:
                made += _sink_expand(graph, n)
            elif n.target in VIEWS and _shape(n) is not None:
                made += _collapse(graph, n)
        for n in reversed(list(graph.nodes)):  # views left without users
            if n.op == "call_function" and n.target in VIEWS and not n.users:
                graph.erase_node(n)
        if made == before:
            break
    _merge_repeated_views(graph)
    return made


def _merge_repeated_views(graph: fx.Graph) -> None:
    """One node for each view of one source to one shape: each op moved below a view
    made its own of its operands (three [B*T, C] views of one saved activation in an
    RMSNorm backward), and a region reads each of its inputs separately. A view a graph
    output holds stays its own (two outputs would be one tensor; tidy.dedupe's rule)."""
    first: dict[tuple, fx.Node] = {}
    outputs = escaping(graph)
    for n in list(graph.nodes):
        if n.op != "call_function" or n.target not in VIEWS or n in outputs:
            continue
        shape = _shape(n)
        if shape is None or len(n.args) != 2 or n.kwargs or not isinstance(n.args[0], fx.Node):
            continue
        key = (n.args[0], tuple(shape))
        if key in first:
            n.replace_all_uses_with(first[key])
            graph.erase_node(n)
        else:
            first[key] = n
