"""Immutable values, nodes and graphs.

A `Value` is one tensor: an id, a shape (ints, or sympy symbols for sizes taken from
the inputs at execute time) and a dtype. A `Node` applies an `Op` to input values and
produces output values. A `Graph` lists its inputs, its nodes in topological order and
its outputs; passes build new graphs instead of editing old ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Union

import sympy

from fuser.ir.dtypes import DType
from fuser.ir.ops import Op
from fuser.ir.printer import graph_text

Dim = Union[int, sympy.Expr]
Shape = tuple  # tuple[Dim, ...]


@dataclass(frozen=True)
class Value:
    id: int
    shape: Shape
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def name(self) -> str:
        return f"t{self.id}"

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.name}: {self.dtype.short}[{dims}]"


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def out(self) -> Value:
        return self.outputs[0]

    def describe(self) -> str:
        """One line naming the node, for error messages."""
        outs = ", ".join(v.name for v in self.outputs)
        ins = ", ".join(v.name for v in self.inputs)
        return f"{outs} = {self.op.value}({ins})"


def freeze_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    def frozen(v: Any) -> Any:
        return tuple(frozen(x) for x in v) if isinstance(v, (list, tuple)) else v

    return tuple((k, frozen(v)) for k, v in attrs.items())


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    # the pass that produced this graph, for printing the pipeline
    origin: str = field(default="definition", compare=False)

    def producers(self) -> dict[int, Node]:
        return {v.id: n for n in self.nodes for v in n.outputs}

    def users(self) -> dict[int, list[Node]]:
        use: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                use.setdefault(v.id, []).append(n)
        return use

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        for n in self.nodes:
            yield from n.outputs

    def next_id(self) -> int:
        return 1 + max((v.id for v in self.values()), default=-1)

    def ops(self) -> set[Op]:
        return {n.op for n in self.nodes}

    def is_symbolic(self) -> bool:
        return any(not isinstance(d, int) for v in self.values() for d in v.shape)

    def __str__(self) -> str:
        return graph_text(self)
