"""Compile a graph's kernels in parallel, before its first call launches them one by one.

torch.compile(backend="fuser") plans every fused region when it lowers a graph
(fuser/dynamo/lower.py), so all of a graph's kernels are known before the first call;
without this step each one is compiled at its first launch, serially. Here they are
compiled by a pool of threads, and the first launches find them ready:

- CUDA C++: NVRTC (cuda_backend.compile_cubin, which releases the GIL inside NVRTC) into
  the in-memory and on-disk cubin caches the launcher reads.
- Triton on a GPU: each kernel's JIT function is warmed up (`warmup`: compiled for the
  argument types, pointers assumed 16-byte aligned as the plans assume, nothing
  launched) under Triton's own AsyncCompileMode, which runs the compilations on the pool
  and fills the JIT's cache when the block ends; Triton keeps the binaries in its own
  disk cache (TRITON_CACHE_DIR). A first launch whose arguments specialize otherwise (an
  unaligned pointer) compiles again, as it would have anyway.
- Triton in the CPU interpreter: nothing to compile.
- Templates the graph calls outside its fused regions (the GEMM template's calls,
  dynamo/gemm.py): each is a TemplateWarmup, warmed up beside the Triton kernels in the
  same AsyncCompileMode block (runtime/gemm.warm_up: the arguments made from the graph's
  fake values as the call makes them from real ones).

With config.compile_processes (FUSER_COMPILE_PROCESSES=1; off by default, see
runtime/compile_pool.py for the measurement), Triton kernels are first compiled in worker
processes (Triton's compilation holds the GIL, so threads take turns), which leave the
binaries and their C launchers in Triton's disk cache; the block then only loads them. A
kernel a worker could not compile is compiled by the block as before.

A kernel that fails to compile here is left to its first launch, which raises the error
where it always did. config.compile_workers (FUSER_COMPILE_WORKERS; 0 or 1: serial)
sizes the pools.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from typing import Any

from fuser.backends.registry import get_backend
from fuser.config import config, debug_print
from fuser.runtime import timing
from fuser.runtime.cache import digest, load_entry, store_entry
from fuser.runtime.compile_pool import WorkerPool
from fuser.runtime.cuda_backend import device_arch
from fuser.runtime.timing import KernelTime
from fuser.runtime.triton_backend import TRITON_OPTIONS, WARMED, load_module, source_file

# NVRTC and ptxas are the slow part and run outside the GIL; more threads than cores
# only queue. 8: Inductor's compile pool is sized by cores too, capped for memory.
MAX_WORKERS = 8


def workers() -> int:
    if config.compile_workers > 0:
        return config.compile_workers
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def run_pool(jobs: list[Callable[[], Any]], n: int) -> list[Any]:
    """Each job's result (or the exception it raised), in order; `n` threads (1: serial)."""

    def safe(job: Callable[[], Any]) -> Any:
        try:
            return job()
        except Exception as e:  # the first launch raises it where it always did
            return e

    if n <= 1 or len(jobs) <= 1:
        return [safe(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="fuser-compile") as pool:
        return list(pool.map(safe, jobs))


@dataclass(frozen=True)
class TemplateWarmup:
    """A template kernel a graph launches outside its fused regions: `warm` compiles it
    for the arguments the graph's call will pass (nothing launched). `key` tells apart
    warm-ups of one source for differently specialized arguments."""

    name: str
    source: str
    warm: Callable[[], Any] = field(compare=False)
    key: Any = None
    backend: str = "triton"


def _unique(kernels: list[Any]) -> list[Any]:
    seen, out = set(), []
    for k in kernels:
        key = (k.backend, k.source, getattr(k, "key", None))
        if key not in seen:
            seen.add(key)
            out.append(k)
    return out


_key_thread: threading.Thread | None = None
_key_lock = threading.Lock()


def prefetch_triton_key() -> None:
    """Start hashing Triton's installation (triton_key: its compiler's sources and the
    ~0.5 GB libtriton, once a process; 0.5 s of a warm first step on the H100 host) in a
    thread, while AOTAutograd traces: the hash releases the GIL for its large reads.
    Triton's every JIT compile or cache lookup needs it; precompile waits for it."""
    global _key_thread
    with _key_lock:
        if _key_thread is not None:
            return
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # another Triton: it computes its key where it needs it
            return
        _key_thread = threading.Thread(target=triton_key, name="fuser-triton-key", daemon=True)
        _key_thread.start()


def _wait_triton_key() -> None:
    """Let the prefetch finish rather than compute the key a second time beside it
    (functools.lru_cache does not hold a second caller back)."""
    if _key_thread is not None:
        _key_thread.join()


def precompile(
    kernels: list[Any],
    device_type: str,
    n: int | None = None,
    arch: str | None = None,
    templates: Sequence[TemplateWarmup] = (),
) -> list[Any]:
    """Compile `kernels` (fuser Kernels, to run on `device_type`) and `templates` in
    parallel; returns the per-kernel results (a cubin, None for a warmed Triton kernel or
    template, or an exception), templates last. `arch`: the CUDA architecture (default:
    the current device's)."""
    kernels = _unique([*kernels, *templates])
    n = workers() if n is None else n
    ledgers = timing.current()
    jobs: list[Callable[[], Any]] = []
    triton_gpu = []
    for k in kernels:
        if device_type != "cuda":
            continue  # interpreted or emulated: nothing to compile ahead
        how = get_backend(k.backend).ahead_of_time
        if how == "threads":
            jobs.append(_compile_job(k, ledgers, arch))
        elif how == "warmup":
            triton_gpu.append(k)
    if not jobs and not triton_gpu:
        return []
    t0 = time.perf_counter()
    _wait_triton_key()
    results = run_pool(jobs, n)
    if triton_gpu:
        results += _warm_triton(triton_gpu, n, ledgers)
    for ledger in ledgers:
        ledger.workers = max(ledger.workers, n)
    timing.add("compiling", time.perf_counter() - t0, ledgers)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        debug_print(1, f"[fuser] {len(failed)} kernel(s) left to compile at first launch")
    return results


def _compile_job(k: Any, ledgers: list, arch: str | None) -> Callable[[], Any]:
    """A pool job compiling `k` through its backend's compile() (a cubin for CUDA)."""
    if arch is None:
        import torch

        arch = device_arch(torch.cuda.current_device())
    backend = get_backend(k.backend)

    def job() -> Any:
        with timing.collecting_all(ledgers):
            return backend.compile(k.source, k.name, arch)

    return job


def warmup_args(k: Any) -> list[Any]:
    """What the kernel's launch passes, as Triton's warmup takes it: a torch dtype per
    pointer (tensors, workspaces, the index-check record and flag), then the row count."""
    import torch

    args: list[Any] = [a.dtype.torch for a in k.spec.args]
    args += list(k.workspace_dtypes)
    if k.spec.checks:
        args += [torch.int64, torch.int64]
    return [*args, k.spec.rows]


def warm_calls(k: Any) -> list[tuple[str, Any, int]]:
    """The launches a kernel's warm-up compiles, as (function, grid, warps): the kernel,
    then its finalize where it has workspaces. The thread block and the workers both
    warm these."""
    s = k.plan
    calls = [(k.name, s.grid, s.num_warps)]
    if k.workspaces:
        calls.append((k.name + "_finalize", s.finalize_grid, s.finalize_warps))
    return calls


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()
POOL_WAIT_S = 600.0  # a worker that takes longer is not waited for: the block compiles it


def start_processes() -> WorkerPool | None:
    """The compile worker processes (started once, on a GPU process, unless
    config.compile_processes is off); None where there are none."""
    global _pool
    if not config.compile_processes or workers() <= 1:
        return None
    with _pool_lock:
        if _pool is None:
            try:
                from triton.runtime.driver import driver

                t = driver.active.get_current_target()
                target = (t.backend, t.arch, t.warp_size)
                _pool = WorkerPool(workers(), setup=("compile_worker", "setup", (target,)))
            except Exception as e:  # no GPU driver, no subprocesses: threads as before
                debug_print(1, f"[fuser] no compile worker processes ({e}); threads compile")
                return None
        return _pool if _pool.alive() else None


def _encoded(args: list[Any]) -> list[Any]:
    """warmup_args as a worker takes them: torch dtypes by name (workers import no torch)."""
    import torch

    return [
        ("dtype", str(a).removeprefix("torch.")) if isinstance(a, torch.dtype) else a for a in args
    ]


def _warmed_key(k: Any) -> str:
    """The key of fuser's note that `k` was warmed up into this Triton cache before."""
    from triton import knobs

    return digest(k.source, k.name, str(knobs.cache.dir))


def _unwarmed(kernels: list[Any]) -> list[Any]:
    """The kernels no earlier process warmed up into this Triton cache (templates aside:
    their warm-up is a closure, which the block runs)."""
    return [
        k
        for k in kernels
        if not isinstance(k, TemplateWarmup) and load_entry("triton-warmed", _warmed_key(k)) is None
    ]


def _compile_in_workers(todo: list[Any]) -> int:
    """Compile `todo` (fuser Kernels) in the worker processes, waiting for all; returns
    how many the workers compiled (0 without workers). With warm caches the block only
    loads, and nothing is asked of the workers (_unwarmed leaves nothing to do)."""
    pool = start_processes() if todo else None
    if pool is None:
        return 0
    t0 = time.perf_counter()
    futures = []
    for k in todo:
        job = (str(source_file(k.source)), warm_calls(k), _encoded(warmup_args(k)))
        futures.append(pool.submit("compile_worker", "warm", *job, TRITON_OPTIONS))
    done, _ = wait_all(futures, timeout=POOL_WAIT_S)
    failed = [f for f in done if f.exception() is not None or f.result() is not None]
    for f in failed[:3]:
        debug_print(1, f"[fuser] compile worker: {f.exception() or f.result()}")
    debug_print(
        1,
        f"[fuser] compile workers: {len(futures)} kernel(s) in {time.perf_counter() - t0:.2f}s"
        f", {len(failed)} failed",
    )
    return len(done) - len(failed)


def _warm_triton(kernels: list[Any], n: int, ledgers: list) -> list[Any]:
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # an older Triton: warm up serially
        AsyncCompileMode = None  # noqa: N806
    results: list[Any] = []
    compiled: list[Any] = []  # what the warm-ups return: compiled kernels (or futures)
    t0 = time.perf_counter()
    # worker processes (config.compile_processes): only for kernels not warmed before
    fresh = _unwarmed(kernels) if config.compile_processes and n > 1 and len(kernels) > 1 else []
    in_workers = _compile_in_workers(fresh)

    def warm_all() -> None:
        for k in kernels:
            try:
                if isinstance(k, TemplateWarmup):
                    k.warm()  # adds its source to WARMED itself
                    results.append(None)
                    continue
                module, args = load_module(k.source, False), warmup_args(k)
                for fn, grid, warps in warm_calls(k):
                    compiled.append(
                        getattr(module, fn).warmup(
                            *args, grid=grid, num_warps=warps, **TRITON_OPTIONS
                        )
                    )
                WARMED.add(k.source)
                results.append(None)
            except Exception as e:
                results.append(e)

    if AsyncCompileMode is not None and n > 1:
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="fuser-triton") as pool:
            with AsyncCompileMode(pool, ignore_errors=True):
                warm_all()
    else:
        warm_all()
    prebuild_launchers(compiled, n)
    fresh_ids = {id(k) for k in fresh}
    for k, r in zip(kernels, results):
        if r is None and id(k) in fresh_ids:  # the next process's workers skip it
            store_entry("triton-warmed", _warmed_key(k), {"name": k.name})
    debug_print(
        1, f"[fuser] warm-up block: {len(kernels)} kernel(s) in {time.perf_counter() - t0:.2f}s"
    )
    each = (time.perf_counter() - t0) / max(1, len(kernels))
    for k in kernels:  # Triton compiles them together: each is given an equal share
        how = "warmed up (worker processes)" if in_workers and id(k) in fresh_ids else None
        timing.kernel(KernelTime(k.name, "triton", how or "warmed up (pool)", each), ledgers)
    return results


