"""Where a compiled graph's first step went: the ledger explain prints.

A Ledger collects seconds per phase (tracing, lowering and its stages, compiling, the
first calls) and one line per kernel compiled or loaded (backend, where the binary came
from, seconds). The stages that know a time report it to every ledger collecting on this
thread (`collecting`), so the planner and the compilers need not know who listens; with
no ledger open a report costs a list lookup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

# the phases in the order of a first step, as explain names them
PHASES = (
    "tracing",  # AOTAutograd's (Dynamo's own comes before the backend is called)
    "lowering",  # fuser's whole lowering of the ATen graphs (the stages below within it)
    "plan cache",  # plans looked for, read from or written to disk (runtime/plan_cache.py)
    "passes",
    "segmenting",
    "scheduling",
    "rendering",
    "compiling",  # kernels compiled ahead of the first call (in parallel)
    "first calls",  # each graph's first call: plans for the real inputs, launches, program
)
# inside lowering / first calls
NESTED = ("plan cache", "passes", "segmenting", "scheduling", "rendering")


@dataclass
class KernelTime:
    name: str
    backend: str
    origin: str  # "compiled", "disk", "memory", "triton cache or compiled"
    seconds: float


@dataclass
class Ledger:
    seconds: dict[str, float] = field(default_factory=dict)
    kernels: list[KernelTime] = field(default_factory=list)
    workers: int = 0  # of the compile pool, when one ran
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def text(self) -> str:
        """One paragraph: the phases, the kernels by origin, the slowest ones."""
        if not self.seconds and not self.kernels:
            return "first step: nothing timed yet"
        parts = []
        for p in PHASES:
            if p in self.seconds and p not in NESTED:
                parts.append(f"{p} {self.seconds[p]:.2f}s")
        nested = ", ".join(f"{p} {self.seconds[p]:.2f}s" for p in NESTED if p in self.seconds)
        lines = ["first step: " + ", ".join(parts)]
        if nested:
            lines.append(f"  planning (within lowering and first calls): {nested}")
        if self.kernels:
            origins: dict[str, int] = {}
            for k in self.kernels:
                origins[k.origin] = origins.get(k.origin, 0) + 1
            by = ", ".join(f"{n} {o}" for o, n in sorted(origins.items()))
            pool = f" by {self.workers} workers" if self.workers else ""
            total = sum(k.seconds for k in self.kernels)
            lines.append(
                f"  kernels: {len(self.kernels)} ({by}){pool}, {total:.2f}s of compile time"
            )
            slow = sorted(self.kernels, key=lambda k: -k.seconds)[:3]
            lines.append(
                "  slowest: "
                + ", ".join(f"{k.name} [{k.backend}, {k.origin}] {k.seconds:.2f}s" for k in slow)
            )
        return "\n".join(lines)


_local = threading.local()


def _open() -> list[Ledger]:
    got = getattr(_local, "ledgers", None)
    if got is None:
        got = _local.ledgers = []
    return got


@contextmanager
def collecting(ledger: Ledger | None) -> Iterator[None]:
    """Reports made on this thread meanwhile also go to `ledger` (None: no change)."""
    if ledger is None:
        yield
        return
    ledgers = _open()
    if any(x is ledger for x in ledgers):  # already open: count nothing twice
        yield
        return
    ledgers.append(ledger)
    try:
        yield
    finally:
        ledgers.remove(ledger)


@contextmanager
def collecting_all(ledgers: list[Ledger]) -> Iterator[None]:
    """`collecting` for several ledgers: a pool's worker reports to its caller's."""
    ledgers_open = _open()
    ledgers_open.extend(ledgers)
    try:
        yield
    finally:
        for ledger in ledgers:
            ledgers_open.remove(ledger)


def current() -> list[Ledger]:
    """The ledgers open on this thread (a pool's workers report through their caller)."""
    return list(_open())


def add(phase: str, seconds: float, ledgers: list[Ledger] | None = None) -> None:
    for ledger in _open() if ledgers is None else ledgers:
        ledger.add(phase, seconds)


def kernel(k: KernelTime, ledgers: list[Ledger] | None = None) -> None:
    for ledger in _open() if ledgers is None else ledgers:
        with ledger._lock:
            ledger.kernels.append(k)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as `name` in every open ledger."""
    if not _open():
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - t0)


def median_ms(fn: Callable[[], object], reps: int) -> float:
    """Median GPU time of `fn` in ms by CUDA events over `reps` calls, after one call that
    compiles and warms it (the first-use autotunes of the attention and GEMM templates)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
