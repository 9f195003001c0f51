"""Compiling and running fusions from several threads and several processes at once.

Threads: one FusionDefinition shared, or one each with the same kernels (the module
cache is shared), or one shared with different shapes (plans made concurrently).
Triton's interpreter keeps the running grid in module globals, so before interpreted
launches took turns (runtime/triton_backend.py) these gave wrong numbers and
"x >= grid_dim[0]" errors. Processes: four at once on one fresh FUSER_CACHE_DIR (and,
on a GPU, one Triton cache), each checking its results; the folder is left whole.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from fuser import FusionDefinition
from fuser.config import config
from fuser.runtime import triton_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
THREADS = 8


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(config, "cache_dir", tmp_path)
    monkeypatch.setattr(triton_backend, "_modules", {})
    yield tmp_path


def norm_and_colsum(name: str = "concurrent") -> FusionDefinition:
    """An inner persistent kernel (layer_norm) and an outer reduction (column sum)."""
    with FusionDefinition(name) as fd:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1])
        fd.add_output(fd.ops.layer_norm(x, w))
        fd.add_output(fd.ops.sum(fd.ops.mul(x, w), dims=[0]))
    return fd


def inputs(rows: int, cols: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(rows, cols, generator=g).to(DEVICE),
        torch.randn(cols, generator=g).to(DEVICE),
    ]


def in_threads(work: Callable[[int], None]) -> None:
    """Run work(0..THREADS-1) in threads released together; re-raise the first error."""
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def assert_matches(fd: FusionDefinition, out: list[torch.Tensor], ins: list[torch.Tensor]) -> None:
    for o, r in zip(out, fd.reference(ins)):
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)


def test_threads_share_one_definition(fresh_cache: Path) -> None:
    fd = norm_and_colsum()
    ins = inputs(37, 300)

    def work(i: int) -> None:
        for _ in range(3):
            assert_matches(fd, fd.execute(ins), ins)

    in_threads(work)
    # the row and column reductions are one inner-outer kernel with a workspace and a
    # finalize launch: each thread's launch gets its own partials
    (k,) = fd.kernels
    assert k.schedule.kind == "inner_outer" and k.workspaces


def test_threads_define_the_same_fusion(fresh_cache: Path) -> None:
    """Same kernels, same module files: loaded once, written whole."""
    ins = inputs(20, 130, seed=1)
    sources: set[str] = set()

    def work(i: int) -> None:
        fd = norm_and_colsum()
        for _ in range(2):
            assert_matches(fd, fd.execute(ins), ins)
        sources.update(k.source for k in fd.kernels)

    in_threads(work)
    files = sorted((fresh_cache / "triton").glob("k_*.py"))
    assert len(files) == len(sources) >= 1, files  # one module file a distinct kernel
    assert len(triton_backend._modules) == len(sources)
    assert not list((fresh_cache / "triton").glob("*.tmp"))


def test_threads_plan_different_shapes(fresh_cache: Path) -> None:
    """One definition, a shape per thread: plans made concurrently, each one right."""
    fd = norm_and_colsum()
    shapes = [(3 + i, 64 + 37 * i) for i in range(THREADS)]

    def work(i: int) -> None:
        ins = inputs(*shapes[i], seed=i)
        for _ in range(2):
            assert_matches(fd, fd.execute(ins), ins)

    in_threads(work)


CHILD = textwrap.dedent(
    """
    import sys, time
    import torch
    from fuser import FusionDefinition

    start = float(sys.argv[1])
    with FusionDefinition("concurrent") as fd:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1])
        fd.add_output(fd.ops.layer_norm(x, w))
        fd.add_output(fd.ops.sum(fd.ops.mul(x, w), dims=[0]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(29, 257, generator=g).to(device), torch.randn(257, generator=g).to(device)]
    time.sleep(max(0.0, start - time.time()))  # all processes compile at once
    for _ in range(2):
        for o, r in zip(fd.execute(ins), fd.reference(ins)):
            torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
    print("ok", len(fd.kernels))
    """
)


def test_processes_share_the_disk_cache(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["FUSER_CACHE_DIR"] = str(tmp_path / "fuser")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")  # Triton's own cache, shared too
    start = time.time() + 8.0  # after every process has imported torch and triton
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    counts = set()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.startswith("ok"), err[-3000:]
        counts.add(int(out.split()[1]))
    (kernels,) = counts  # every process planned the same kernels
    files = sorted((tmp_path / "fuser" / "triton").glob("k_*.py"))
    assert len(files) == kernels, files  # one module file each, written once
    for f in files:
        compile(f.read_text(), str(f), "exec")  # whole, valid Python
    leftovers = [p for p in (tmp_path / "fuser").rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers
