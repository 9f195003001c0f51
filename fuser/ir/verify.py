"""The verifier: re-derives every node's outputs and checks the graph is well formed."""

from __future__ import annotations

from fuser.errors import FuserError, VerificationError
from fuser.ir.graph import Graph
from fuser.ir.infer import infer, shapes_match


def verify(graph: Graph) -> Graph:
    """Return `graph` unchanged if it is well formed; otherwise raise naming the node."""
    defined = {v.id for v in graph.inputs}
    for node in graph.nodes:
        for v in node.inputs:
            if v.id not in defined:
                raise VerificationError(
                    f"[{graph.origin}] node `{node.describe()}` uses {v.name}, which is not "
                    "defined before it (not an input and not produced by an earlier node)"
                )
        try:
            expected = infer(node.op, node.inputs, dict(node.attrs))
        except FuserError as e:
            raise VerificationError(f"[{graph.origin}] node `{node.describe()}`: {e}") from e
        if len(expected) != len(node.outputs):
            raise VerificationError(
                f"[{graph.origin}] node `{node.describe()}` has {len(node.outputs)} outputs, "
                f"expected {len(expected)}"
            )
        for v, (shape, dtype) in zip(node.outputs, expected):
            if v.dtype != dtype or not shapes_match(v.shape, shape):
                raise VerificationError(
                    f"[{graph.origin}] node `{node.describe()}`: output {v.name} is "
                    f"{v.dtype.value}{list(v.shape)}, expected {dtype.value}{list(shape)}"
                )
            if v.id in defined:
                raise VerificationError(
                    f"[{graph.origin}] node `{node.describe()}` redefines {v.name}"
                )
            defined.add(v.id)
    for v in graph.outputs:
        if v.id not in defined:
            raise VerificationError(
                f"[{graph.origin}] output {v.name} is never computed by the graph"
            )
    return graph
