"""The call program's memory plan: free every buffer after its last use, and give a new
kernel output a dead buffer of the same shape, strides and dtype instead of allocating.

Liveness is by name; storage is by root: a view's root is its base's, an ATen result
that AOTAutograd's fake tensors say shares an input's storage has that input's roots. A
buffer may be taken over only when every name aliasing its storage is dead and none is
returned (a graph output, a tensor saved for the backward, or a view of one), and only
buffers the program allocated itself (kernel outputs and workspaces) are taken over:
nobody else can hold a reference to them. Reuse is in program order on one stream, so a
kernel writing a taken-over buffer runs after every kernel that read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuser.dynamo.program.step import Step

NEVER = 1 << 30  # the last use of a returned name


@dataclass
class MemoryPlan:
    """free_after[i]: names dropped after step i (-1: right after the inputs are unpacked);
    reuse[i]: the dead buffer that allocation step i takes over."""

    free_after: dict[int, list[str]] = field(default_factory=dict)
    reuse: dict[int, str] = field(default_factory=dict)

    @property
    def frees(self) -> int:
        return sum(len(v) for v in self.free_after.values())


def storage_roots(steps: list[Step], inputs: list[str]) -> dict[str, set[str]]:
    roots = {name: {name} for name in inputs}
    for s in steps:
        for d in s.defines:
            alias = [r for a in s.aliases for r in roots.get(a, {a})]
            roots[d] = set(alias) if s.aliases else {d}
    return roots


def _last_uses(steps: list[Step], inputs: list[str], returned: list[str]) -> dict[str, int]:
    last = {name: -1 for name in inputs}
    for i, s in enumerate(steps):
        for d in s.defines:
            last[d] = i  # dead at once unless read later
        for u in s.uses:
            if u in last:  # not a global (a constant of the graph)
                last[u] = i
    for r in returned:
        if r in last:
            last[r] = NEVER
    return last


def plan_memory(
    steps: list[Step], inputs: list[str], returned: list[str], reuse: bool = True
) -> MemoryPlan:
    roots = storage_roots(steps, inputs)
    last = _last_uses(steps, inputs, returned)
    # a storage dies with the last of the names that share it
    death: dict[str, int] = {}
    for name, rs in roots.items():
        for r in rs:
            death[r] = max(death.get(r, -1), last[name])
    owned = {s.defines[0]: s.alloc for s in steps if s.kind == "alloc"}
    dying: dict[int, list[str]] = {}
    for r, at in death.items():
        if r in owned and at < NEVER:
            dying.setdefault(at, []).append(r)

    plan = MemoryPlan()
    pool: dict[tuple, list[str]] = {}
    held: set[str] = set()  # dead buffers whose names are kept for a later allocation
    for i, s in enumerate(steps):
        if reuse and s.kind == "alloc" and pool.get(s.alloc):
            plan.reuse[i] = pool[s.alloc].pop()
        for r in dying.get(i, ()):
            if reuse:
                pool.setdefault(owned[r], []).append(r)
                held.add(r)
    taken = set(plan.reuse.values())
    for name, at in last.items():
        if at >= NEVER:
            continue
        if name in taken:
            continue  # dropped where the next allocation takes it over
        at = death[name] if name in held and name in owned else at
        plan.free_after.setdefault(at, []).append(name)
    return plan
