"""Regression tests for bugs the fuzzer's layout pattern (slices, pads and cats along a
dim: fuser/fuzz/patterns.py `_layout`) found."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fuzz_helpers import BF16, DEVICE, F16, F32, define, randn

from fuser import FusionDefinition

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
