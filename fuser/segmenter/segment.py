"""Split a graph into the fewest kernels that one scheduler each accepts.

Start with one group per node and merge groups along data edges while the merged group
still maps onto one kernel (see classify.py) and merging creates no cycle between
groups. Groups that no scheduler takes at all run as ATen ops, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from fuser.ir.graph import Graph, Node, Value
from fuser.ir.ops import Op
from fuser.segmenter.classify import Kind, Layout, Rejected, classify


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


def _try(nodes: list[Node], split: frozenset[int] = frozenset()) -> Layout | None:
    try:
        layout = classify(nodes)
    except Rejected:
        return None
    if layout.inner_outer and any(v.id in split for n in nodes for v in n.outputs):
        return None  # its row did not fit registers with the column accumulators
    return layout


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


def segment(graph: Graph, split: frozenset[int] = frozenset()) -> list[Segment]:
    """Partition `graph` (concrete, decomposed) into segments in execution order. A group
    holding a value of `split` (an inner-outer kernel's whose row did not fit) is not
    merged into a kernel with both row and column reductions."""
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
            if not _merge(groups, group_of, consts, order, a, b, split):
                continue
            changed = True
            break
    _merge_siblings(groups, group_of, consts, order, group_graph, split)
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


def _merge(
    groups: dict[int, list[Node]],
    group_of: dict[Node, int],
    consts: list[Node],
    order: dict[Node, int],
    a: int,
    b: int,
    split: frozenset[int],
) -> bool:
    """Merge group b into group a if the two still map onto one kernel; whether it did."""
    merged = sorted(groups[a] + groups[b], key=order.__getitem__)
    if _try(consts_for(merged, consts) + merged, split) is None:
        return False
    groups[a] = merged
    for n in groups.pop(b):
        group_of[n] = a
    return True


def _merge_siblings(
    groups: dict[int, list[Node]],
    group_of: dict[Node, int],
    consts: list[Node],
    order: dict[Node, int],
    group_graph: Callable[[], nx.DiGraph],
    split: frozenset[int],
) -> None:
    """Merge kernels with no edge between them that read the same FULL input, so that one
    kernel reads it once instead of twice:
    - a column-reduction kernel into a row-reduction kernel (db = sum over rows of dy
      beside dx's row kernel): one inner-outer kernel;
    - two pointwise kernels over one domain (the sin and cos of one angle tensor that
      two consumers take as separate broadcast inputs): one launch."""
    changed = True
    while changed:
        changed = False
        gg = group_graph()
        layouts = {g: _try(consts_for(ns, consts) + ns, split) for g, ns in groups.items()}
        for b, lb in layouts.items():
            if lb is None or lb.inner or not (lb.outer or _pointwise(lb)):
                continue
            reads_b = _full_inputs(groups[b], lb)
            for a, la in layouts.items():
                if a == b or la is None or la.domain != lb.domain:
                    continue
                if not (la.inner if lb.outer else _pointwise(la)):
                    continue
                if not reads_b & _full_inputs(groups[a], la):
                    continue
                if nx.has_path(gg, a, b) or nx.has_path(gg, b, a):
                    continue
                if not _merge(groups, group_of, consts, order, a, b, split):
                    continue
                changed = True
                break
            if changed:
                break


def _pointwise(layout: Layout) -> bool:
    return not layout.inner and not layout.outer


def _full_inputs(members: list[Node], layout: Layout) -> set[int]:
    """Ids of the FULL values `members` read but do not compute."""
    produced = {v.id for n in members for v in n.outputs}
    kinds = dict(layout.kinds)
    return {
        v.id
        for n in members
        for v in n.inputs
        if v.id not in produced and kinds.get(v.id) == Kind.FULL
    }


def consts_for(members: list[Node], consts: list[Node]) -> list[Node]:
    used = {v.id for n in members for v in n.inputs}
    return [c for c in consts if c.out.id in used]
