"""The fold of absent tangents: a backward graph with some of its tangent inputs taken
as structural zeros (fuser/dynamo/tangents.py says when and why).

Each absent tangent is a zero, propagated through the ops known to give zero from a zero
operand (views, casts, products, reductions, and the backward ops, linear in their
incoming gradient); `add(x, zero)` becomes `x` (where x has other strides than the sum,
the readers downstream get their new layouts, or, where that is not safe, the zero is
materialized); a gradient output that is all zero becomes None. Where an op outside
these rules reads a zero, the zero is materialized there, with its traced layout.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
from torch import fx

from fuser.dynamo.support import draft_module

aten = torch.ops.aten


def _ops(*names: str) -> set:
    """The overloads named `ns.op.overload` that this torch has."""
    out = set()
    for name in names:
        ns, op, overload = name.split(".")
        packet = getattr(getattr(torch.ops, ns), op, None)
        if packet is not None and hasattr(packet, overload):
            out.add(getattr(packet, overload))
    return out


# ops whose result is zero when their first operand is: views and copies of it, casts,
# reductions over it, and the backward ops (their first operand is the incoming
# gradient, in which every gradient they return is linear)
LINEAR_IN_FIRST = _ops(
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.t.default", "aten.transpose.int", "aten.permute.default", "aten.expand.default",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.slice.Tensor", "aten.select.int", "aten.alias.default",
    "aten.diagonal.default", "aten.as_strided.default", "aten.clone.default",
    "aten._to_copy.default", "prims.convert_element_type.default", "aten.neg.default",
    "aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default",
    "aten.flip.default", "aten.repeat.default", "aten.index_select.default",
    "aten.gather.default", "aten.cumsum.default", "aten.mul.Scalar", "aten.div.Scalar",
    "aten.slice_backward.default", "aten.select_backward.default",
    "aten.diagonal_backward.default", "aten.embedding_dense_backward.default",
    "aten.gelu_backward.default", "aten.tanh_backward.default",
    "aten.sigmoid_backward.default", "aten.threshold_backward.default",
    "aten.native_dropout_backward.default", "aten._softmax_backward_data.default",
    "aten._log_softmax_backward_data.default", "aten.native_layer_norm_backward.default",
    "aten.native_group_norm_backward.default", "aten.native_batch_norm_backward.default",
    "aten.nll_loss_backward.default", "aten.nll_loss2d_backward.default",
    "aten._scaled_dot_product_flash_attention_backward.default",
    "aten._scaled_dot_product_efficient_attention_backward.default",
    "aten._scaled_dot_product_cudnn_attention_backward.default",
    "aten._flash_attention_backward.default", "aten._efficient_attention_backward.default",
    "aten.convolution_backward.default", "aten.avg_pool2d_backward.default",
    "aten.max_pool2d_with_indices_backward.default",
    "aten._adaptive_avg_pool2d_backward.default",
)  # fmt: skip
# zero when any operand is
PRODUCTS = _ops("aten.mul.Tensor", "aten.mm.default", "aten.bmm.default", "aten.matmul.default")
# zero when both operands are; x when the other one is (add.Tensor with alpha 1 either
# way, sub.Tensor when the zero is subtracted)
SUMS = _ops("aten.add.Tensor", "aten.sub.Tensor")

# ops that read storage by strides they are given, not those of their operand
_EXPLICIT_STRIDES = _ops("aten.as_strided.default", "aten.as_strided_scatter.default")

ZERO = object()  # _rule's answer: the node's result is a structural zero


def is_tangent(n: fx.Node) -> bool:
    """A backward graph's tangent input: AOTAutograd names them tangents_1, ... (torch's
    own test, torch._inductor.utils.count_tangents, goes by the name too)."""
    return n.op == "placeholder" and "tangents" in n.name


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, fx.Node) else None


def _same_tensor(a: Any, b: Any) -> bool:
    """Same shape, dtype and device (strides aside)."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
    )


def _layout(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.dtype, v.device)
    if isinstance(v, (list, tuple)):
        return tuple(_layout(x) for x in v)
    return v


