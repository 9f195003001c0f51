"""Rewrites around fuser::cross_entropy (ce_op.py): the Dynamo graph's cross_entropy
calls become the one-pass op, and the backward's scaling of its gradient runs in place.

`one_pass_cross_entropy` runs on the graph Dynamo captured, before AOTAutograd, and only
when a backward will run (grad mode on, logits requiring grad): there AOTAutograd still
sees `F.cross_entropy` with its arguments, and the upcast `.float()` before it, which it
would otherwise trace into _to_copy, _log_softmax and nll_loss. A call it does not take
(class weights, probabilities as targets, a class dim that is not the last of 2) stays
as it was and takes the old path (log_softmax + nll_loss).

`scale_saved_gradient_in_place` runs on a backward graph: the saved gradient is read by
nothing else, so fuser::cross_entropy_grad becomes `ce_scale.scale_in_place`, which
leaves it as it is when the upstream gradient is 1 (checked on the device).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import fuser.dynamo.ce_op as ce_op
from fuser.dynamo.ce_scale import scale_in_place

_CE = (F.cross_entropy, torch.nn.functional.cross_entropy)
_HALF = (torch.float16, torch.bfloat16)
_VIEW_METHODS = ("view", "reshape", "flatten")


def _val(n: Any) -> Any:
    return n.meta.get("example_value", n.meta.get("val")) if isinstance(n, fx.Node) else None


def _is_upcast(n: fx.Node) -> bool:
    """x.float(), x.to(torch.float32), x.to(dtype=torch.float32), x.type(torch.float32)."""
    if n.op != "call_method" or not n.args:
        return False
    if n.target == "float" and len(n.args) == 1 and not n.kwargs:
        return True
    if n.target in ("to", "type"):
        want = n.args[1] if len(n.args) == 2 else n.kwargs.get("dtype")
        extra = set(n.kwargs) - {"dtype"}
        return want is torch.float32 and not extra and len(n.args) <= 2
    return False


def _is_view(n: fx.Node) -> bool:
    return n.op == "call_method" and n.target in _VIEW_METHODS


def _strip(logits: fx.Node) -> tuple[fx.Node, list[fx.Node], bool]:
    """(the tensor before an upcast, the views between it and the call, upcast?): the
    upcast is dropped only when nothing else reads it; views are replayed on the source."""
    views: list[fx.Node] = []
    n = logits
    while isinstance(n, fx.Node) and _is_view(n) and len(n.users) == 1:
        views.append(n)
        n = n.args[0]
    if isinstance(n, fx.Node) and _is_upcast(n) and len(n.users) == 1:
        src = n.args[0]
        sv = _val(src)
        if isinstance(src, fx.Node) and sv is not None and sv.dtype in _HALF:
            while isinstance(src, fx.Node) and _is_view(src) and len(src.users) == 1:
                views.append(src)  # views before the upcast, replayed in order
                src = src.args[0]
            return src, views, True
    return logits, [], False


def _argument(node: fx.Node, index: int, name: str, default: Any) -> Any:
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def _options(node: fx.Node) -> tuple[int, int, float] | None:
    """(reduction code, ignore_index, label_smoothing), or None for a call not taken."""
    if _argument(node, 2, "weight", None) is not None:
        return None
    if _argument(node, 3, "size_average", None) is not None:
        return None
    if _argument(node, 5, "reduce", None) is not None:
        return None
    reduction = _argument(node, 6, "reduction", "mean")
    ignore = _argument(node, 4, "ignore_index", -100)
    smoothing = _argument(node, 7, "label_smoothing", 0.0)
    if reduction not in ce_op.REDUCTION_CODE or not isinstance(ignore, int):
        return None
    if not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing <= 1.0:
        return None
    return ce_op.REDUCTION_CODE[reduction], ignore, float(smoothing)


def _takes(node: fx.Node) -> bool:
    x, t = _val(node.args[0]), _val(node.args[1]) if len(node.args) > 1 else None
    if not isinstance(x, torch.Tensor) or not isinstance(t, torch.Tensor):
        return False
    return (
        x.dim() == 2
        and x.dtype.is_floating_point
        and x.requires_grad
        and t.dim() == 1
        and t.dtype in (torch.int64, torch.int32)
        and not any(isinstance(s, torch.SymInt) for s in x.shape)
    )


def one_pass_cross_entropy(gm: fx.GraphModule) -> int:
    """Replace gm's F.cross_entropy calls by fuser::cross_entropy; returns how many."""
    if not torch.is_grad_enabled():
        return 0
    graph = gm.graph
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _CE or len(node.args) < 2:
            continue
        opts = _options(node)
        if opts is None or not _takes(node):
            continue
        src, views, upcast = _strip(node.args[0])
        # the loss in the dtype eager gives: float32 under autocast (cross-entropy is on
        # its float32 list) even where the user wrote no .float()
        want, got = _val(node), _val(src)
        if want is not None and got is not None and want.dtype == torch.float32:
            upcast = upcast or got.dtype != torch.float32
        with graph.inserting_before(node):
            x = src
            for v in reversed(views):
                x = graph.call_method(v.target, (x, *v.args[1:]), dict(v.kwargs))
            pair = graph.call_function(
                torch.ops.fuser.cross_entropy.default, (x, node.args[1], *opts, upcast)
            )
            loss = graph.call_function(operator.getitem, (pair, 0))
        node.replace_all_uses_with(loss)
        graph.erase_node(node)
        done += 1
    if done:
        graph.eliminate_dead_code()
        gm.recompile()
    return done


def scale_saved_gradient_in_place(gm: fx.GraphModule) -> int:
    """In a backward graph: fuser::cross_entropy_grad of a saved gradient that nothing else
    reads becomes scale_in_place (no new buffer; no pass at all for an upstream 1)."""
    done = 0
    for node in gm.graph.nodes:
        if node.target != torch.ops.fuser.cross_entropy_grad.default:
            continue
        grad, upstream = node.args
        uv = upstream.meta.get("val") if isinstance(upstream, fx.Node) else None
        if not (isinstance(grad, fx.Node) and grad.op == "placeholder" and len(grad.users) == 1):
            continue
        if not isinstance(uv, torch.Tensor) or uv.dim() != 0:
            continue
        node.target = scale_in_place
        node.meta["val"] = grad.meta.get("val")  # the result is the saved buffer itself
        done += 1
    if done:
        gm.recompile()
    return done
