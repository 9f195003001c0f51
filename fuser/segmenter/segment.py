"""Split a graph into the fewest kernels that one scheduler each accepts.

Start with one group per node and merge groups along data edges while the merged group
still maps onto one kernel (see classify.py) and merging creates no cycle between
groups. Groups that no scheduler takes at all run as ATen ops, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from fuser.ir.graph import Graph, Node, Value
from fuser.ir.ops import Op
from fuser.segmenter.classify import Layout, Rejected, classify


@dataclass(frozen=True)
class Segment:
    """A set of nodes that runs as one kernel (layout set) or as ATen ops (reason set)."""

    index: int
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    layout: Layout | None
    reason: str = ""

    @property
    def fused(self) -> bool:
        return self.layout is not None

    def ops_summary(self) -> str:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.op != Op.CONST:
                counts[n.op.value] = counts.get(n.op.value, 0) + 1
        return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in counts.items())


def _try(nodes: list[Node]) -> Layout | None:
    try:
        return classify(nodes)
    except Rejected:
        return None


def _boundary(graph: Graph, members: list[Node]) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    produced = {v.id for n in members for v in n.outputs}
    inputs: dict[int, Value] = {}
    for n in members:
        for v in n.inputs:
            if v.id not in produced:
                inputs.setdefault(v.id, v)
    used_outside = {v.id for n in graph.nodes if n not in members for v in n.inputs}
    used_outside |= {v.id for v in graph.outputs}
    outputs = tuple(v for n in members for v in n.outputs if v.id in used_outside)
    return tuple(inputs.values()), outputs


def segment(graph: Graph) -> list[Segment]:
    """Partition `graph` (concrete, decomposed) into segments in execution order."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    consts = [n for n in graph.nodes if n.op == Op.CONST]
    work = [n for n in graph.nodes if n.op != Op.CONST]
    producer = {v.id: n for n in work for v in n.outputs}
    group_of = {n: i for i, n in enumerate(work)}
    groups: dict[int, list[Node]] = {i: [n] for i, n in enumerate(work)}

    def group_graph() -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(groups)
        for n in work:
            for v in n.inputs:
                p = producer.get(v.id)
                if p is not None and group_of[p] != group_of[n]:
                    g.add_edge(group_of[p], group_of[n])
        return g

    changed = True
    while changed:
        changed = False
        gg = group_graph()
        for a, b in sorted(gg.edges, key=lambda e: (min(order[n] for n in groups[e[0]]), e[1])):
            if a not in groups or b not in groups:
                continue
            # merging a -> b is legal only if no other path a -> ... -> b exists
            gg.remove_edge(a, b)
            other_path = nx.has_path(gg, a, b)
            gg.add_edge(a, b)
            if other_path:
                continue
            merged = sorted(groups[a] + groups[b], key=order.__getitem__)
            if _try(consts_for(merged, consts) + merged) is None:
                continue
            groups[a] = merged
            for n in groups.pop(b):
                group_of[n] = a
            changed = True
            break
    gg = group_graph()
    segments = []
    for i, gid in enumerate(
        nx.lexicographical_topological_sort(gg, key=lambda g: min(order[n] for n in groups[g]))
    ):
        members = consts_for(groups[gid], consts) + groups[gid]
        ins, outs = _boundary(graph, members)
        try:
            layout, reason = classify(members), ""
        except Rejected as e:
            layout, reason = None, str(e)
        segments.append(Segment(i, tuple(members), ins, outs, layout, reason))
    return segments


def consts_for(members: list[Node], consts: list[Node]) -> list[Node]:
    used = {v.id for n in members for v in n.inputs}
    return [c for c in consts if c.out.id in used]