def _rule(n: fx.Node, zero: dict[fx.Node, Any]) -> Any:
    """What a node that reads a zero gives: ZERO, a node to use instead, or None (the zero
    is materialized for it)."""
    t, args = n.target, n.args
    first = args[0] if args else None
    if t is operator.getitem:
        return ZERO if first in zero and isinstance(_val(n), torch.Tensor) else None
    if t in LINEAR_IN_FIRST:
        return ZERO if first in zero else None
    if t is aten.constant_pad_nd.default:
        value = args[2] if len(args) > 2 else n.kwargs.get("value", 0)
        return ZERO if first in zero and value == 0 else None
    if t in PRODUCTS:
        return ZERO
    if t is aten.div.Tensor:
        return ZERO if first in zero and args[1] not in zero else None
    if t is aten.where.self:
        return ZERO if args[1] in zero and args[2] in zero else None
    if t is aten.cat.default:
        return ZERO if all(a in zero for a in args[0]) else None
    if t in SUMS and len(args) == 2:
        return _sum_rule(n, zero)
    return None


def _sum_rule(n: fx.Node, zero: dict[fx.Node, Any]) -> Any:
    a, b = n.args
    alpha = n.kwargs.get("alpha", 1)
    if a in zero and b in zero:
        return ZERO
    if b in zero:
        other = a
    elif n.target is aten.add.Tensor and alpha == 1:
        other = b
    else:
        return None  # zero - x: not worth a rule
    # the other operand stands for the sum where it is the same tensor; where its strides
    # differ, _Folder gives the readers' new layouts (or materializes the zero)
    return other if _same_tensor(_val(other), _val(n)) else None


def _restrides(other: fx.Node, n: fx.Node) -> bool:
    """Whether `other`, standing for `n`, has other strides."""
    return _layout(_val(other)) != _layout(_val(n))


