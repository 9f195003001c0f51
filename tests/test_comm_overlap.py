"""The communication-overlap measure (fuser/profile/overlap.py) on hand-made activities and
a hand-made Chrome trace: what it calls hidden and exposed is what the intervals say."""

from __future__ import annotations

import math

import pytest

from fuser.profile.events import Activity
from fuser.profile.overlap import comm_overlap, trace_overlap


def _k(name: str, start: float, dur: float, stream: int = 7) -> Activity:
    return Activity(name, "kernel", start, dur, stream)


def test_partly_hidden_all_reduce() -> None:
    acts = [
        _k("gemm", 0, 100),
        _k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 60, 80, stream=20),  # 40 of 80 hidden
        _k("elementwise", 90, 10),  # inside the gemm's interval: no extra cover
        _k("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 10, stream=20),  # fully exposed
        _k("layer_norm", 300, 50),
    ]
    got = comm_overlap(acts)
    assert got["comm_ms"] == pytest.approx(0.090)
    assert got["comm_overlapped_ms"] == pytest.approx(0.040)
    assert got["comm_exposed_ms"] == pytest.approx(0.050)
    assert got["compute_ms"] == pytest.approx(0.150)
    assert got["overlap_fraction"] == pytest.approx(40 / 90)
    assert got["comm_kernels"] == 2


def test_overlapping_collectives_count_once() -> None:
    acts = [
        _k("ncclKernel_AllGather", 0, 50, stream=20),
        _k("ncclKernel_ReduceScatter", 25, 50, stream=21),  # union is 0..75
        _k("matmul", 10, 100),  # covers 10..75 of it
        Activity("Memcpy DtoD", "memcpy", 0, 500, 7),  # not a kernel: ignored
    ]
    got = comm_overlap(acts)
    assert got["comm_ms"] == pytest.approx(0.075)
    assert got["comm_overlapped_ms"] == pytest.approx(0.065)


def test_no_communication() -> None:
    got = comm_overlap([_k("gemm", 0, 10)])
    assert got["comm_ms"] == 0 and math.isnan(got["overlap_fraction"])


def test_trace_per_step() -> None:
    def ev(name: str, ts: float, dur: float, stream: int) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
                "args": {"stream": stream}}  # fmt: skip

    trace = {"traceEvents": [
        ev("gemm", 0, 100, 7), ev("ncclDevKernel_AllReduce", 50, 100, 20),
        ev("gemm", 1000, 100, 7), ev("ncclDevKernel_AllReduce", 1050, 100, 20),
    ]}  # fmt: skip
    got = trace_overlap(trace, steps=2)
    assert got["comm_ms"] == pytest.approx(0.100)  # per step
    assert got["comm_exposed_ms"] == pytest.approx(0.050)
    assert got["overlap_fraction"] == pytest.approx(0.5)
    assert got["comm_kernels_per_step"] == 1
