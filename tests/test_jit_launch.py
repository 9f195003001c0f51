"""runtime/jit_launch.py: fuser's own Triton kernels outside the call programs (scatter-adds,
the cross-entropy scale) launched through their compiled binaries after the first launch of
each specialization. The key must change wherever Triton's JIT would compile another
kernel, or a launch would run a binary specialized for other arguments."""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo.ce_scale import scale_in_place
from fuser.runtime import jit_launch
from fuser.runtime.jit_launch import _orderable, _spec, launch
from fuser.runtime.scatter import scatter_add_rows


def test_the_key_follows_what_the_jit_specializes_on() -> None:
    x = torch.zeros(64)
    assert _spec(x) != _spec(x[1:])  # 16-byte alignment
    assert _spec(x) != _spec(x.double())  # dtype
    assert _spec(1) != _spec(2) != _spec(16)  # == 1, divisible by 16
    assert _spec(32) == _spec(48) and _spec(3) == _spec(5)
    assert _spec(2**31) != _spec(2**31 - 16)  # a 64-bit integer
    assert _spec(True) != _spec(1) and _spec(0.5) == _spec(2.0)
    # u64 from 2**63 on: a u64 binary takes a negative i64 without complaint (wrapped)
    assert _spec(2**63 + 16) != _spec(-(2**32))


def test_a_positional_constexpr_is_never_launched_directly() -> None:
    """The key holds a positional argument's _spec, not its value: two BLOCKs passed
    positionally would share the first one's binary."""
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, BLOCK: tl.constexpr, n):
        tl.store(x_ptr + tl.arange(0, BLOCK), n)

    assert not _orderable(k, 3, {})  # BLOCK positional
    assert not _orderable(k, 2, {})  # n left to a default it does not have
    assert _orderable(k, 1, {"BLOCK": 64, "n": 3})  # keyed by value


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="direct launches need a GPU")


@cuda
def test_direct_launches_after_the_first_of_each_specialization() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def axpy(x_ptr, y_ptr, n, a, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, x * a + tl.load(y_ptr + offs, mask=mask), mask=mask)

    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(1025, device="cuda", generator=g)

    def run(x: torch.Tensor, n: int) -> None:
        y = torch.randn(n, device="cuda", generator=g)
        want = x[:n] * 0.5 + y
        launch(axpy, ((n + 127) // 128,), x, y, n, 0.5, BLOCK=128)
        torch.testing.assert_close(y, want)

    for _ in range(3):  # the JIT once, then the direct launch
        run(base, 1024)
    assert len(jit_launch._FAST[axpy]) == 1
    run(base[1:], 1024)  # misaligned: another specialization, compiled by the JIT
    run(base, 1)  # n == 1: another
    run(base, 1000)  # not divisible by 16: another
    assert len(jit_launch._FAST[axpy]) == 4
    for x, n in ((base[1:], 1024), (base, 1), (base, 1000), (base, 1024)):
        run(x, n)  # each through its own direct launch
    assert len(jit_launch._FAST[axpy]) == 4


@cuda
def test_scatter_and_scale_launched_directly_match_torch() -> None:
    """The embedding backward's scatter-add and the cross-entropy scale, called again and
    again with new data (their direct launches after the first), and with a misaligned
    gradient (a new specialization): each result is torch's."""
    g = torch.Generator(device="cuda").manual_seed(1)
    wide = torch.randn(4099, 96, device="cuda", generator=g, dtype=torch.bfloat16)
    for src in (wide[:4096], wide[:4096], wide[3:4099], wide[:4096]):
        idx = torch.randint(0, 500, (4096,), device="cuda", generator=g)
        got = scatter_add_rows(src, idx, 500)
        want = torch.zeros(500, 96, device="cuda").index_add_(0, idx, src.float())
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
    for up in (2.0, 2.0, 1.0, 0.5):
        grad = torch.randn(64, 300, device="cuda", generator=g, dtype=torch.bfloat16)
        want = (grad.float() * up).to(torch.bfloat16)
        out = scale_in_place(grad, torch.tensor(up, device="cuda"))
        assert torch.equal(out, want)
