"""Casts of graph inputs launched together: a horizontal fusion in the call program.

Under autocast a step casts every weight to bf16 in the forward, and again in the
backward: each cast is a region of its own (a lone `_to_copy`), a tiny kernel whose
launch costs more host time than its GPU time (~150 of the ~1000 launches of a 12-layer
Llama step). A cast whose source is a graph input can run earlier than where it stands,
since its source exists from the program's start. So consecutive such casts, marked by
regions.py (Step.cast), are gathered at the first one's place and launched as one
CastGroup (fuser/runtime/cast_group.py).

Limits keep it safe and cheap:
- at most MAX_TENSORS casts a launch;
- at most MAX_BYTES of their results alive early: each result is made before its use, by
  at most one group's worth;
- no group spans an in-place call, which could change a source between the group's place
  and the cast's own;
- one device a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuser.config import config
from fuser.dynamo.program.step import Step
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
        casts = [launch.cast for _, launch in self.members]
        group = CastGroup(
            tuple(c[2] for c in casts),  # type: ignore[index]
            tuple((c[3], c[4]) for c in casts),  # type: ignore[index]
        )
        g = names.bind(group, "cast_group")
        tensors = [name for c in casts for name in c[:2]]  # type: ignore[index]
        code = f"{g}.launch([{', '.join(tensors)}])  # {len(casts)} casts, one launch"
        launch = Step("launch", (), tuple(tensors), code, device=self.device, op="cast group")
        return [alloc for alloc, _ in self.members] + [launch]


def _result_bytes(launch: Step) -> int:
    _, _, numel, _, dst = launch.cast  # type: ignore[misc]
    return numel * dst.itemsize


def _in_place(op: str) -> bool:
    """Whether an ATen call's op name ("aten.copy_", "aten.add_.Tensor") is in place."""
    parts = op.split(".")
    return len(parts) > 1 and parts[1].endswith("_")


def group_casts(steps: list[Step], names: Names) -> list[Step]:
    """`steps` with runs of marked casts (Step.cast, each right after its result's
    allocation) launched together at the first one's place; unchanged where
    FUSER_CAST_GROUPS=0."""
    if not config.cast_groups:
        return steps
    out: list[Step | _Group] = []
    group: _Group | None = None
    i = 0
    while i < len(steps):
        s = steps[i]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if (
            s.kind == "alloc"
            and nxt is not None
            and nxt.cast is not None
            and nxt.cast[1] == s.defines[0]
            and nxt.cast[2] <= MAX_ELEMENTS
        ):
            nbytes = _result_bytes(nxt)
            if group is None or not group.takes(nxt, nbytes):
                group = _Group(nxt.device)
                out.append(group)
            group.members.append((s, nxt))
            group.nbytes += nbytes
            i += 2
            continue
        if s.kind == "region" or (s.kind == "call" and _in_place(s.op)):
            group = None  # an in-place call (or an opaque module) may write a source
        out.append(s)
        i += 1
    result: list[Step] = []
    for item in out:
        result += item.steps(names) if isinstance(item, _Group) else [item]
    return result
