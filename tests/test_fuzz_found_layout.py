"""Regression tests for bugs the fuzzer's layout pattern (slices, pads and cats along a
dim: fuser/fuzz/patterns.py `_layout`) found."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch
import torch.nn.functional as F
from fuzz_helpers import BF16, DEVICE, F16, F32, define, randn

from fuser import FusionDefinition
from fuser.fuzz.case import FuzzCase, InputSpec, Ref, Step, repro
from fuser.fuzz.runner import check_case
from fuser.runtime import cuda_backend

DTYPES = [F32, F16, BF16]
IDS = ["f32", "f16", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_a_slice_of_only_padded_zeros(dtype: torch.dtype) -> None:
    """A slice that reads nothing but a pad's zeros becomes a broadcast of a constant
    (passes/views.py); its Triton alias was a Python float, and widening it as a 16-bit
    tile (bf16_wide on the interpreter, .to on a GPU) failed to compile ("Cannot bitcast
    data-type of size 32 to data-type of size 16"). Found as shift, shift again."""
    rows, cols = 5, 7

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([rows, cols], dtype)
        shifted = fd.ops.pad(fd.ops.slice(x, 1, 3, cols), 1, 0, 3)  # zeros in 4..6
        zeros = fd.ops.slice(shifted, 1, 4, cols)
        fd.add_output(fd.ops.pad(zeros, 1, 0, 4))
        fd.add_output(fd.ops.pad(fd.ops.exp(zeros), 1, 4, 0))  # exp(0) = 1, not 0

    x = randn(rows, cols, dtype=dtype, seed=3)
    moved, ones = define(build_fn).execute([x])
    shifted = F.pad(x[:, 3:], (0, 3))
    torch.testing.assert_close(moved, F.pad(shifted[:, 4:], (0, 4)), atol=0, rtol=0)
    torch.testing.assert_close(ones, F.pad(shifted[:, 4:].exp(), (4, 0)), atol=0, rtol=0)
    assert ones.dtype == dtype and ones[:, 4:].eq(1).all() and ones.device.type == DEVICE


# the flattening bug (fixed in c4aebb2: runtime/specs.py `_flat_pointwise`), as the layout
# pattern found it again with the fix reverted (shrunk; 404 cases into the campaign)
FLATTENED = [
    # a rotary's cos/sin [T, D] broadcast over [B, T, D], then shifted along D: the shift's
    # index map ends up in a kernel of its own over [T, D] (the broadcast stays ATen's)
    FuzzCase(
        (1, 16, 64),
        (InputSpec((1, 16, 64), "float32", static_last=True), InputSpec((16, 64), "float32")),
        (
            Step("input", (0,)),
            Step("input", (1,)),
            Step("broadcast_in_dim", (Ref(1),), (("shape", "domain"), ("broadcast_dims", (1, 2)))),
            Step("slice", (Ref(2), 2, 1, 64)),
            Step("pad", (Ref(3), 2, 0, 1)),
        ),
        (4,),
        data_seed=7,
    ),
    # shifted twice, then minus its column means: symbolic rows, a static last dim
    FuzzCase(
        (16, 64),
        (InputSpec((16, 64), "float32", static_last=True),),
        (
            Step("input", (0,)),
            Step("slice", (Ref(0), 1, 1, 64)),
            Step("pad", (Ref(1), 1, 0, 1)),
            Step("slice", (Ref(2), 1, 1, 64)),
            Step("pad", (Ref(3), 1, 0, 1)),
            Step("mean", (Ref(4),), (("dims", (0,)), ("keepdim", False))),
            Step("broadcast_in_dim", (Ref(5),), (("shape", "domain"), ("broadcast_dims", (1,)))),
            Step("sub", (Ref(4), Ref(6))),
        ),
        (7,),
        data_seed=7,
    ),
]


@pytest.mark.parametrize("case", FLATTENED, ids=["broadcast_then_shift", "shifts_minus_mean"])
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_index_maps_at_1024_elements_keep_their_layout(
    case: FuzzCase, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k * 1024 elements in rows of 64: a pointwise kernel that reads through a slice's
    index map ran flattened to [1, 1024] rows, and column j of the flat row was read as
    column j of the tensor (945 of 1024 elements wrong). Both backends."""
    if backend == "cuda":
        if DEVICE == "cpu":
            if shutil.which("g++") is None:
                pytest.skip("the CUDA emulator needs g++")
            monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", True)
        else:
            pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC through cuda-python")
    case = dataclasses.replace(case, backend=backend)
    out = check_case(case, DEVICE)
    assert out.status == "ok", "\n".join(out.problems) + "\n" + repro(case, device=DEVICE)
