"""Sums over middle or some leading dims, made fusible before partitioning.

fuser schedules a reduction over the last dim (a row) or over all leading dims (a
column). A sum over dims in between stays an ATen sum: grouped-query attention's
gradient is one, the key and value heads' gradient summed over the query heads that
shared them ([B, G, R, T, D] -> [B, G, T, D], R query heads a key head).

Where the reduced dims hold few elements (at most MAX_TERMS), the sum is the
elementwise sum of its slices: each slice an ATen view of the input at its own offset
(free: the call program resolves it at compile time), read by a fused kernel through its
strides, widened to the accumulation type ATen's sum uses (fp32 for half types) and added
in order, then rounded once. The adds join the elementwise work around the sum (a GQA
gradient's rotary backward). A sum over more elements stays ATen: a kernel reading that
many views would hold that many pointers and loads in flight a thread.

A sum over some leading dims but not all (a learned position embedding's gradient, summed
over the batch: [B, T, C] -> [T, C]) is a column sum of the input viewed as [B, T * C]:
the view is free where the trailing dims merge (else the sum stays ATen), and the column
sum is the outer reduction's.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import fx

from fuser.dynamo.context import arg, call_with_value, value_of
from fuser.dynamo.reductions import reduce_dims

aten = torch.ops.aten
MAX_TERMS = 16
_SUMS = (aten.sum.dim_IntList, aten.mean.dim)
_HALF = (torch.float16, torch.bfloat16)


def _reduced(node: fx.Node) -> tuple[torch.Tensor, list[int]] | None:
    """(input value, reduced dims) of a floating sum or mean of a rank-3+ input with static
    sizes that reduces neither its last dim nor all its leading dims (those fuse as they
    are); None for any other node."""
    if node.op != "call_function" or node.target not in _SUMS:
        return None
    x, out = value_of(node.args[0]), value_of(node)
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    if not x.dtype.is_floating_point or not out.dtype.is_floating_point or x.dim() < 3:
        return None
    if not all(isinstance(s, int) for s in x.shape) or x.numel() == 0:  # symbolic, empty
        return None
    dims = reduce_dims(x.dim(), arg(node, 1, "dim"))
    if not dims or x.dim() - 1 in dims or dims == list(range(x.dim() - 1)):
        return None
    return x, dims


def _leading(x: torch.Tensor, dims: list[int]) -> int:
    """k where `dims` are x's first k dims (the position-embedding gradient: [B, T, C] ->
    [T, C]) and x views as [those dims' elements, the rest]; 0 otherwise."""
    k = len(dims)
    if dims != list(range(k)):
        return 0
    shape, stride = list(x.shape), list(x.stride())
    if not (_merges(shape[:k], stride[:k]) and _merges(shape[k:], stride[k:])):
        return 0  # not one stride for each side: a view would copy
    return k


def _merges(shape: list[int], stride: list[int]) -> bool:
    """Whether dims of these sizes and strides view as one (size-1 dims aside). Worked out
    here, not by trying a view of the fake value: torch 2.13's fake view accepted
    [5, 17, 1, 16] with strides (272, 1, 17, 17) as [5, 272], which a real one refuses."""
    dims = [(n, st) for n, st in zip(shape, stride) if n != 1]
    return all(a[1] == b[0] * b[1] for a, b in zip(dims, dims[1:]))


def _middle(x: torch.Tensor, dims: list[int]) -> bool:
    """Whether `dims`, not x's first ones, hold 2..MAX_TERMS elements."""
    terms = math.prod(x.shape[d] for d in dims)
    return dims != list(range(len(dims))) and 2 <= terms <= MAX_TERMS


def _cast(graph: fx.Graph, x: fx.Node, dtype: torch.dtype) -> fx.Node:
    if value_of(x).dtype == dtype:
        return x
    return call_with_value(graph, aten._to_copy.default, (x,), {"dtype": dtype})


def _expand(graph: fx.Graph, node: fx.Node, dims: list[int]) -> fx.Node:
    """node's sum as adds of its slices, in the node's output dtype, without its
    reduced dims (keepdim or not)."""
    x = node.args[0]
    out = value_of(node)
    acc = torch.float32 if out.dtype in _HALF else out.dtype
    sizes = [value_of(x).shape[d] for d in dims]
    total = None
    for index in itertools.product(*(range(s) for s in sizes)):
        piece = x
        for d, i in sorted(zip(dims, index), reverse=True):  # the later dims first
            piece = call_with_value(graph, aten.select.int, (piece, d, i))
        piece = _cast(graph, piece, acc)
        total = piece if total is None else call_with_value(graph, aten.add.Tensor, (total, piece))
    assert total is not None
    if node.target is aten.mean.dim:
        total = call_with_value(graph, aten.div.Tensor, (total, float(math.prod(sizes))))
    return _cast(graph, total, out.dtype)


def _squeezes(node: fx.Node, dims: list[int]) -> list[fx.Node]:
    """The users of a keepdim sum that squeeze exactly its reduced dims away (transformers'
    repeat_kv gradient: sum(..., keepdim=True).squeeze(2))."""
    found = []
    for u in node.users:
        if u.op != "call_function" or u.target not in (aten.squeeze.dim, aten.squeeze.dims):
            continue
        sq = u.args[1] if len(u.args) > 1 else None
        sq = [sq] if isinstance(sq, int) else list(sq or [])
        if sorted(d % value_of(node).dim() for d in sq) == dims:
            found.append(u)
    return found


def _as_column(graph: fx.Graph, node: fx.Node, k: int) -> fx.Node:
    """node's sum over its input's first k dims as a column sum of its [lead, rest] view,
    viewed back to node's shape (keepdim or not)."""
    x = node.args[0]
    shape = list(value_of(x).shape)
    lead, rest = math.prod(shape[:k]), math.prod(shape[k:])
    flat = call_with_value(graph, aten.view.default, (x, [lead, rest]))
    dtype = node.kwargs.get("dtype")
    kwargs = {"dtype": dtype} if dtype is not None else {}
    col = call_with_value(graph, node.target, (flat, [0]), kwargs)
    return call_with_value(graph, aten.view.default, (col, list(value_of(node).shape)))


def split_middle_sums(graph: fx.Graph) -> list[str]:
    """Rewrite every sum or mean over a few middle elements (see the module's doc) as
    adds of strided views, and every one over some leading dims but not all as a column
    sum of a 2-D view. Returns explain's notes, one a rewritten sum."""
    notes = []
    for node in list(graph.nodes):
        found = _reduced(node)
        if found is None:
            continue
        x, dims = found
        shape, what = list(x.shape), node.target.__name__.split(".")[0]
        k = _leading(x, dims)
        if k:
            notes.append(
                f"{node.name}: {what} over dims {dims} of {shape} as a column sum of its "
                f"[{math.prod(shape[:k])}, {math.prod(shape[k:])}] view"
            )
            with graph.inserting_before(node):
                node.replace_all_uses_with(_as_column(graph, node, k))
            graph.erase_node(node)
            continue
        if not _middle(x, dims):
            continue
        notes.append(
            f"{node.name}: {what} over dims {dims} of {shape} "
            f"({math.prod(shape[d] for d in dims)} elements a result) as adds of strided "
            "views (no reduction kernel takes middle dims)"
        )
        with graph.inserting_before(node):
            total = _expand(graph, node, dims)
        if tuple(value_of(total).shape) != tuple(value_of(node).shape):  # keepdim
            for sq in _squeezes(node, dims):
                sq.replace_all_uses_with(total)
                graph.erase_node(sq)
            if node.users:
                with graph.inserting_before(node):
                    keep = list(value_of(node).shape)
                    total = call_with_value(graph, aten.view.default, (total, keep))
        node.replace_all_uses_with(total)
        graph.erase_node(node)
    return notes
