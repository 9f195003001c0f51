"""The header every generated kernel starts with: the fusion, the schedule and why."""

from __future__ import annotations

from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec


def header_lines(spec: KernelSpec, schedule: Schedule, backend: str) -> list[str]:
    lines = [
        f"fuser kernel {spec.name} ({backend}), generated: edit the fusion, not this file",
        f"domain: {spec.rows} rows x {spec.cols} cols; ops: {spec.segment.ops_summary()}",
        "arguments:",
    ]
    for a in spec.args:
        role = "out" if a.is_output else "in "
        rows = (
            "rows (size, stride) " + " x ".join(f"({n}, {st})" for n, st in a.row_dims)
            if a.row_dims
            else f"row stride {a.row_stride}"
        )
        lines.append(
            f"  {role} {a.name}: {a.dtype.value} {a.kind.value}, {rows}, "
            f"col stride {a.col_stride}, {a.align}-byte aligned"
        )
    lines += schedule.explain().splitlines()
    return lines
