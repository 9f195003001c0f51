"""Host time of a call program's steps: where the Python of a training step goes.

With `FUSER_PROGRAM_CLOCK=1` (config.program_clock) at the time a program is built,
emit.py writes `tick(i)` after each step i (its line and the frees after it) and
`clock_start()` after the per-call checks; each tick adds the nanoseconds since the last
to step i (~0.1 us a tick). `host_table` sums them over the programs of a step by the
census's rows (an ATen op, a launch, a view, an allocation, a region module call), and
`slowest` names the single steps that cost most. The GPU does not enter into it: a
launch's time is its host side (argument packing and the driver's enqueue).

    python -m fuser.dynamo.program.census suite:llama --clock --batch 16 --seq 1024  # a GPU
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from fuser.dynamo.program.step import step_key


class StepClock:
    """Nanoseconds per step of one call program, summed over its calls."""

    def __init__(self, steps: int):
        self.ns = [0] * steps
        self.calls = 0
        self._last = 0

    def start(self) -> None:
        self.calls += 1
        self._last = time.perf_counter_ns()

    def tick(self, i: int) -> None:
        now = time.perf_counter_ns()
        self.ns[i] += now - self._last
        self._last = now

    def reset(self) -> None:
        self.ns = [0] * len(self.ns)
        self.calls = 0


def _clocked(programs: Iterable[Any]) -> list[Any]:
    return [p for p in programs if p is not None and p.clock is not None]


def host_rows(programs: Iterable[Any], steps: int) -> list[tuple[str, float, float]]:
    """(census row, calls per training step, host us per training step), most costly
    first, over the clocked `programs` run for `steps` training steps."""
    count: dict[str, float] = {}
    us: dict[str, float] = {}
    steps = max(steps, 1)
    for p in _clocked(programs):
        per_step = p.clock.calls / steps
        for s, ns in zip(p.steps, p.clock.ns):
            key = step_key(s)
            count[key] = count.get(key, 0.0) + per_step
            us[key] = us.get(key, 0.0) + ns / 1e3 / steps
    return sorted(((k, count[k], us[k]) for k in us), key=lambda r: -r[2])


def slowest(programs: Iterable[Any], top: int = 15) -> list[tuple[float, str, str]]:
    """The `top` single steps of most host time per call: (us, program, first line)."""
    out = []
    for p in _clocked(programs):
        calls = max(p.clock.calls, 1)
        for s, ns in zip(p.steps, p.clock.ns):
            line = (s.code.strip() or s.kind).splitlines()[0]
            out.append((ns / 1e3 / calls, p.name, line[:110]))
    return sorted(out, reverse=True)[:top]


def host_table(programs: Iterable[Any], steps: int, wall_ms: float | None = None) -> str:
    """The host time of `steps` training steps' clocked programs by census row, and the
    program total against the step's wall time where `wall_ms` (per step) is given."""
    programs = list(programs)
    rows = host_rows(programs, steps)
    total = sum(r[2] for r in rows)
    head = "host time by step kind (per training step)"
    lines = [f"{head:<64}{'calls':>8}{'us':>10}{'us each':>9}"]
    for key, n, us in rows:
        label = key if len(key) <= 62 else key[:59] + "..."
        each = us / n if n else 0.0
        lines.append(f"{label:<64}{n:>8.0f}{us:>10.0f}{each:>9.1f}")
    lines.append(f"{'programs, all steps':<64}{'':>8}{total:>10.0f}")
    if wall_ms is not None:
        lines.append(
            f"{'the step (wall, synchronized)':<64}{'':>8}{wall_ms * 1e3:>10.0f}"
            f"  ({wall_ms * 1e3 - total:.0f} us outside the programs: Dynamo, AOTAutograd,"
            " autograd, the optimizer, the GPU's tail)"
        )
    for p in _clocked(programs):
        us = sum(p.clock.ns) / 1e3 / max(steps, 1)
        lines.append(f"  program {p.name[:60]}: {us:.0f} us a step over {len(p.steps)} steps")
    lines.append("slowest single steps (us a call, program, line):")
    lines += [f"  {us:8.1f}  {name[:24]:<24}  {line}" for us, name, line in slowest(programs)]
    return "\n".join(lines)
