"""Check fuzz cases, and run hypothesis batches of them against a time budget.

A batch is one hypothesis run with one seed: it generates up to `examples` cases (a
profile's `gemm_pct` percent of them GEMM + pointwise cases, fuzz/gemm.py) and,
on the first failure, shrinks it (for at most `shrink_seconds`) and stops. Every seed
is recorded, so any batch can be replayed with `python -m fuser.fuzz --replay SEED`.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from fuser.fuzz.case import FuzzCase, build, make_inputs, repro
from fuser.fuzz.check import compare
from fuser.fuzz.gemm import GemmCase, any_cases
from fuser.fuzz.gemm_check import check_gemm_case
from fuser.fuzz.gemm_check import repro as gemm_repro
from fuser.fuzz.generator import CPU, GPU, Profile
from fuser.fuzz.known import known_issue


@dataclass
class Outcome:
    """`status`: ok, mismatch (a wrong number), error (fuser raised on a valid fusion),
    invalid (the generator made something ATen itself rejects: a fuzzer bug)."""

    status: str
    problems: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    fallbacks: int = 0


def out_of_memory(e: BaseException) -> bool:
    """The GPU's memory ran out (workers sharing one GPU: not a fuser bug), however it
    shows: torch's OutOfMemoryError, Triton's RuntimeError "out of memory" from loading
    a compiled module, or the driver's CUDA_ERROR_OUT_OF_MEMORY loading a CUDA one."""
    text = str(e).lower()
    return (
        isinstance(e, torch.cuda.OutOfMemoryError)
        or "out of memory" in text
        or "out_of_memory" in text
    )


# what CUDA says once a context no longer works: every call after a failed module load
# ("unknown error"), or after a kernel fault; other CUDA errors (a bad launch) are errors
CONTEXT_LOST = (
    "unknown error",
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "CUDA_ERROR_UNKNOWN",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
)


def _context_error(out: Outcome) -> bool:
    """The failure is the CUDA context's, not the case's."""
    return any(m in p for p in out.problems for m in CONTEXT_LOST)


def _release_memory(device: str) -> str | None:
    """Give a case's cached GPU memory back (workers share the GPU, and a driver that runs
    out of it while loading a module poisons the worker's context); the error, if the
    context no longer works."""
    if not device.startswith("cuda"):
        return None
    try:
        torch.cuda.empty_cache()
    except Exception as e:  # a kernel of this case faulted: empty_cache raises it too
        return f"{type(e).__name__}: {str(e)[:300]}"
    return None


def _oom(e: BaseException) -> Outcome:
    return Outcome("oom", [f"{type(e).__name__}: {str(e)[:200]}"])


def check_case(case: FuzzCase | GemmCase, device: str = "cpu", runs: int = 1) -> Outcome:
    """Build, run and compare one case (a GEMM case through the GEMM template)."""
    if isinstance(case, GemmCase):
        try:
            got = check_gemm_case(case, device, runs)
        except Exception as e:
            if out_of_memory(e):
                return _oom(e)
            raise
        return Outcome(got.status, got.problems, [f"gemm {k}" for k in got.kinds], got.fallbacks)
    try:
        fd = build(case)
        inputs = make_inputs(case, device)
        fd.reference(inputs)
    except Exception as e:  # the definition or ATen rejects it: the generator's fault
        if out_of_memory(e):
            return _oom(e)
        return Outcome("invalid", [f"{type(e).__name__}: {e}"])
    try:
        problems = compare(fd, inputs, runs=runs, backend=case.backend)
    except Exception as e:
        if out_of_memory(e):
            return _oom(e)
        tb = traceback.format_exc(limit=-4)
        return Outcome("error", [f"{type(e).__name__}: {str(e)[:2000]}\n{tb}"])
    kinds = [k.schedule.kind for k in fd.kernels]
    fallbacks = fd.explain().count("ATen fallback")
    return Outcome("mismatch" if problems else "ok", problems, kinds, fallbacks)


@dataclass
class Failure:
    kind: str
    batch_seed: int
    message: str
    summary: str
    repro: str


@dataclass
class Stats:
    fusions: int = 0  # cases checked while generating
    shrink_runs: int = 0  # cases checked while shrinking a failure
    invalid: int = 0
    out_of_memory: int = 0  # cases skipped: the GPU's memory was taken by other workers
    seconds: float = 0.0
    batches: list[dict[str, Any]] = field(default_factory=list)
    kinds: Counter = field(default_factory=Counter)
    per_backend: Counter = field(default_factory=Counter)  # fusions checked per backend
    fallback_segments: int = 0
    failures: list[Failure] = field(default_factory=list)
    known: Counter = field(default_factory=Counter)  # failures of known, xfailed bugs
    cuda_lost: bool = False  # a kernel faulted; the worker stopped there
    last_was_oom: bool = False  # the case just checked ran out of GPU memory
    invalid_examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["kinds"] = dict(self.kinds)
        out["per_backend"] = dict(self.per_backend)
        out["known"] = dict(self.known)
        out["mismatches"] = sum(f.kind == "mismatch" for f in self.failures)
        out["errors"] = sum(f.kind == "error" for f in self.failures)
        return out


def profile_for(device: str) -> Profile:
    return GPU if device.startswith("cuda") else CPU


