"""Print a graph as readable text, and as a runnable FusionDefinition repro."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fuser.ir.dtypes import DType
from fuser.ir.ops import Op

if TYPE_CHECKING:  # annotations only: Graph.__str__ calls graph_text
    from fuser.ir.graph import Graph, Node, Value


def _fmt(v: Any) -> str:
    if isinstance(v, DType):
        return repr(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, str):  # e.g. approximate='tanh': quoted, so the repro runs
        return repr(v)
    return str(v)


def _float(v: float) -> str:
    # repr(inf) is `inf`, which is not a Python name
    return repr(v) if math.isfinite(v) else f"float('{v}')"


def _shape(v: Value) -> str:
    return "[" + ", ".join(str(d) for d in v.shape) + "]"


def _attrs(node: Node, skip: tuple[str, ...] = ()) -> list[str]:
    return [f"{k}={_fmt(v)}" for k, v in node.attrs if k not in skip]


def graph_text(graph: Graph) -> str:
    """The graph as text: one line per node with the output's dtype and shape."""
    lines = [
        f"fusion ({graph.origin}): {len(graph.inputs)} inputs, {len(graph.nodes)} nodes, "
        f"{len(graph.outputs)} outputs"
    ]
    for v in graph.inputs:
        lines.append(f"  input  {v.name}: {v.dtype.short}{_shape(v)}")
    for n in graph.nodes:
        outs = ", ".join(f"{v.name}: {v.dtype.short}{_shape(v)}" for v in n.outputs)
        args = [v.name for v in n.inputs] + _attrs(n, skip=("params",))
        lines.append(f"  {outs} = {n.op.value}({', '.join(args)})")
    lines.append("  output " + ", ".join(v.name for v in graph.outputs))
    return "\n".join(lines)


def _define_tensor(v: Value) -> str:
    dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in v.shape)
    return f"    {v.name} = fd.define_tensor(shape=[{dims}], dtype={v.dtype!r})"


def _call(node: Node) -> str:
    outs = ", ".join(v.name for v in node.outputs)
    if node.op == Op.CONST:
        value = node.attr("value")
        value = _float(value) if isinstance(value, float) else repr(value)
        return f"    {outs} = fd.define_scalar({value}, dtype={node.attr('dtype')!r})"
    params = node.attr("params")
    if params is not None:  # layer_norm / rms_norm: optional weight and bias by keyword
        args = [node.inputs[0].name]
        args += [f"{p}={v.name}" for p, v in zip(params, node.inputs[1:])]
        args += _attrs(node, skip=("params",))
    elif node.op == Op.CAT:  # fd.ops.cat takes its tensors as one list
        args = ["[" + ", ".join(v.name for v in node.inputs) + "]", *_attrs(node)]
    else:
        args = [v.name for v in node.inputs] + _attrs(node)
    return f"    {outs} = fd.ops.{node.op.value}({', '.join(args)})"


def graph_repro(graph: Graph) -> str:
    """Python source that rebuilds the graph with the FusionDefinition API."""
    lines = ["import torch", "import fuser", "", "with fuser.FusionDefinition() as fd:"]
    # inputs where they were defined, so the rebuilt fusion numbers its values the same
    pending = list(graph.inputs)
    for n in graph.nodes:
        first = min((v.id for v in n.outputs), default=0)
        while pending and pending[0].id < first:
            lines.append(_define_tensor(pending.pop(0)))
        lines.append(_call(n))
    lines += [_define_tensor(v) for v in pending]
    lines += [f"    fd.add_output({v.name})" for v in graph.outputs]
    return "\n".join(lines) + "\n"
