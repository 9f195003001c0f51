"""The graph IR: dtypes, ops, values, nodes, graphs, verifier, printer, reference evaluator."""

from fuser.ir.dtypes import DType
from fuser.ir.graph import Graph, Node, Value
from fuser.ir.ops import Op

__all__ = ["DType", "Graph", "Node", "Op", "Value"]
