"""Two rewrites of the ATen graph before partitioning: casts before views, and duplicates.

SDPA's math path (BERT's, ViT's and T5's attention on a GPU, where a mask or a bias rules
the fused kernels out) casts transposed views in its backward: `_to_copy(transpose(p))`,
the fp32 probabilities cast to bf16 for a bmm. Alone in a region, such a cast reads and
writes across the transposed dims, at about half the bandwidth of a copy. A cast commutes
with a view that keeps every element where it is (transpose, permute, t, view), so it is
moved before it: the cast reads and writes the source in its own order, and the view,
now of the cast's result, stays a free ATen view (the bmm takes a transposed operand as
it is). The result has the same shape, dtype and strides as before.

The same backward casts one tensor twice for two bmms. ATen ops that are functional and
not random give equal results for equal arguments: a second call is replaced by the
first (never where two graph outputs would then share storage, directly or through
views: outputs must not alias; never a view, which costs nothing twice).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fuser.dynamo.context import value_of
from fuser.dynamo.support import try_lower

aten = torch.ops.aten
# views that keep every element (no slicing, no broadcasting): a cast commutes with them
_KEEPING_VIEWS = (
    aten.transpose.int,
    aten.permute.default,
    aten.t.default,
    aten.view.default,
    aten._unsafe_view.default,
)
_CAST_KWARGS = {"dtype", "layout", "device"}


def _movable_cast(n: fx.Node) -> bool:
    """A dtype cast of a view that keeps every element, nothing else asked of it."""
    if n.op != "call_function" or n.target is not aten._to_copy.default or len(n.args) != 1:
        return False
    if set(n.kwargs) - _CAST_KWARGS or n.kwargs.get("layout") not in (None, torch.strided):
        return False
    src, out = n.args[0], value_of(n)
    if not isinstance(src, fx.Node) or src.op != "call_function":
        return False
    if src.target not in _KEEPING_VIEWS or not isinstance(src.args[0], fx.Node):
        return False
    x = value_of(src.args[0])
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return x.device == out.device and all(isinstance(s, int) for s in x.shape)


def casts_before_views(graph: fx.Graph) -> int:
    """Move each cast of a keeping view before the view (see the module's doc), where
    only ATen calls fuser does not lower read the cast (a bmm): the cast is a region of
    its own either way. Where a user fuses, the cast stays with it, and the view, before
    the region, stays out of it. Returns how many moved."""
    moved, before = 0, -1
    while moved != before:  # a view of a view: the cast, now before one, moves again
        before = moved
        moved += _move_casts(graph)
    return moved


def _move_casts(graph: fx.Graph) -> int:
    moved = 0
    for n in list(graph.nodes):
        if not _movable_cast(n) or not all(_aten_only(u) for u in n.users):
            continue
        src, rest = n.args[0], n.args[0].args[1:]
        try:  # the metas first: a view the cast's layout cannot take is left as it was
            cast_val = aten._to_copy.default(value_of(src.args[0]), **n.kwargs)
            view_val = src.target(cast_val, *rest, **src.kwargs)
        except (RuntimeError, ValueError):
            continue
        b = value_of(n)
        if view_val.shape != b.shape or view_val.stride() != b.stride():
            continue  # not the same layout as before
        with graph.inserting_before(n):
            cast = graph.call_function(aten._to_copy.default, (src.args[0],), dict(n.kwargs))
            cast.meta["val"] = cast_val
            view = graph.call_function(src.target, (cast, *rest), dict(src.kwargs))
            view.meta["val"] = view_val
        n.replace_all_uses_with(view)
        graph.erase_node(n)
        if not src.users:
            graph.erase_node(src)
        moved += 1
    return moved


def _aten_only(n: fx.Node) -> bool:
    """Whether `n` is an ATen call fuser does not lower (a bmm). Not a graph output: a
    cast that is one (a weight's gradient cast to fp32) is left to the call program's
    cast groups, which launch such casts together."""
    return n.op == "call_function" and try_lower(n) is not None


def is_view(t: Any) -> bool:
    """A view op (its result shares its input's storage); `_unsafe_view`'s schema does not
    say so, yet it is one."""
    if t is aten._unsafe_view.default:
        return True
    return isinstance(t, torch._ops.OpOverload) and any(
        r.alias_info is not None for r in t._schema.returns
    )


def _pure(n: fx.Node) -> bool:
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or is_view(t):
        return False
    # views cost nothing twice, and pad_mm.py makes two of the padded logits on purpose
    return not t._schema.is_mutable and torch.Tag.nondeterministic_seeded not in t.tags


def _frozen(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in x.items()))
    hash(x)  # raises for what cannot be a key
    return x


def escaping(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose storage a graph output holds: the outputs and, through views, what
    they view (y.reshape(...) of a channels-last y is a clone, then a view of it)."""
    out = next(n for n in graph.nodes if n.op == "output")
    seen: set[fx.Node] = set()
    stack = list(out.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and is_view(n.target):
            stack += n.all_input_nodes
    return seen


def dedupe(graph: fx.Graph) -> int:
    """Replace each repeated call of a pure ATen op by its first. Returns how many went."""
    seen: dict[Any, fx.Node] = {}
    held = escaping(graph)
    gone = 0
    for n in list(graph.nodes):
        if not _pure(n):
            continue
        try:
            key = (n.target, _frozen(n.args), _frozen(dict(n.kwargs)))
        except TypeError:
            continue
        first = seen.setdefault(key, n)
        if first is n:
            continue
        if n in held and first in held:  # two outputs would share one storage
            continue
        n.replace_all_uses_with(first)
        graph.erase_node(n)
        gone += 1
        if first not in held and n in held:
            held = escaping(graph)
    return gone
