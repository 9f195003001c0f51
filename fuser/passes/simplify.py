"""Small graph -> graph passes: concretize, cast elimination, CSE, DCE, constant folding."""

from __future__ import annotations

from typing import Any

import sympy
import torch

from fuser.ir.dtypes import DType
from fuser.ir.evaluate import eval_node
from fuser.ir.graph import Graph, Node, Value
from fuser.ir.ops import ELEMENTWISE, Op
from fuser.ir.verify import verify
from fuser.passes.rewriter import Rewriter


# -- concretize: bind symbolic sizes to the sizes of actual inputs -------------------
def _subst(x: Any, binding: dict) -> Any:
    if isinstance(x, sympy.Expr):
        y = x.subs(binding)
        return (int(y) if y.is_integer else float(y)) if y.is_number else y
    if isinstance(x, tuple):
        return tuple(_subst(e, binding) for e in x)
    return x


def concretize(graph: Graph, binding: dict[sympy.Symbol, int]) -> Graph:
    """Substitute every symbolic size; the verifier then re-checks every shape with ints."""
    vals: dict[int, Value] = {}

    def value(v: Value) -> Value:
        if v.id not in vals:
            vals[v.id] = Value(v.id, _subst(v.shape, binding), v.dtype)
        return vals[v.id]

    nodes = tuple(
        Node(
            n.op,
            tuple(value(v) for v in n.inputs),
            tuple(value(v) for v in n.outputs),
            tuple((k, _subst(a, binding)) for k, a in n.attrs),
        )
        for n in graph.nodes
    )
    g = Graph(
        tuple(value(v) for v in graph.inputs),
        nodes,
        tuple(value(v) for v in graph.outputs),
        graph.origin + "+concrete",
    )
    return verify(g)


# -- cast elimination ----------------------------------------------------------------
# casts that represent every value of the source exactly: undoing them loses nothing
_EXACT_WIDENING = {
    (DType.float16, DType.float32),
    (DType.bfloat16, DType.float32),
    (DType.float16, DType.float64),
    (DType.bfloat16, DType.float64),
    (DType.float32, DType.float64),
    (DType.int32, DType.int64),
    (DType.bool, DType.int32),
    (DType.bool, DType.int64),
    (DType.bool, DType.float32),
    (DType.bool, DType.float16),
    (DType.bool, DType.bfloat16),
    (DType.bool, DType.float64),
}


def eliminate_casts(graph: Graph, relaxed_precision: bool = False) -> Graph:
    """Drop casts that change nothing.

    - `cast(x, x.dtype)` is x;
    - `cast(cast(x, wide), d)` where x -> wide is exact is `cast(x, d)` (so
      `half(float(h))` is h);
    - only with `relaxed_precision`: `cast(cast(x, narrow), x.dtype)` is x, which skips a
      real rounding (`float(half(f))` is not f in general).
    """
    rw = Rewriter(graph, "eliminate_casts")
    producer = graph.producers()
    for node in graph.nodes:
        if node.op != Op.CAST:
            rw.keep(node)
            continue
        target, origin = node.attr("dtype"), node.inputs[0]
        # walk back through a chain of casts while each one can be undone
        while (inner := producer.get(origin.id)) is not None and inner.op == Op.CAST:
            src = inner.inputs[0]
            lossless = (src.dtype, origin.dtype) in _EXACT_WIDENING
            # relaxed skips float roundings only: float(int(x)) truncates, it is no rounding
            rounding = src.dtype == target and src.dtype.is_float and origin.dtype.is_float
            if not (lossless or (relaxed_precision and rounding)):
                break
            origin = src
        src_t = rw.get(origin)
        rw.replace(node, [src_t if origin.dtype == target else rw.ops.cast(src_t, target)])
    return rw.finish()


# -- common subexpression elimination ------------------------------------------------
def cse(graph: Graph) -> Graph:
    """Merge nodes that apply the same op with the same attrs to the same values."""
    rw = Rewriter(graph, "cse")
    seen: dict[tuple, list[Value]] = {}
    for node in graph.nodes:
        ins = tuple(rw.env[v.id].id for v in node.inputs)
        key = (node.op, ins, _hashable(node.attrs), tuple(v.dtype for v in node.outputs))
        if key in seen:
            rw.replace(node, seen[key])
            continue
        rw.keep(node)
        seen[key] = [rw.env[v.id] for v in node.outputs]
    return rw.finish()


def _hashable(attrs: tuple) -> tuple:
    # 1 and 1.0 and True hash alike in Python; keep their types apart
    return tuple((k, type(v).__name__, v) for k, v in attrs)


# -- dead code elimination -----------------------------------------------------------
def dce(graph: Graph) -> Graph:
    """Remove nodes no output depends on."""
    live = {v.id for v in graph.outputs}
    keep = []
    for node in reversed(graph.nodes):
        if any(v.id in live for v in node.outputs):
            keep.append(node)
            live.update(v.id for v in node.inputs)
    return verify(Graph(graph.inputs, tuple(reversed(keep)), graph.outputs, "dce"))


# -- constant folding ----------------------------------------------------------------
def fold_constants(graph: Graph) -> Graph:
    """Evaluate elementwise nodes whose operands are all constants."""
    rw = Rewriter(graph, "fold_constants")
    consts: dict[int, Any] = {}
    for node in graph.nodes:
        if node.op == Op.CONST:
            rw.keep(node)
            value = node.attr("value")
            if not isinstance(value, sympy.Expr):
                consts[node.out.id] = value
            continue
        ins = [rw.env[v.id].id for v in node.inputs]
        if node.op in ELEMENTWISE and ins and all(i in consts for i in ins):
            args = [torch.tensor(consts[i], dtype=v.dtype.torch) for i, v in zip(ins, node.inputs)]
            (result,) = eval_node(node, args, torch.device("cpu"))
            folded = rw.builder.const(result.item(), node.out.dtype)
            consts[folded.value.id] = result.item()
            rw.replace(node, [folded])
            continue
        rw.keep(node)
    return rw.finish()
