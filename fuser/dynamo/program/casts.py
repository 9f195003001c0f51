"""Casts launched together: a horizontal fusion in the call program.

Under autocast a step casts every weight to bf16 in the forward and each weight's
gradient back to float32 in the backward: each cast is a region of its own (a lone
`_to_copy`), a tiny kernel whose launch costs more host time than its GPU time (~170 of
the ~1000 launches of a 12-layer Llama step). Casts marked by regions.py (Step.cast) are
gathered and launched as one CastGroup (fuser/runtime/cast_group.py):
- a cast of a graph input can run earlier than where it stands, since its source exists
  from the program's start: consecutive ones are launched at the first one's place;
- a cast of a computed value can run later, until something reads its result: consecutive
  ones are launched at the place of the first step that reads one of their results (the
  gradients' casts are read only by the return).

Limits keep it safe and cheap:
- at most MAX_TENSORS casts a launch;
- at most MAX_BYTES of their results made early, or of their sources held late (a cast
  over it alone is not moved);
- a cast of a result its group has not written yet waits for the next launch;
- no group spans an in-place call (it could change a source between the group's place
  and the cast's own) or a region called as a module;
- one device a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fuser.config import config
from fuser.dynamo.program.copies import OWN_CALLS
from fuser.dynamo.program.step import Cast, Step
from fuser.dynamo.program.steps import Names
from fuser.runtime.cast_group import MAX_ELEMENTS, MAX_TENSORS, CastGroup

MAX_BYTES = 64 * 2**20  # results a group makes ahead of their use, at most


@dataclass
class _Group:
    device: object
    members: list[tuple[Step, Step]] = field(default_factory=list)  # (alloc, launch)
    nbytes: int = 0

    def takes(self, launch: Step, nbytes: int) -> bool:
        return (
            launch.device == self.device
            and len(self.members) < MAX_TENSORS
            and self.nbytes + nbytes <= MAX_BYTES
        )

    def steps(self, names: Names) -> list[Step]:
        if len(self.members) == 1:
            return list(self.members[0])
        casts = [launch.cast for _, launch in self.members if launch.cast is not None]
        group = CastGroup(tuple(c.numel for c in casts), tuple((c.src, c.dst) for c in casts))
        g = names.bind(group, "cast_group")
        tensors = [name for c in casts for name in (c.source, c.result)]
        # launched directly on the program's stream where its casts were (a GPU kernel's
        # compiled launcher): the program keeps the per-call checks of such launches
        # (emit.py: a backward's input on another device goes the old way)
        direct = any(launch.on_stream for _, launch in self.members)
        stream = ", stream" if direct else ""
        code = f"{g}.launch([{', '.join(tensors)}]{stream})  # {len(casts)} casts, one launch"
        launch = Step(
            "launch", (), tuple(tensors), code, on_stream=direct, device=self.device,
            op="cast group",
        )  # fmt: skip
        return [alloc for alloc, _ in self.members] + [launch]


def _moved_bytes(c: Cast) -> int:
    """The memory a cast moved by the grouping keeps longer: a hoisted cast's result
    (made early), a sunk cast's source (held late; float32 gradients' sources are
    bfloat16, but a float32 value cast to bfloat16 holds twice its result's bytes)."""
    return c.numel * (c.dst.itemsize if c.where == "input" else c.src.itemsize)


def _barrier(s: Step) -> bool:
    """A step no group moves across: it may write a value a cast reads. A region called
    as a module; an ATen call whose schema mutates (copy_, add_.Tensor); any other Python
    function of the graph (ce_scale's scale_in_place). The program's own copies and an
    inlined region's segment ops write only their results."""
    if s.kind == "region":
        return True
    if s.kind != "call" or s.op in OWN_CALLS or s.op.startswith("ir."):
        return False
    parts = s.op.split(".")  # op_name: "aten.mm", "aten.add_.Tensor"
    if parts[0] != "aten" or len(parts) not in (2, 3):
        return True
    packet = getattr(torch.ops.aten, parts[1], None)
    op = getattr(packet, parts[2] if len(parts) == 3 else "default", None)
    return op is None or op._schema.is_mutable


def _pair(steps: list[Step], i: int, where: str) -> Cast | None:
    """The marked cast of kind `where` whose result steps[i] allocates, if steps[i + 1]."""
    s, nxt = steps[i], steps[i + 1] if i + 1 < len(steps) else None
    if s.kind != "alloc" or nxt is None or nxt.cast is None:
        return None
    c = nxt.cast
    return c if c.result == s.defines[0] and c.numel <= MAX_ELEMENTS and c.where == where else None


def _hoisted(steps: list[Step], names: Names) -> list[Step]:
    """Casts of graph inputs, consecutive ones at the first one's place."""
    out: list[Step | _Group] = []
    group: _Group | None = None
    i = 0
    while i < len(steps):
        cast = _pair(steps, i, "input")
        if cast is not None:
            launch, nbytes = steps[i + 1], _moved_bytes(cast)
            if group is None or not group.takes(launch, nbytes):
                group = _Group(launch.device)
                out.append(group)
            group.members.append((steps[i], launch))
            group.nbytes += nbytes
            i += 2
            continue
        if _barrier(steps[i]):
            group = None
        out.append(steps[i])
        i += 1
    return [x for item in out for x in (item.steps(names) if isinstance(item, _Group) else [item])]


def _sunk(steps: list[Step], names: Names) -> list[Step]:
    """Casts of computed values, consecutive ones at the place of the first step that
    reads one of their results (or a barrier, or the end)."""
    out: list[Step] = []
    group: _Group | None = None
    made: set[str] = set()
    i = 0
    while i < len(steps):
        cast = _pair(steps, i, "value")
        if cast is not None:
            launch, nbytes = steps[i + 1], _moved_bytes(cast)
            # a cast of a result still waiting in the group reads what the group writes
            # (no order between one grid's programs): the group goes first
            waits = cast.source in made
            if group is not None and (waits or not group.takes(launch, nbytes)):
                out += group.steps(names)
                group, made = None, set()
            if nbytes > MAX_BYTES:  # no group takes it: not held late for nothing
                out += steps[i : i + 2]
                i += 2
                continue
            group = group or _Group(launch.device)
            group.members.append((steps[i], launch))
            group.nbytes += nbytes
            made.add(cast.result)
            i += 2
            continue
        s = steps[i]
        if group is not None and (_barrier(s) or made.intersection(s.uses)):
            out += group.steps(names)
            group, made = None, set()
        out.append(s)
        i += 1
    if group is not None:
        out += group.steps(names)
    return out


def group_casts(steps: list[Step], names: Names) -> list[Step]:
    """`steps` with runs of marked casts (Step.cast, each right after its result's
    allocation) launched together; unchanged where FUSER_CAST_GROUPS=0."""
    if not config.cast_groups:
        return steps
    return _sunk(_hoisted(steps, names), names)
