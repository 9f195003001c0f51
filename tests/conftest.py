"""Fixtures shared by the test modules that run kernels on both backends."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from fuser.config import config
from fuser.runtime import cuda_backend


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Worker processes for pyproject's `-n auto`: two when the whole suite runs (no paths
    named) on a machine of two or more cores without a GPU (CI's: most tests are
    single-threaded interpreter work, which two processes on two cores run in ~60% of the
    time); 0, one process as without xdist, when paths are named (one file's tests stay in
    one process anyway) or a GPU is present (timed autotunes and GPU memory are not to be
    shared). `-n 0` / `-n 2` choose for themselves."""
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if not whole_suite or torch.cuda.is_available():
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 2 if (cores or 1) >= 2 else 0


@pytest.fixture(autouse=True)
def fp_warnings(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interpreted kernels report numpy's floating-point warnings (config.fp_warnings), and
    pyproject's filterwarnings makes them errors: from data that eager computes no inf or
    NaN from, a kernel computes none either, masked-off lanes included. Tests whose data
    holds inf or NaN, or overflows, on purpose are marked `nonfinite`: there eager computes
    inf - inf too, silently, and fuser is as silent by default."""
    strict = request.node.get_closest_marker("nonfinite") is None
    monkeypatch.setattr(config, "fp_warnings", strict)


@pytest.fixture(params=["triton", "cuda"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on both backends as fd.execute's default: on a machine without a GPU the
    CUDA kernels run in the g++ emulator."""
    if request.param == "cuda" and not torch.cuda.is_available():
        if shutil.which("g++") is None:
            pytest.skip("the CUDA emulator needs g++")
        monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", True)
    monkeypatch.setattr(config, "backend", request.param)
    return request.param


@pytest.fixture
def pad_every_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """fuser/dynamo/pad_mm.py pads any unaligned matmul, however small (tests' shapes are
    far under its thresholds), each test with Dynamo's caches fresh."""
    from fuser.dynamo import pad_mm

    monkeypatch.setattr(pad_mm, "MIN_MACS", 0)
    monkeypatch.setattr(pad_mm, "MIN_PADDED_DIM", 1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches cleared before and after the test: each torch.compile in it
    captures anew (a module's `pytestmark = pytest.mark.usefixtures("fresh_dynamo")`)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def no_plan_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans are made afresh in tests (runtime/plan_cache.py): tests change planning
    functions and limits in place, which a plan cached on disk by an earlier test or run
    would not see. tests/test_plan_cache.py turns it on in a folder of its own."""
    monkeypatch.setattr(config, "plan_cache", False)
