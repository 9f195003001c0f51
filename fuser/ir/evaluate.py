"""The reference evaluator: runs a graph node by node with ATen.

It is the ground truth every generated kernel is checked against. With `upcast=True`
every floating-point value is computed in float64 (casts to narrower floats are kept as
roundings only where the graph asks for them), which gives a higher-precision reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from fuser.ir.dtypes import DType
from fuser.ir.graph import Graph, Node
from fuser.ir.guards import check_eager, target_check
from fuser.ir.ops import LAYOUT, Op

T = torch.Tensor

UNARY: dict[Op, Callable[[T], T]] = {
    Op.NEG: torch.neg,
    Op.ABS: torch.abs,
    Op.EXP: torch.exp,
    Op.EXP2: torch.exp2,
    Op.LOG: torch.log,
    Op.LOG2: torch.log2,
    Op.LOG1P: torch.log1p,
    Op.SQRT: torch.sqrt,
    Op.RSQRT: torch.rsqrt,
    Op.RECIPROCAL: torch.reciprocal,
    Op.TANH: torch.tanh,
    Op.ERF: torch.erf,
    Op.SIGMOID: torch.sigmoid,
    Op.RELU: torch.relu,
    Op.SIN: torch.sin,
    Op.COS: torch.cos,
    Op.FLOOR: torch.floor,
    Op.CEIL: torch.ceil,
    Op.LOGICAL_NOT: torch.logical_not,
    Op.ISNAN: torch.isnan,
}
BINARY: dict[Op, Callable[[T, T], T]] = {
    Op.ADD: torch.add,
    Op.SUB: torch.sub,
    Op.MUL: torch.mul,
    Op.DIV: torch.div,
    Op.POW: torch.pow,
    Op.MAXIMUM: torch.maximum,
    Op.MINIMUM: torch.minimum,
    Op.EQ: torch.eq,
    Op.NE: torch.ne,
    Op.LT: torch.lt,
    Op.LE: torch.le,
    Op.GT: torch.gt,
    Op.GE: torch.ge,
    Op.LOGICAL_AND: torch.logical_and,
    Op.LOGICAL_OR: torch.logical_or,
}


def _reduce(node: Node, x: T) -> T:
    dims, keep = list(node.attr("dims")), node.attr("keepdim", False)
    if node.op == Op.SUM:
        return torch.sum(x, dims, keepdim=keep)
    if node.op == Op.MEAN:
        return torch.mean(x, dims, keepdim=keep)
    fn = torch.amax if node.op == Op.MAX else torch.amin
    return fn(x, dims, keepdim=keep)


def _composite(node: Node, args: list[T]) -> list[T]:
    op, x = node.op, args[0]
    if op == Op.VAR_MEAN:
        var, mean = torch.var_mean(
            x,
            list(node.attr("dims")),
            correction=node.attr("correction"),
            keepdim=node.attr("keepdim", False),
        )
        return [var, mean]
    if op in (Op.LAYER_NORM, Op.RMS_NORM):
        params = dict(zip(node.attr("params"), args[1:]))
        w, b, eps = params.get("weight"), params.get("bias"), node.attr("eps")
        if op == Op.RMS_NORM:
            return [F.rms_norm(x, x.shape[-1:], w, eps)]
        y = F.layer_norm(x, x.shape[-1:], w, b, eps)
        if node.attr("return_mean_rstd"):
            # CPU ATen gives half stats for half x; CUDA ATen and the IR give float32
            stat = torch.float64 if x.dtype == torch.float64 else torch.float32
            _, mean, rstd = torch.native_layer_norm(x.to(stat), x.shape[-1:], None, None, eps)
            return [y, mean, rstd]
        return [y]
    if op == Op.GELU:
        return [F.gelu(x, approximate=node.attr("approximate"))]
    if op == Op.SOFTMAX:
        return [torch.softmax(x, node.attr("dim"))]
    if op == Op.LOG_SOFTMAX:
        return [torch.log_softmax(x, node.attr("dim"))]
    if op == Op.SAFE_SOFTMAX:
        return [torch.ops.aten._safe_softmax(x, node.attr("dim"))]
    if op == Op.CROSS_ENTROPY:
        # ATen wants int64 targets; the IR also takes int32 (llm.c's targets are int32)
        target = check_eager(target_check(node), args[1]).long()
        return [F.cross_entropy(x, target, ignore_index=node.attr("ignore_index"))]
    raise NotImplementedError(op)


# binary ops whose constant operand acts as eager's Python number: ATen would round a
# 0-d float32 tensor to a 16-bit tensor's dtype first; `x * 0.001` keeps 0.001 (as the
# kernels do). (add/sub constants are rounded by the builder already, as eager's CPU add.)
_NUMBER_OPERAND = {Op.MUL, Op.DIV}


def constant_ids(graph: Graph) -> frozenset[int]:
    """Ids of the values CONST nodes define (eval_node's `constants`)."""
    return frozenset(n.out.id for n in graph.nodes if n.op == Op.CONST)


def eval_node(
    node: Node,
    args: list[T],
    device: torch.device,
    constants: frozenset[int] = frozenset(),
    asynchronous: bool = False,
) -> list[T]:
    """One node with ATen. `constants`: ids of values that are CONST nodes' scalars;
    `asynchronous`: a failed check_index on a GPU asserts on the device, not at once."""
    op = node.op
    if op == Op.CHECK_INDEX:
        return [check_eager(node, args[0], asynchronous)]
    if op == Op.CONST:
        return [torch.tensor(node.attr("value"), dtype=node.attr("dtype").torch, device=device)]
    if op == Op.IOTA:
        shape, dim = [int(s) for s in node.attr("shape")], node.attr("dim")
        view = [1] * len(shape)
        view[dim] = shape[dim]
        idx = torch.arange(shape[dim], dtype=node.attr("dtype").torch, device=device)
        # materialized: the executor hands ATen segments' outputs to kernels as dense
        return [idx.view(view).expand(shape).contiguous()]
    if op in UNARY:
        return [UNARY[op](args[0])]
    if op in BINARY:
        a, b = args
        if op in _NUMBER_OPERAND and a.dim() + b.dim() > 0:
            a, b = (
                t.item() if v.id in constants and t.dim() == 0 and t.is_floating_point() else t
                for t, v in zip(args, node.inputs)
            )
            if op == Op.MUL and not isinstance(a, torch.Tensor):
                a, b = b, a  # `0.001 * x` is x.__rmul__: ATen's CPU mul(0.001, x) rounds it
        return [BINARY[op](a, b)]
    if op == Op.WHERE:
        return [torch.where(*args)]
    if op == Op.CAST:
        # copy=True: a cast to its own dtype would return the input itself, whose pointer
        # and strides are not the fresh, 16-byte aligned storage the planner takes an
        # ATen result a kernel reads to be (runtime/specs.py build_specs)
        return [args[0].to(node.attr("dtype").torch, copy=True)]
    if op == Op.BROADCAST_IN_DIM:
        x, shape = args[0], [int(s) for s in node.attr("shape")]
        view = [1] * len(shape)
        for i, d in enumerate(node.attr("broadcast_dims")):
            view[d] = x.shape[i]
        # dense storage of its own, as for iota: .contiguous() would return a view of x
        # where nothing is broadcast (x's pointer, not a fresh one; see the cast above)
        return [x.reshape(view).expand(shape).clone(memory_format=torch.contiguous_format)]
    if op in (Op.SUM, Op.MAX, Op.MIN, Op.MEAN):
        return [_reduce(node, args[0])]
    if op in LAYOUT:
        return [_layout(node, args)]
    if op == Op.GATHER_ROWS:  # the index is checked (check_index) before it gets here
        table, index = args
        return [table.index_select(0, index.reshape(-1)).reshape(*index.shape, table.shape[1])]
    return _composite(node, args)


def _layout(node: Node, args: list[T]) -> T:
    """A slice, pad, cat or view with ATen: dense results in storage of their own, as for
    broadcasts."""
    op, d = node.op, node.attr("dim") % max(node.out.rank, 1)
    if op == Op.SLICE:
        idx = [slice(None)] * d + [slice(node.attr("start"), node.attr("stop"), node.attr("step"))]
        # a copy, never .contiguous(): a contiguous slice (rows 1: of [2, 171]) is a view
        # at an offset, its pointer only as aligned as that offset (342 bytes: 2), but the
        # planner takes an ATen result a kernel reads to be fresh storage, 16-byte aligned
        # (runtime/specs.py build_specs), and the CUDA kernel's packed accesses faulted
        return args[0][tuple(idx)].clone(memory_format=torch.contiguous_format)
    if op == Op.CAT:
        return torch.cat(args, dim=d)
    x = args[0]
    shape = list(node.out.shape)
    out = torch.zeros(shape, dtype=x.dtype, device=x.device)
    if op == Op.PAD:
        lo, hi, step = node.attr("lo"), node.attr("lo") + x.shape[d], 1
        src = x
    else:  # VIEW
        lo, hi, scale, offset = (node.attr(k) for k in ("lo", "hi", "scale", "offset"))
        step = 1
        first = scale * lo + offset
        src = x.narrow(d, first, scale * (hi - lo - 1) + 1)[
            (slice(None),) * d + (slice(None, None, scale),)
        ]
    out.narrow(d, lo, hi - lo).copy_(src[(slice(None),) * d + (slice(None, None, step),)])
    return out


def _upcast(t: T) -> T:
    return t.double() if t.is_floating_point() else t


def evaluate(graph: Graph, inputs: list[T], upcast: bool = False) -> list[T]:
    """Run `graph` on `inputs` with ATen; returns the outputs in graph order."""
    device = inputs[0].device if inputs else torch.device("cpu")
    env: dict[int, T] = {}
    for v, t in zip(graph.inputs, inputs):
        env[v.id] = _upcast(t) if upcast else t
    constants = constant_ids(graph)
    for node in graph.nodes:
        args = [env[v.id] for v in node.inputs]
        if upcast and node.op == Op.CAST and node.attr("dtype").is_float:
            outs = [_upcast(args[0].to(node.attr("dtype").torch))]  # keep the rounding
        else:
            outs = eval_node(node, args, device, constants)
            if upcast:
                outs = [_upcast(o) for o in outs]
        for v, t in zip(node.outputs, outs):
            env[v.id] = t
    outs = [env[v.id] for v in graph.outputs]
    if upcast:
        return outs
    return [o.to(v.dtype.torch) for o, v in zip(outs, graph.outputs)]


def tolerance(dtype: DType, reduction_length: int = 1) -> tuple[float, float]:
    """(atol, rtol) for comparing a `dtype` result against the reference.

    Grows like sqrt(n) with the reduction length: rounding errors of an fp32 sum of n
    terms behave like a random walk.
    """
    base = {
        DType.float64: 1e-9,
        DType.float32: 1e-5,
        DType.bfloat16: 1.6e-2,
        DType.float16: 2e-3,
    }.get(dtype, 0.0)
    grow = math.sqrt(max(reduction_length, 1)) / 8 if dtype == DType.float32 else 1.0
    return base * max(grow, 1.0), base * max(grow, 1.0)