class _Folder:
    def __init__(self, gm: fx.GraphModule, absent: set[str], strict: bool):
        self.gm, self.graph, self.strict = gm, gm.graph, strict
        self.restrided: set[fx.Node] = set()  # readers of an operand of other strides
        self.zero: dict[fx.Node, Any] = {}
        self.made: dict[fx.Node, fx.Node] = {}  # zero -> its materialized zeros
        self.folded: list[str] = []  # nodes made a structural zero or bypassed
        self.bypassed: set[fx.Node] = set()  # sums replaced by their other operand
        self.materialized: list[str] = []
        self.dropped = 0  # gradient outputs made None
        for n in self.graph.find_nodes(op="placeholder"):
            if n.name in absent:
                self.zero[n] = _val(n)

    def run(self) -> None:
        for n in list(self.graph.nodes):
            if n.op == "output":
                self._output(n)
            elif n.op == "call_function" and any(p in self.zero for p in n.all_input_nodes):
                self._fold(n)
        for n in reversed(list(self.graph.nodes)):  # the zeros and the bypassed sums
            if n.op != "output" and not n.users and (n in self.zero or n in self.bypassed):
                self.graph.erase_node(n)
        if self.restrided:
            self._restride()

    def _restride(self) -> None:
        """New values for the nodes downstream of a sum replaced by an operand of other
        strides (the cross-entropy gradient's 16-byte rows where the sum had the tangent's
        dense ones), as far as their layouts change. Raises where that is not safe: a
        view that no longer applies, an as_strided (it reads storage by explicit strides)
        or a gradient returned in other strides than traced (autograd would copy it)."""
        mode = torch._guards.detect_fake_mode([_val(n) for n in self.restrided])
        changed: set[fx.Node] = set()
        for n in self.graph.nodes:
            if n not in self.restrided and not any(p in changed for p in n.all_input_nodes):
                continue
            if n.op == "output":
                raise NotImplementedError("a gradient would be returned in other strides")
            if n.op != "call_function" or n.target in _EXPLICIT_STRIDES:
                raise NotImplementedError(f"{n.name} reads explicit strides")
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), _val)
            try:
                with mode or contextlib.nullcontext():
                    val = n.target(*args, **kwargs)
            except Exception as e:  # a view the new strides do not allow, say
                raise NotImplementedError(f"{n.name} does not take the new strides: {e}") from e
            if _layout(val) == _layout(_val(n)):
                continue
            if any(u.op == "output" for u in n.users):
                raise NotImplementedError(f"gradient {n.name} would change strides")
            n.meta["val"] = val
            changed.add(n)

    def _fold(self, n: fx.Node) -> None:
        rule = _rule(n, self.zero)
        if rule is ZERO:
            self.zero[n] = _val(n)
            self.folded.append(n.name)
        elif isinstance(rule, fx.Node) and not (
            _restrides(rule, n) and (self.strict or any(u.op == "output" for u in n.users))
        ):
            if _restrides(rule, n):
                self.restrided.update(n.users)
            n.replace_all_uses_with(rule)
            self.bypassed.add(n)
            self.folded.append(n.name)
        else:
            for p in n.all_input_nodes:
                if p in self.zero:
                    n.replace_input_with(p, self._materialize(p, n))

    def _output(self, out: fx.Node) -> None:
        """A gradient that is all zero is returned as None: no gradient, as eager gives."""

        def drop(a: fx.Node) -> fx.Node | None:
            if a in self.zero:
                self.dropped += 1
                return None
            return a

        out.args = fx.node.map_arg(out.args, drop)

    def _materialize(self, z: fx.Node, before: fx.Node) -> fx.Node:
        """Zeros with z's exact layout, placed before its first reader that needs them."""
        if z in self.made:
            return self.made[z]
        val = self.zero[z]
        if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
            raise NotImplementedError(f"{z.name} is read by {before.name} and has no fixed shape")
        mode = torch._guards.detect_fake_mode([val]) or contextlib.nullcontext()
        with self.graph.inserting_before(before), mode:
            kw = {"dtype": val.dtype, "device": val.device}
            if val.is_contiguous():
                node = self.graph.call_function(aten.zeros.default, (list(val.shape),), kw)
                node.meta["val"] = torch.zeros(val.shape, **kw)
            else:  # a strided view of a zeroed buffer that spans it
                span = 1 + sum((s - 1) * st for s, st in zip(val.shape, val.stride()) if s)
                flat = self.graph.call_function(aten.zeros.default, ([span],), kw)
                flat.meta["val"] = torch.zeros(span, **kw)
                args = (flat, list(val.shape), list(val.stride()))
                node = self.graph.call_function(aten.as_strided.default, args)
                node.meta["val"] = flat.meta["val"].as_strided(val.shape, val.stride())
        self.made[z] = node
        self.materialized.append(f"{z.name} for {before.name}")
        return node


def fold_absent(gm: fx.GraphModule, absent: set[str]) -> tuple[fx.GraphModule, str]:
    """A copy of backward graph `gm` without the tangent inputs named in `absent`, each
    taken as zero (see the module's notes); and a line for explain saying what changed.
    The copy is a draft (support.DraftModule): lowering reads it as a graph and makes
    the module it runs, so no Python source is generated for it here (~0.1 s a GPT-2
    backward graph)."""
    try:
        work = draft_module(gm)
        folder = _Folder(work, absent, strict=False)
        folder.run()
    except NotImplementedError:  # keep every reader's traced strides instead
        work = draft_module(gm)
        folder = _Folder(work, absent, strict=True)
        folder.run()
    left = [n.name for n in work.graph.find_nodes(op="placeholder") if n.name in absent]
    if left:
        raise AssertionError(f"absent tangents {left} are still read")
    work.graph.lint()
    folded = folder.folded
    shown = ", ".join(folded[:6]) + (", ..." if len(folded) > 6 else "")
    note = f"absent tangents {', '.join(sorted(absent))} (no gradient asked of those outputs) "
    note += f"taken as zero: {len(folded)} nodes folded" + (f" ({shown})" if folded else "")
    if folder.dropped:
        note += f", {folder.dropped} gradients left None"
    if folder.materialized:
        note += f", zeros materialized for {', '.join(folder.materialized)}"
    else:
        note += ", no zeros filled or read"
    return work, note
