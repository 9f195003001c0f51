"""An inlined region's ATen segments: each IR node of them, one line of the program.

A region's plan may leave some of its ops to ATen (a segment no kernel takes: a sum over
a leading dim of a full value, a broadcast that is no row). The region module runs them
through the executor (eval_node, node by node, at every call, after looking the plan up
by the inputs' signature); inlined, each node is a line: the common ops as the torch call
eval_node makes, written out; any other as eval_node on its IR node, which computes the
same by definition. Constants and iotas depend on nothing: they are made once, when the
program is built, and bound as globals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from fuser.dynamo.program.step import Step
from fuser.ir.evaluate import _NUMBER_OPERAND, BINARY, UNARY, eval_node
from fuser.ir.graph import Node
from fuser.ir.ops import Op

if TYPE_CHECKING:
    from fuser.dynamo.program.steps import StepBuilder

REDUCE = {Op.SUM: torch.sum, Op.MEAN: torch.mean, Op.MAX: torch.amax, Op.MIN: torch.amin}
# ops whose ATen result may be one of their inputs, or a view of it: a cast to the same
# dtype (.to returns its input), a broadcast to the same shape (reshape, expand and
# contiguous all return views then), a slice of everything, check_index (its index)
MAY_ALIAS = frozenset({Op.CAST, Op.BROADCAST_IN_DIM, Op.SLICE, Op.CHECK_INDEX})
HOISTED = frozenset({Op.CONST, Op.IOTA})  # made once, at build time


def segment_steps(
    nodes: tuple[Node, ...],
    value: dict[int, str],
    roots: dict[int, frozenset[int]],
    shared: set[int],
    consts: dict[int, float],
    direct: dict[int, str],
    plan: Any,
    b: StepBuilder,
    device: torch.device,
) -> list[Step]:
    """The steps computing `nodes` (an ATen segment of `plan`) from the names in `value`
    (IR value id -> program name), which they extend. roots[v]: the value ids whose
    storage v may share; `shared` gets the ids of the hoisted constants (globals every
    call shares), `consts` the values of the floating scalar ones. direct[v]: the name
    of the region output a result is (fresh_result says it may be)."""
    steps = []
    for node in nodes:
        if node.op in HOISTED:
            (t,) = eval_node(node, [], device, plan._constants)
            name = value[node.out.id] = b.names.bind(t, f"{node.op.value}_{node.out.id}")
            roots[node.out.id] = frozenset({node.out.id})
            shared.add(node.out.id)
            finite = t.dim() == 0 and t.is_floating_point() and math.isfinite(t.item())
            if node.op == Op.CONST and finite:
                consts[node.out.id] = t.item()  # the number eval_node's .item() gives
            continue
        args = [value[v.id] for v in node.inputs]
        outs = [direct.get(v.id) or b.names.fresh("t") for v in node.outputs]
        for v, name in zip(node.outputs, outs):
            value[v.id] = name
            own = frozenset({v.id})
            roots[v.id] = (
                own.union(*(roots[i.id] for i in node.inputs)) if _may_alias(node) else own
            )
        call = _direct(node, args, consts, plan, b) or _evaluated(node, args, plan, b, device)
        lhs = outs[0] if len(outs) == 1 else ", ".join(outs)
        aliases = tuple(args) if _may_alias(node) else ()
        steps.append(
            Step(
                "call",
                tuple(outs),
                tuple(args),
                f"{lhs} = {call}",
                aliases,
                op=f"ir.{node.op.value}",
            )
        )
    return steps


def fresh_result(node: Node) -> bool:
    """Whether `node`'s ATen result is always new storage (not made once: no constant)."""
    return node.op not in HOISTED and not _may_alias(node)


def _may_alias(node: Node) -> bool:
    if node.op not in MAY_ALIAS:
        return False
    src, out = node.inputs[0], node.out
    if node.op == Op.CAST:
        return src.dtype == out.dtype
    if node.op in (Op.BROADCAST_IN_DIM, Op.SLICE):
        return _numel(src.shape) == _numel(out.shape)
    return True


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _direct(
    node: Node, args: list[str], consts: dict[int, float], plan: Any, b: StepBuilder
) -> str:
    """The torch call eval_node makes for `node`, as source; "" for the ops it does not
    write out."""
    op, names = node.op, b.names
    if op in UNARY:
        return f"{names.bind(UNARY[op], f'torch_{op.value}')}({args[0]})"
    if op in BINARY:
        a, c = args
        ranks = sum(v.rank for v in node.inputs)
        if op in _NUMBER_OPERAND and ranks > 0:
            if any(v.id in plan._constants and v.id not in consts for v in node.inputs):
                return ""  # a constant that is no hoisted float scalar: as eval_node does
            # eval_node's rule: a scalar constant is a Python number, as in eager's `x * 0.5`
            a, c = (repr(consts[v.id]) if v.id in consts else s for s, v in zip(args, node.inputs))
            if op == Op.MUL and node.inputs[0].id in consts:
                a, c = c, a
        return f"{names.bind(BINARY[op], f'torch_{op.value}')}({a}, {c})"
    if op == Op.WHERE:
        return f"{names.bind(torch.where, 'torch_where')}({', '.join(args)})"
    if op == Op.CAST:
        dt = node.attr("dtype").torch
        return f"{args[0]}.to({names.bind(dt, str(dt).removeprefix('torch.'))})"
    if op == Op.BROADCAST_IN_DIM:
        shape = [int(s) for s in node.attr("shape")]
        view = [1] * len(shape)
        for i, d in enumerate(node.attr("broadcast_dims")):
            view[d] = int(node.inputs[0].shape[i])
        return f"{args[0]}.reshape({view}).expand({shape}).contiguous()"
    if op in REDUCE:
        fn = names.bind(REDUCE[op], f"torch_{REDUCE[op].__name__}")
        dims, keep = list(node.attr("dims")), bool(node.attr("keepdim", False))
        return f"{fn}({args[0]}, {dims}, keepdim={keep})"
    return ""


def _evaluated(node: Node, args: list[str], plan: Any, b: StepBuilder, device: Any) -> str:
    """`node` through eval_node, as the executor runs it."""
    fn = b.names.bind(eval_node, "eval_node")
    ir = b.names.bind(node, f"ir_{node.op.value}")
    dev = b.names.bind(device, f"dev_{device.type}")
    consts = b.names.bind(plan._constants, "constants")
    tail = "" if len(node.outputs) > 1 else "[0]"
    return f"{fn}({ir}, [{', '.join(args)}], {dev}, {consts}, asynchronous=True){tail}"
