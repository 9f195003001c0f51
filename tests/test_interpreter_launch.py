"""Interpreted launches (runtime/triton_backend.py) without the interpreter's per-call costs
that change no result: a generated module's helpers (bf16_rne, bf16_wide, ...) are called
without patching triton.language again for each call, and 32-bit integer arithmetic runs
without the overflow checks whose assert only a debug build would make. The results stay
bit for bit eager's, and the interpreter's settings are as they were after the launch."""

from __future__ import annotations

import pytest
import torch
from triton.runtime import interpreter

from fuser import FusionDefinition
from fuser.config import use_interpreter

pytestmark = pytest.mark.skipif(not use_interpreter(), reason="Triton's CPU interpreter")
BF16 = torch.bfloat16


def _bf16_chain() -> FusionDefinition:
    """bf16 ops the interpreter rounds through the bf16_rne and bf16_wide helpers."""
    with FusionDefinition("interp_bf16") as fd:
        x = fd.define_tensor([-1, -1], BF16)
        y = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.mul(fd.ops.add(x, y), y))
    return fd


def test_helpers_and_library_calls_run_inside_one_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """triton.language is patched twice a launch (for the kernel, for Triton's library
    functions), however many programs, helper calls (bf16_rne) and library calls
    (tl.sum) the launch makes."""
    with FusionDefinition("interp_bf16_sum") as fd:
        x = fd.define_tensor([-1, -1], BF16)
        y = fd.define_tensor([-1, -1], BF16)
        s = fd.ops.add(x, y)
        fd.add_output(fd.ops.mul(s, y))
        fd.add_output(fd.ops.sum(s, dims=[1]))
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(37, 65, generator=g).to(BF16) for _ in range(2))
    fd.execute([x, y])  # planned and loaded
    (k,) = fd.kernels
    assert "bf16_rne(" in k.source and "bf16_wide(" in k.source and "tl.sum(" in k.source
    assert k.schedule.grid[0] > 1
    calls = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn) or real(fn))
    out, total = fd.execute([x, y])
    assert len(calls) == 2, calls
    assert torch.equal(out, (x + y) * y)  # each op rounded to nearest even, as eager
    torch.testing.assert_close(total, (x + y).float().sum(1).to(BF16), atol=0.05, rtol=1e-2)


def test_overflow_checks_off_during_the_launch_and_restored_after() -> None:
    builder = interpreter.interpreter_builder
    before = builder.options
    fd = _bf16_chain()
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(5, 300, generator=g).to(BF16) for _ in range(2))
    fd.execute([x, y])
    (k,) = fd.kernels
    seen = []
    # a pre-run hook of the interpreted kernel sees the options its launch runs under
    getattr(k._module._module, k.name).add_pre_run_hook(
        lambda *a, **kw: seen.append(builder.options)
    )
    (out,) = fd.execute([x, y])
    assert len(seen) == 1 and not seen[0].sanitize_overflow and not seen[0].debug
    assert builder.options is before and before.sanitize_overflow  # restored
    assert torch.equal(out, (x + y) * y)


@pytest.mark.nonfinite  # NaN in the data on purpose: max and min must keep it
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=["fp32", "bf16"])
def test_nan_keeping_max_and_min_reduce_with_numpy(monkeypatch, dtype: torch.dtype) -> None:
    """The max_nan / min_nan combines reduce as np.max / np.min, not element by element."""
    with FusionDefinition("interp_minmax") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.max(x, dims=[1]))
        fd.add_output(fd.ops.min(x, dims=[1]))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 301, generator=g).to(dtype)
    x[2, 7] = float("nan")
    x[5, 300] = float("nan")
    x[6] = float("-inf")
    fd.execute([x])
    assert all("max_nan" in k.source or "min_nan" in k.source for k in fd.kernels)

    def element_by_element(self, input):
        raise AssertionError("reduced element by element")

    monkeypatch.setattr(interpreter.ReduceOps, "generic_reduce", element_by_element)
    big, small = fd.execute([x])
    torch.testing.assert_close(big, x.amax(1), equal_nan=True, atol=0, rtol=0)
    torch.testing.assert_close(small, x.amin(1), equal_nan=True, atol=0, rtol=0)
    assert big[2].isnan() and small[5].isnan() and big[6] == float("-inf")
