"""The backward's padded cross-entropy gradient as a view of its own rows, not a copy.

With GPT-2's odd vocabulary the backward's matmuls (dX = g @ W, dW = g.T @ x) are padded
by pad_mm.py: g [N, V] becomes [N, V'] with zero columns V..V'-1 (V' = V rounded up to 16
bytes), which on an H100 was a 1.6 GB read and write per GPT-2 124M step (B=16), 1.28
ms. But fuser::cross_entropy's aligned gradient (ce_op.py) already has rows V' elements
apart, and every buffer of that layout spans whole rows (runtime/buffers.py): the
[N, V'] operand is there in its storage, but for the gap columns' contents. So the pad
becomes `padded_rows(g, V')`: the gap columns zeroed (N x (V' - V) elements: a small
strided fill instead of a full copy) and the rows returned as an [N, V'] view.

The gap is written, so it must be the gradient's own: nothing else may keep data there.
That is proven by where g comes from, never assumed of a tensor of that layout (a slice
of wider rows has one too, and its gap is the rest of those rows):

- a saved gradient of fuser::cross_entropy(aligned=True): AOTAutograd's joint graph says
  so, and `mark_saved_gradients` (run by the partitioner, saved.py) labels the value; the
  backward's placeholder shares that node's meta;
- fuser::cross_entropy_grad or ce_scale.scale_in_place of one: a new buffer of its
  layout (whole rows), or the saved gradient itself;
- views of those that keep every element where it was (view, _unsafe_view, alias).

At run time `padded_rows` checks the layout it was planned for (rows V' apart, the
storage exactly the buffer's N * V' elements from offset 0): a saved-tensor hook that
hands back another layout gets a padded copy instead, as before. Zeroing the gap at the
reader, not in the forward kernel, keeps it right whatever wrote the rows: a reused
buffer's old contents, an upstream gradient that is not 1 (scaled in place or into a new
buffer), the eager fallback. The fill goes through a tensor of its own on the storage,
not a view of g: a view would count as an in-place change of the saved gradient, and a
second backward (retain_graph) would refuse it.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx

import fuser.dynamo.ce_op  # noqa: F401  (defines torch.ops.fuser.cross_entropy)
from fuser.config import debug_print
from fuser.dynamo.ce_scale import scale_in_place
from fuser.dynamo.context import EXPLAINED

aten = torch.ops.aten
_FUSER = torch.ops.fuser

# node.meta key: the value is fuser::cross_entropy's aligned gradient (whole rows, whose
# gaps nothing else uses)
GRADIENT = "fuser_ce_aligned_gradient"

# views that keep each element at its address: the rows and their gaps stay the buffer's
_SAME_ELEMENTS = {aten.view.default, aten._unsafe_view.default, aten.alias.default}


def _is_aligned_gradient(n: fx.Node) -> bool:
    """getitem(fuser::cross_entropy(..., aligned=True), 1)."""
    if n.op != "call_function" or n.target is not operator.getitem or n.args[1] != 1:
        return False
    ce = n.args[0]
    if not isinstance(ce, fx.Node) or ce.target != _FUSER.cross_entropy.default:
        return False
    aligned = ce.args[6] if len(ce.args) > 6 else ce.kwargs.get("aligned", False)
    return aligned is True


def mark_saved_gradients(joint: fx.GraphModule) -> int:
    """Label each aligned fuser::cross_entropy gradient of a joint graph, and its aliases,
    with GRADIENT: the partitioner hands the backward's placeholders these nodes' meta.
    Returns how many nodes were labelled."""
    todo = [n for n in joint.graph.nodes if _is_aligned_gradient(n)]
    done = 0
    while todo:
        n = todo.pop()
        n.meta[GRADIENT] = True
        done += 1
        todo += [u for u in n.users if u.target == aten.alias.default]
    return done


def _own_rows(x: fx.Node) -> bool:
    """Whether x is, through views that move nothing, a buffer of whole rows whose gaps
    nothing else uses (see the module docstring)."""
    while True:
        if x.op == "placeholder":
            return bool(x.meta.get(GRADIENT))
        if x.op != "call_function":
            return False
        if _is_aligned_gradient(x) or x.meta.get(GRADIENT):
            return True
        if x.target == _FUSER.cross_entropy_grad.default:
            # a new buffer of its input's layout (whole rows), if that input is one
            x = x.args[0]
        elif x.target is scale_in_place or x.target in _SAME_ELEMENTS:
            x = x.args[0]  # the input itself, or a new buffer of its layout
        else:
            return False
        if not isinstance(x, fx.Node):
            return False


def _fits(t: torch.Tensor, width: int) -> bool:
    """Whether t [N, V] has rows `width` apart and is the whole of its storage, N * width
    elements from offset 0 (as a buffer of that layout is: runtime/buffers.py)."""
    if t.dim() != 2 or t.shape[1] >= width or t.stride() != (width, 1):
        return False
    n = t.shape[0]
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == n * width * t.itemsize


def padded_width(x: fx.Node, cols: int) -> int | None:
    """The row width for `padded_rows` when x, padded with `cols` zero columns, can be a
    view of its own rows; None when it needs a padded copy."""
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or cols <= 0 or val.dim() != 2:
        return None
    width = val.shape[1] + cols
    if not all(isinstance(d, int) for d in val.shape) or not _fits(val, width):
        return None
    return width if _own_rows(x) else None


_warned: set[tuple] = set()


def padded_rows(grad: torch.Tensor, width: int) -> torch.Tensor:
    """grad [N, V] as [N, width] rows whose columns V.. are zero: a view of its own
    storage, the gap columns zeroed, where grad has the layout it was planned for (rows
    `width` apart, whole rows); a padded copy otherwise."""
    n, v = grad.shape
    if not _fits(grad, width):  # a saved-tensor hook's copy, say: padded as before
        key = (tuple(grad.shape), grad.stride(), width)
        if key not in _warned:
            _warned.add(key)
            debug_print(
                1,
                f"[fuser.dynamo] a cross-entropy gradient {list(grad.shape)} of strides "
                f"{grad.stride()} is not the buffer of rows {width} apart it was planned "
                "as: padded by a copy",
            )
        return F.pad(grad, (0, width - v))
    if width > v:
        # a tensor of its own on the storage: a view of grad would bump the saved
        # gradient's version, and a second backward (retain_graph) would refuse it
        gap = grad.new_empty(0).set_(grad.untyped_storage(), v, (n, width - v), (width, 1))
        gap.zero_()
    return grad.as_strided((n, width), (width, 1))


def _describe(node: fx.Node) -> str:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    shape = list(val.shape) if isinstance(val, torch.Tensor) else "?"
    return (
        f"the cross-entropy gradient {shape} read as rows of {node.args[1]} in place: its "
        "gap columns zeroed, no padded copy (fuser/dynamo/ce_pad.py)"
    )


EXPLAINED[padded_rows] = _describe
