"""Which scheduler takes a kernel: the one entry point the executor and the sweep use.

heuristics.py holds the pointwise and inner (persistent and looped) schedulers and hands
outer (column) reductions to outer.py; inner_outer.py builds on them for kernels with row
and column reductions.
"""

from __future__ import annotations

from fuser.backends.base import Backend
from fuser.schedulers import heuristics
from fuser.schedulers.device import Device
from fuser.schedulers.inner_outer import inner_outer_candidates, schedule_inner_outer
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec


def choose_schedule(spec: KernelSpec, dev: Device, backend: Backend | str = "triton") -> Schedule:
    """The heuristic's schedule for `spec` on `dev`, chosen with `backend`'s estimate
    (InnerOuterSplit where a kernel with row and column reductions does not fit)."""
    if spec.layout.inner_outer:
        return schedule_inner_outer(spec, dev, backend)
    return heuristics.choose_schedule(spec, dev, backend)


def candidate_schedules(
    spec: KernelSpec, dev: Device, backend: Backend | str = "triton"
) -> list[Schedule]:
    """Every legal schedule the heuristics choose among, the chosen one included."""
    if spec.layout.inner_outer:
        out = inner_outer_candidates(spec, dev, backend)
        chosen = schedule_inner_outer(spec, dev, backend)
        unique = {f"{s.short()} {s.grid}": s for s in [*out, chosen]}
        return list(unique.values())
    return heuristics.candidate_schedules(spec, dev, backend)
