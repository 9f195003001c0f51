"""How much of a step's communication the GPU hides behind compute.

Under DDP each gradient bucket's all-reduce runs on NCCL's own stream while the backward
of the layers before it still runs on the compute stream; under FSDP2 the next block's
all-gather runs while this block computes. Where a backend's kernels serialize with the
collectives (a synchronisation it adds, a graph that waits for every gradient before the
first bucket is ready), the communication is exposed: the step is longer by its time.

The measure here reads the GPU activities of a torch.profiler trace (`events.py`):
communication is every kernel of NCCL (or gloo's copies, which never overlap: they go
through the host), compute every other kernel. For each step window it reports the time
the GPU spent communicating (the union of the communication kernels' intervals), how much
of it some compute kernel overlapped, and the rest: the exposed communication.
"""

from __future__ import annotations

from typing import Any

from fuser.profile.events import Activity, gpu_activities

COMM_MARKERS = ("nccl", "NCCL")


def is_comm(a: Activity) -> bool:
    """A collective's kernel (NCCL names them ncclKernel_… / ncclDevKernel_…)."""
    return a.kind == "kernel" and any(m in a.name for m in COMM_MARKERS)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the overlap of two sorted, disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def comm_overlap(activities: list[Activity]) -> dict[str, float]:
    """Communication time, the part of it overlapped by compute, the exposed rest and the
    compute time itself, in ms, over `activities` (one step window or several)."""
    comm, compute = [], []
    for a in activities:
        if a.kind != "kernel" or a.start is None or a.dur is None:
            continue
        (comm if is_comm(a) else compute).append((a.start, a.start + a.dur))
    comm_u, compute_u = _union(comm), _union(compute)
    comm_us, hidden_us = _length(comm_u), _intersection(comm_u, compute_u)
    return {
        "comm_ms": comm_us / 1e3,
        "comm_overlapped_ms": hidden_us / 1e3,
        "comm_exposed_ms": (comm_us - hidden_us) / 1e3,
        "compute_ms": _length(compute_u) / 1e3,
        "overlap_fraction": hidden_us / comm_us if comm_us > 0 else float("nan"),
        "comm_kernels": len(comm),
    }


def trace_overlap(trace: dict | list, steps: int = 1) -> dict[str, Any]:
    """`comm_overlap` of a whole trace, per step (the trace's totals divided by `steps`,
    the number of steps it holds)."""
    totals = comm_overlap(gpu_activities(trace))
    per_step = {k: v / steps for k, v in totals.items() if k.endswith("_ms")}
    return {
        **per_step,
        "overlap_fraction": totals["overlap_fraction"],
        "comm_kernels_per_step": totals["comm_kernels"] / steps,
        "steps": steps,
    }
