"""The one mechanism passes use to build a new graph out of an old one.

A pass walks the old nodes in order and, for each, either keeps it (`keep`), maps its
outputs to other values (`replace`), or emits new nodes through `ops` (the same
`fd.ops` API users write fusions with). `finish()` returns the new, verified graph.
"""

from __future__ import annotations

from fuser.frontend.builder import GraphBuilder, Tensor
from fuser.frontend.ops import Ops
from fuser.ir.graph import Graph, Node, Value
from fuser.ir.verify import verify


class Rewriter:
    def __init__(self, graph: Graph, origin: str):
        self.old = graph
        self.origin = origin
        self.builder = GraphBuilder()
        self.builder.inputs = list(graph.inputs)
        self.builder._ids = graph.next_id()
        self.ops = Ops(self.builder)
        self.env: dict[int, Value] = {v.id: v for v in graph.inputs}

    def get(self, v: Value) -> Tensor:
        """The new graph's handle for old value `v`."""
        return Tensor(self.builder, self.env[v.id])

    def args(self, node: Node) -> list[Tensor]:
        return [self.get(v) for v in node.inputs]

    def keep(self, node: Node) -> None:
        inputs = tuple(self.env[v.id] for v in node.inputs)
        if inputs == node.inputs:
            self.builder.nodes.append(node)
            for v in node.outputs:
                self.env[v.id] = v
        else:
            new = self.builder.add(
                node.op, [Tensor(self.builder, v) for v in inputs], dict(node.attrs)
            )
            self.replace(node, new)

    def replace(self, node: Node, new: list[Tensor] | list[Value]) -> None:
        for old, t in zip(node.outputs, new):
            self.env[old.id] = t.value if isinstance(t, Tensor) else t

    def finish(self) -> Graph:
        outputs = tuple(self.env[v.id] for v in self.old.outputs)
        g = Graph(tuple(self.builder.inputs), tuple(self.builder.nodes), outputs, self.origin)
        return verify(g)
