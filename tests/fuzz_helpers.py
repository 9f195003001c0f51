"""What the fuzzer's test files share: dtypes, the device, small builders of regression
fusions and their inputs, and the check that the fuser agrees with eager."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest
import torch

from fuser import FusionDefinition
from fuser.config import use_interpreter
from fuser.fuzz.check import compare
from fuser.runtime import cuda_backend

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERP = pytest.mark.skipif(not use_interpreter(), reason="Triton's CPU interpreter only")


def cuda_backend_or_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the CUDA C++ backend runnable here, or skip: on a CPU its kernels run in the
    g++ emulator; on a GPU they need NVRTC through cuda-python."""
    if DEVICE == "cpu":
        if shutil.which("g++") is None:
            pytest.skip("the CUDA emulator needs g++")
        monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", True)
    else:
        pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC through cuda-python")


def define(build_fn: Callable[[FusionDefinition], None]) -> FusionDefinition:
    with FusionDefinition("regression") as fd:
        build_fn(fd)
    return fd


def randn(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


def assert_agrees(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    problems = compare(fd, inputs)
    assert not problems, "\n".join(problems) + "\n" + repr(fd)


def transposed(rows: int, cols: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    """Random [rows, cols] stored column-major: a non-contiguous input."""
    return randn(cols, rows, dtype=dtype, seed=seed).t()
