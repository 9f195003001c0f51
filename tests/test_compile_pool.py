"""Compile worker processes (fuser/runtime/compile_pool.py, precompile.py): jobs run in
plain subprocesses, errors come back as answers, a dead worker fails only its job, and a
worker compiles a generated Triton kernel (for an H100, on this CPU machine too) into the
disk cache entry the parent's own warm-up then loads instead of compiling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fuser import FusionDefinition
from fuser.runtime import precompile
from fuser.runtime.compile_pool import WorkerPool

H100 = ("cuda", 90, 32)


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory: pytest.TempPathFactory):
    """A fresh TRITON_CACHE_DIR for this module, set before its workers start."""
    mp = pytest.MonkeyPatch()
    folder = tmp_path_factory.mktemp("triton-cache")
    mp.setenv("TRITON_CACHE_DIR", str(folder))
    yield folder
    mp.undo()


@pytest.fixture(scope="module")
def pool(triton_cache: Path):
    p = WorkerPool(2, setup=("compile_worker", "setup", (H100,)))
    yield p
    p.close()


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir()}


def test_jobs_answer_none_or_their_error(pool: WorkerPool) -> None:
    ok = pool.submit("math", "sqrt", 4.0)
    bad = pool.submit("math", "sqrt", -1.0)
    loud = pool.submit("builtins", "print", "a job's print goes to stderr, not the protocol")
    after = pool.submit("math", "sqrt", 9.0)
    assert ok.result(timeout=120) is None
    assert bad.result(timeout=120) == "ValueError: math domain error"
    assert loud.result(timeout=120) is None and after.result(timeout=120) is None


def test_a_dead_worker_fails_its_job_and_the_other_goes_on(triton_cache: Path) -> None:
    p = WorkerPool(2)
    try:
        dead = p.submit("os", "_exit", 3)
        assert isinstance(dead.exception(timeout=120), EOFError)
        later = [p.submit("math", "sqrt", float(i)) for i in range(4)]
        assert [f.result(timeout=120) for f in later] == [None] * 4
        assert p.alive() == 1
    finally:
        p.close()


def _layer_norm_kernels() -> list:
    """Kernels whose pointers mix dtypes (a worker once read one for another)."""
    with FusionDefinition("pool_ln") as ln:
        x = ln.define_tensor([-1, -1], torch.bfloat16)
        w = ln.define_tensor([-1], torch.float32)
        ln.add_output(ln.ops.cast(ln.ops.layer_norm(x, w, None, 1e-5), torch.bfloat16))
        ln.add_output(ln.ops.sum(x, [1]))
    meta = [
        torch.empty(37, 1001, dtype=torch.bfloat16, device="meta"),
        torch.empty(1001, dtype=torch.float32, device="meta"),
    ]
    return ln.compile(meta, "h100", "triton")


def test_a_worker_fills_the_cache_the_parent_loads(
    pool: WorkerPool, triton_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers compile a graph's kernels for an H100; the parent's warm-up, made the
    same way (Triton's JIT, the same target and options), finds every binary in the
    cache: no new cache entry appears."""
    kernels = _layer_norm_kernels()
    monkeypatch.setattr(precompile, "start_processes", lambda: pool)
    before = _entries(triton_cache)
    assert precompile._compile_in_workers(precompile._unwarmed(kernels)) == len(kernels)
    made = _entries(triton_cache) - before
    binaries = {d for d in made if list((triton_cache / d).glob("*.cubin"))}
    assert len(binaries) == len(kernels)  # (a GPU machine's workers build launchers too)

    # the parent, as it warms up on a GPU (its driver answering the same target), with
    # torch's dtypes where the workers had their names
    from triton.runtime.driver import driver

    from fuser.runtime import compile_worker
    from fuser.runtime.triton_backend import TRITON_OPTIONS, load_module

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the generated module jit-compiled
    active = driver._active
    try:
        compile_worker.setup(H100)
        for k in kernels:
            s = k.plan
            fn = getattr(load_module(k.source, False), k.name)
            args = precompile.warmup_args(k)
            fn.warmup(*args, grid=s.grid, num_warps=s.num_warps, **TRITON_OPTIONS)
    finally:
        driver._active = active
    assert _entries(triton_cache) - before == made


def test_kernels_warmed_before_skip_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel an earlier process warmed up into the same Triton cache is not sent to the
    workers (nor are they started or waited for): the parent loads it from the cache."""
    from fuser.config import config
    from fuser.runtime.cache import store_entry

    monkeypatch.setattr(config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "disk_cache", True)
    kernels = _layer_norm_kernels()

    def no_pool() -> None:
        raise AssertionError("the workers were asked")

    for k in kernels:
        store_entry("triton-warmed", precompile._warmed_key(k), {"name": k.name})
    monkeypatch.setattr(precompile, "start_processes", no_pool)
    assert precompile._unwarmed(kernels) == []
    assert precompile._compile_in_workers(precompile._unwarmed(kernels)) == 0
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "another"))  # another cache
    assert len(precompile._unwarmed(kernels)) == len(kernels)
    with pytest.raises(AssertionError, match="workers were asked"):
        precompile._compile_in_workers(precompile._unwarmed(kernels))


def test_dtype_names_specialize_as_torch_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker makes of dtype names, Triton's JIT specializes exactly as the
    parent's torch dtypes, call after call (stand-ins made afresh per call were once
    read as an earlier call's dtypes: Triton remembers a dtype by its object)."""
    from triton.runtime.driver import driver
    from triton.runtime.jit import MockTensor

    from fuser.runtime import compile_worker
    from fuser.runtime.triton_backend import TRITON_OPTIONS, load_module

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    active = driver._active
    try:
        compile_worker.setup(H100)
        k = _layer_norm_kernels()[0]
        fn = getattr(load_module(k.source, False), k.name)
        n = len(precompile.warmup_args(k)) - 1  # pointers, then the row count
        bf, f32 = torch.bfloat16, torch.float32
        orders = [[bf, f32] * n, [f32, bf] * n, [bf, bf, f32] * n]
        for args in [[*o[:n], 3] for o in orders] * 4:
            binder = fn.device_caches[0][4]
            want = binder(*map(MockTensor.wrap_dtype, args), num_warps=4, **TRITON_OPTIONS)[1]
            named = compile_worker._arguments(precompile._encoded(args))
            assert binder(*named, num_warps=4, **TRITON_OPTIONS)[1] == want
    finally:
        driver._active = active


def test_when_every_worker_dies_queued_jobs_fail_at_once(triton_cache: Path) -> None:
    """Jobs queued behind workers that all died are failed (their waiters would wait for
    nothing), and later submissions fail at once."""
    p = WorkerPool(1)
    try:
        dead = p.submit("os", "_exit", 3)
        stranded = [p.submit("math", "sqrt", 1.0) for _ in range(3)]
        assert isinstance(dead.exception(timeout=120), EOFError)
        for f in stranded:
            assert "stopped" in str(f.exception(timeout=120))
        assert "closed" in str(p.submit("math", "sqrt", 1.0).exception(timeout=1))
    finally:
        p.close()