def prebuild_launchers(compiled: list[Any], n: int) -> int:
    """Triton makes a kernel's C launcher at its first launch: a C compiler run for each
    new argument signature (0.1-0.4 s on an H100 host), kept in Triton's disk cache. With
    cold caches that was 2.7 s of a GPT-2 124M first step, spent one launch after another;
    here the pool builds them side by side (the compiler runs outside the GIL), and the
    first launches load them from the cache. Returns how many were built; any failure is
    left to the first launch, which meets it where it always did."""
    try:
        from triton.runtime.driver import driver

        make = driver.active.launcher_cls
    except Exception:  # no GPU driver (the interpreter), or another Triton
        return 0
    jobs, seen = [], set()
    for c in compiled:
        try:
            kernel = c.result(True) if hasattr(c, "result") else c  # a FutureKernel
        except Exception:
            continue
        src, meta = getattr(kernel, "src", None), getattr(kernel, "metadata", None)
        if src is None or meta is None:
            continue
        key = (repr(getattr(src, "signature", None)), repr(getattr(src, "constants", None)))
        key += (repr(getattr(meta, "tensordesc_meta", None)),)
        if key not in seen:
            seen.add(key)
            jobs.append(lambda src=src, meta=meta: make(src, meta))
    run_pool(jobs, n)
    return len(jobs)
