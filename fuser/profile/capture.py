"""Run a step function under the profiler and keep what the report needs.

In order, for one step function:
1. warm-up steps (the first compiles; its time is kept);
2. unprofiled steps, each timed from a synchronized start to a synchronize (as many again
   after the profiled passes: a host-bound step drifts, and the median of both halves is
   the step time the profile is checked against), with Python's garbage collections
   timed (gc.callbacks);
3. the timing pass (GPU only): torch.profiler with CUDA activities only, one step to settle
   and then `steps` steps, each a window stamped with the wall clock;
4. the attributes pass: CPU ops with their input shapes (record_shapes) and CUDA
   activities, with each fuser region call marked (regions.marked), one step to settle and
   one window. On a CPU it is the only pass: kernels run under Triton's interpreter, so
   only the structure (which ops, which fused kernels, their bytes) is recorded.
Each pass keeps its trace (the Chrome trace as a dict) and its windows on the trace clock.
"""

from __future__ import annotations

import datetime
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
import triton
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from fuser.dynamo import CAPTURES
from fuser.profile.regions import marked

STEP_MARK = "fuser.profile.step#"


@dataclass
class Pass:
    trace: dict
    windows: list[tuple[float, float]]  # µs on the trace clock
    step_ms: list[float]  # wall time of each window's step


@dataclass
class Capture:
    name: str
    cuda: bool
    timing: Pass | None
    attributes: Pass
    unprofiled_ms: list[float]
    first_step_s: float | None
    notes: list[str] = field(default_factory=list)
    unprofiled_after: list[float] = field(default_factory=list)  # after the profiled passes
    gc_ms: float | None = None  # Python GC pauses per unprofiled step

    def timing_info(self) -> dict[str, Any]:
        med = statistics.median
        every = self.unprofiled_ms + self.unprofiled_after
        out: dict[str, Any] = {
            "unprofiled": self.unprofiled_ms,
            "unprofiled_after": self.unprofiled_after,
            "unprofiled_ms": med(every) if every else None,
            "gc_ms_per_step": self.gc_ms,
            "first_step_s": self.first_step_s,
            "attributes_pass_ms": med(self.attributes.step_ms) if self.attributes.step_ms else None,
        }
        if self.timing is not None and self.timing.step_ms:
            out["profiled"] = self.timing.step_ms
            out["profiled_ms"] = med(self.timing.step_ms)
            out["profiled_by"] = "CUDA activities only"
        return out


def _fuser_version() -> str:
    try:
        return version("fuser")
    except PackageNotFoundError:
        return "?"


def environment() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor()})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "fuser": _fuser_version(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _timed_steps(step_fn: Callable[[], Any], n: int, cuda: bool, mark: bool = False) -> tuple:
    """n steps, each from a synchronized start to a synchronize: (wall-clock windows in
    Unix µs, ms of each)."""
    windows, ms = [], []
    for i in range(n):
        _sync(cuda)
        w0, p0 = time.time_ns(), time.perf_counter()
        if mark:
            with record_function(f"{STEP_MARK}{i}"):
                step_fn()
                _sync(cuda)
        else:
            step_fn()
            _sync(cuda)
        p1, w1 = time.perf_counter(), time.time_ns()
        windows.append((w0 / 1e3, w1 / 1e3))
        ms.append((p1 - p0) * 1e3)
    return windows, ms


class _GcClock:
    """Time spent in Python's garbage collector while installed in gc.callbacks."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._t0 = 0.0, 0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections += 1

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *a: Any) -> None:
        gc.callbacks.remove(self)


def export_trace(prof: Any) -> dict:
    fd, path = tempfile.mkstemp(suffix=".json", prefix="fuser-profile-")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def _on_trace_clock(trace: dict, windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Unix-µs windows on the trace's clock (Kineto's ts + baseTimeNanoseconds is Unix
    time); with no base in the trace, the step marks' own intervals."""
    base = trace.get("baseTimeNanoseconds")
    if base is not None:
        return [(s - base / 1e3, e - base / 1e3) for s, e in windows]
    marks = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP_MARK)
    )
    return marks[-len(windows) :] if marks else []


def profiled_pass(
    step_fn: Callable[[], Any],
    steps: int,
    cuda: bool,
    *,
    cpu: bool,
    shapes: bool,
    captures: list[Any] | None = None,
) -> Pass:
    """One step to settle, then `steps` windows, under torch.profiler."""
    acts = ([ProfilerActivity.CPU] if cpu else []) + ([ProfilerActivity.CUDA] if cuda else [])
    with marked(captures or []) if cpu else nullcontext():
        with profile(activities=acts, record_shapes=shapes) as prof:
            step_fn()
            _sync(cuda)
            windows, ms = _timed_steps(step_fn, steps, cuda, mark=cpu)
    trace = export_trace(prof)
    return Pass(trace, _on_trace_clock(trace, windows), ms)


def capture(
    step_fn: Callable[[], Any],
    name: str,
    *,
    steps: int = 5,
    warmup: int = 2,
    timed: int = 10,
    cuda: bool | None = None,
    captures: list[Any] | None = None,
) -> Capture:
    """Warm up, time unprofiled steps, then the timing and attributes passes."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    first = None
    for i in range(max(1, warmup)):
        _sync(cuda)
        t0 = time.perf_counter()
        step_fn()
        _sync(cuda)
        if i == 0:
            first = time.perf_counter() - t0
    timed = timed if cuda else min(timed, 2)
    with _GcClock() as gcc:
        _, unprofiled = _timed_steps(step_fn, timed, cuda)
    notes = []
    timing = None
    if cuda:
        timing = profiled_pass(step_fn, steps, cuda, cpu=False, shapes=False)
        if not any(e.get("cat") == "kernel" for e in timing.trace.get("traceEvents", [])):
            notes.append("the CUDA-only pass recorded no kernels: timed by the attributes pass")
            timing = None
    if captures is None:
        captures = CAPTURES
    n = steps if cuda and timing is None else 1
    attrs = profiled_pass(step_fn, n, cuda, cpu=True, shapes=True, captures=captures)
    _, after = _timed_steps(step_fn, timed, cuda) if cuda else (None, [])
    gc_ms = gcc.seconds / max(1, timed) * 1e3
    return Capture(name, cuda, timing, attrs, unprofiled, first, notes, after, gc_ms)