def run_batch(
    batch_seed: int,
    examples: int,
    stats: Stats,
    device: str = "cpu",
    profile: Profile | None = None,
    stop_at: float = float("inf"),
    shrink_seconds: float = 120.0,
    runs: int = 1,
    backends: tuple[str, ...] = ("triton",),
) -> Failure | None:
    """One hypothesis run over cases for `backends`; returns the (shrunk) failure, if any."""
    profile = profile or profile_for(device)
    found: dict[str, Any] = {"at": None, "case": None, "outcome": None}
    count = {"generate": 0, "shrink": 0}

    def check(case: FuzzCase) -> None:
        if stats.cuda_lost:
            return  # nothing that runs on this GPU means anything any more
        now = time.monotonic()
        shrinking = found["at"] is not None
        if (not shrinking and now > stop_at) or (shrinking and now > found["at"] + shrink_seconds):
            return  # out of time: let hypothesis wind down
        out = check_case(case, device, runs)
        broken = _release_memory(device)
        count["shrink" if shrinking else "generate"] += 1
        lost = broken is not None or (
            out.status in ("error", "invalid") and (_context_error(out) or _gpu_lost(device))
        )
        after_oom, stats.last_was_oom = stats.last_was_oom, out.status == "oom"
        if lost and after_oom:
            # right after an out-of-memory the context may be poisoned: a failed module
            # load (Triton's or the driver's) leaves "CUDA error: unknown error" on
            # everything after it; this worker stops (and is replaced), and the case
            # counts with the out-of-memory ones
            out = Outcome("oom", out.problems)
            stats.cuda_lost = True
        elif lost:
            out.status = "error"  # the GPU's failure, not the generator's
            if broken is not None:
                out.problems.append(f"the CUDA context failed after this case: {broken}")
        if out.status == "oom":
            stats.out_of_memory += 1
            return
        if out.status == "invalid":
            stats.invalid += 1
            if len(stats.invalid_examples) < 5:
                stats.invalid_examples.append(f"{out.problems[0][:300]} | {case!r}"[:2000])
            return
        if not shrinking:
            stats.kinds.update(out.kinds)
            stats.per_backend[case.backend] += 1
            stats.fallback_segments += out.fallbacks
        if lost:
            # a kernel faulted: every later case would fail too, so shrinking would only
            # make a misleading repro; keep this case as it is and stop
            stats.cuda_lost = True
            out.problems.append("the CUDA context is lost (a kernel faulted?): not shrunk")
            found["at"] = found["at"] or now
            found["case"], found["outcome"] = case, out
            return
        if out.status in ("mismatch", "error"):
            known = known_issue("\n".join(out.problems), case)
            if known is not None:
                stats.known[known] += 1
                return
            if found["at"] is None:
                found["at"] = now
            found["case"], found["outcome"] = case, out
            raise AssertionError("\n".join(out.problems))

    test = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )(given(any_cases(profile, backends))(check))
    try:
        hypothesis_seed(batch_seed)(test)()
    except Exception as e:
        # a failure of ours is in `found` (hypothesis re-raises the shrunk one); anything
        # else is the generator's own bug: count it, it must not pass silently
        if found["case"] is None:
            stats.invalid += 1
            tb = traceback.format_exc(limit=-6)
            stats.invalid_examples.append(f"batch {batch_seed}: {type(e).__name__}: {e}\n{tb}")
    stats.fusions += count["generate"]
    stats.shrink_runs += count["shrink"]
    failure = None
    if found["case"] is not None:
        case, out = found["case"], found["outcome"]
        failure = Failure(
            out.status, batch_seed, "\n".join(out.problems), case.summary(), _repro(case, device)
        )
        stats.failures.append(failure)
    stats.batches.append(
        {"seed": batch_seed, "fusions": count["generate"], "failed": failure is not None}
    )
    return failure


def _repro(case: FuzzCase | GemmCase, device: str) -> str:
    try:
        if isinstance(case, GemmCase):
            return gemm_repro(case, device)
        return repro(case, device=device)
    except Exception as e:  # printing must not hide the failure
        return f"# repro could not be printed ({type(e).__name__}: {e})\n# {case!r}\n"


def run_for(
    seconds: float,
    seed: int,
    device: str = "cpu",
    batch_size: int | None = None,
    on_batch: Callable[[Stats], None] | None = None,
    shrink_seconds: float = 120.0,
    first_batch: int = 0,
    profile: Profile | None = None,
    backends: tuple[str, ...] = ("triton",),
) -> Stats:
    """Batches with seeds seed*1_000_000 + first_batch, +1, ... until `seconds` pass."""
    stats = Stats()
    start = time.monotonic()
    stop_at = start + seconds
    batch_size = batch_size or (50 if device.startswith("cuda") else 10)
    runs = 2 if device.startswith("cuda") else 1  # the cached-launch path is GPU only
    b = first_batch
    while time.monotonic() < stop_at:
        run_batch(
            seed * 1_000_000 + b,
            batch_size,
            stats,
            device,
            profile,
            stop_at=stop_at,
            shrink_seconds=shrink_seconds,
            runs=runs,
            backends=backends,
        )
        b += 1
        stats.seconds = time.monotonic() - start
        if on_batch:
            on_batch(stats)
        if stats.cuda_lost or _gpu_lost(device):
            stats.cuda_lost = True
            break  # a kernel faulted: the context is gone, later results mean nothing
    stats.seconds = time.monotonic() - start
    return stats


def _gpu_lost(device: str) -> bool:
    """True when `device` is a GPU whose context no longer works (a kernel faulted)."""
    if not device.startswith("cuda"):
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


__all__ = [
    "CPU",
    "GPU",
    "Failure",
    "Outcome",
    "Stats",
    "check_case",
    "out_of_memory",
    "run_batch",
    "run_for",
]
