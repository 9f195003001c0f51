"""Group fusible FX nodes into convex regions, on data dependencies only.

Nodes are visited in program order. A fusible node joins the region of one of its
producers when no path leaves that region and comes back through the node's other
operands (that would make the region depend on itself); regions that meet at a node
merge when no path runs between them through anything else. Side-effecting nodes
(mutation, RNG, asserts) are chained in program order, so no region can be placed
across one of them in a way that reorders them.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Hashable

from torch import fx


class _Dag:
    """The graph of units (regions and single nodes) as regions grow and merge."""

    def __init__(self) -> None:
        self.succ: dict[Hashable, set[Hashable]] = defaultdict(set)
        self.pred: dict[Hashable, set[Hashable]] = defaultdict(set)

    def edge(self, a: Hashable, b: Hashable) -> None:
        if a != b:
            self.succ[a].add(b)
            self.pred[b].add(a)

    def reaches(self, src: Hashable, dst: Hashable, skip_direct: bool = False) -> bool:
        """Whether a path src -> dst exists (with skip_direct, one of two edges or more)."""
        start = [s for s in self.succ[src] if not (skip_direct and s == dst)]
        seen, stack = set(start), start
        while stack:
            u = stack.pop()
            if u == dst:
                return True
            for v in self.succ[u]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return False

    def merge(self, keep: Hashable, gone: Hashable) -> None:
        for s in self.succ.pop(gone, set()):
            self.pred[s].discard(gone)
            self.edge(keep, s)
        for p in self.pred.pop(gone, set()):
            self.succ[p].discard(gone)
            self.edge(p, keep)
        self.succ[keep].discard(keep)
        self.pred[keep].discard(keep)


def form_regions(
    graph: fx.Graph,
    fusible: Callable[[fx.Node], bool],
    side_effect: Callable[[fx.Node], bool],
) -> list[list[fx.Node]]:
    """Convex groups of fusible nodes, each in program order, in order of first node."""
    dag = _Dag()
    region: dict[fx.Node, int] = {}
    members: dict[int, list[fx.Node]] = {}
    last_effect: fx.Node | None = None
    next_id = 0

    def unit(n: fx.Node) -> Hashable:
        return region.get(n, n)

    for n in graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        ins = [p for p in n.all_input_nodes if p.op not in ("placeholder", "get_attr")]
        projection = n.target is operator.getitem and n.args[0] in region
        if not (projection or fusible(n)):
            for p in ins:
                dag.edge(unit(p), n)
            if side_effect(n):
                if last_effect is not None:
                    dag.edge(last_effect, n)
                last_effect = n
            continue
        candidates = list(dict.fromkeys(region[p] for p in ins if p in region))
        chosen = next(
            (
                r
                for r in candidates
                if not any(dag.reaches(r, unit(p)) for p in ins if unit(p) != r)
            ),
            None,
        )
        if chosen is None:
            chosen = next_id
            next_id += 1
            members[chosen] = []
        region[n] = chosen
        members[chosen].append(n)
        for p in ins:
            dag.edge(unit(p), chosen)
        for other in candidates:
            if other == chosen or other not in members:
                continue
            if dag.reaches(chosen, other, True) or dag.reaches(other, chosen, True):
                continue
            for m in members.pop(other):
                region[m] = chosen
                members[chosen].append(m)
            dag.merge(chosen, other)
    order = {n: i for i, n in enumerate(graph.nodes)}
    groups = [sorted(ms, key=order.__getitem__) for ms in members.values()]
    return sorted(groups, key=lambda g: order[g[0]])
