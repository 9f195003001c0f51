"""Clones the call program does not need: a clone of a tensor in the same layout, where
nothing could tell the clone from its source.

AOTAutograd's graphs are functional: a clone is there so that two values never share
storage (dropout of p=0 is a clone; so is `.contiguous()` of a tensor that already is).
Sharing is harmless when nobody can see it. A clone `y = clone(x)` (the first call saw
both in one layout) becomes the name `y = x` when either

- its source dies with it: no name sharing x's storage is read after the clone or
  returned, and that storage is the program's own (a kernel's buffer, a fresh ATen
  result; not a graph input, not a constant), so y simply takes it over; or
- the clone stays local: no name sharing y's storage is returned (a graph output, a
  tensor saved for the backward), and no later call that may write a tensor in place
  (an ATen op whose schema says so, any Python function of the graph) is given one
  sharing x's or y's storage.

The memory plan (memory.py) then sees y share x's storage and frees or reuses it after
the last of both.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from fuser.dynamo.program.memory import NEVER, storage_roots
from fuser.dynamo.program.step import Step


def elide_clones(
    steps: list[Step], inputs: list[str], returned: list[str], clones: dict[str, str]
) -> list[Step]:
    """`steps` with each clone of `clones` (the name it defines -> its source's, both in
    one layout) that nobody can tell from its source written as a name."""
    if not clones:
        return steps
    steps = list(steps)
    writers = [i for i, s in enumerate(steps) if _may_write(s)]
    for i, s in enumerate(steps):
        if s.kind != "call" or len(s.defines) != 1 or s.defines[0] not in clones:
            continue
        y, x = s.defines[0], clones[s.defines[0]]
        # recomputed after each change: an elided clone joins its source's storage
        roots = storage_roots(steps, inputs)
        last = _last_uses(steps, returned)
        owned = _owned(steps)
        sharing_x = [n for n, rs in roots.items() if rs & roots[x]]
        sharing_y = [n for n, rs in roots.items() if rs & roots[y]]
        dies = all(last.get(n, -1) <= i for n in sharing_x) and roots[x] <= owned
        both = roots[x] | roots[y]
        written = any(roots.get(u, {u}) & both for w in writers if w > i for u in steps[w].uses)
        local = not written and all(last.get(n, -1) < NEVER for n in sharing_y)
        if dies or local:
            why = "its source dies here" if dies else "neither is written; the clone is local"
            code = f"{y} = {x}  # no clone: {why}"
            steps[i] = replace(s, uses=(x,), code=code, aliases=(x,), kind="view", op="alias")
    return steps


# the copies and segment ops of inlined regions (regions.py, segments.py): all functional
OWN_CALLS = ("clone", "restride", "clone+restride", "contiguous", "alias")


def _may_write(s: Step) -> bool:
    """Whether a call may write a tensor it is given: an ATen op whose schema says so
    (copy_, fill_...), or any Python function of the graph (ce_scale's scale_in_place)."""
    if s.kind != "call" or s.op in OWN_CALLS or s.op.startswith("ir."):
        return False
    parts = s.op.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return True
    op = getattr(getattr(torch.ops.aten, parts[1], None), parts[2], None)
    return op is None or op._schema.is_mutable


def _last_uses(steps: list[Step], returned: list[str]) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for name in (*s.defines, *s.uses):
            last[name] = i
    for r in returned:
        last[r] = NEVER
    return last


def _owned(steps: list[Step]) -> set[str]:
    """Names whose storage the program made: allocations and fresh results."""
    made = ("alloc", "call", "region")
    return {d for s in steps if s.kind in made and not s.aliases for d in s.defines}
