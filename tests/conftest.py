"""Fixtures shared by the test modules that run kernels on both backends."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator

import pytest
import torch

from fuser.config import config
from fuser.runtime import cuda_backend


@pytest.fixture
def quiet_interpreter() -> Iterator[None]:
    """numpy's warnings on masked-off lanes in Triton's interpreter (-inf - -inf, 0/0) and
    var_mean's degrees-of-freedom warning silenced. Modules opt in with
    `pytestmark = pytest.mark.usefixtures("quiet_interpreter")`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.filterwarnings("ignore", message=r"var_mean\(\): degrees of freedom")
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
