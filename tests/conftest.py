"""Fixtures shared by the test modules that run kernels on both backends."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator

import pytest
import torch

from fuser.config import config
from fuser.fuzz.check import gpu_faithful_interpreter
from fuser.runtime import cuda_backend


@pytest.fixture
def gpu_faithful() -> Iterator[None]:
    """Triton's interpreter rounding bf16 as a GPU does; numpy's warnings on masked-off
    lanes (-inf - -inf, 0/0) and var_mean's degrees-of-freedom warning silenced.
    Modules opt in with `pytestmark = pytest.mark.usefixtures("gpu_faithful")`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.filterwarnings("ignore", message=r"var_mean\(\): degrees of freedom")
        with gpu_faithful_interpreter():
            yield


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
