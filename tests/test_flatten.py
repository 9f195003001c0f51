"""Contiguous pointwise kernels run over [total / W, W] instead of their odd rows; anything
that depends on where rows end keeps its own layout. Each case against torch."""

from __future__ import annotations

import pytest
import torch

from fuser import FusionDefinition

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _scaled_sum(dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition("scaled_sum") as fd:
        o = fd.ops
        a, b = fd.define_tensor([-1, -1], dtype), fd.define_tensor([-1, -1], dtype)
        y = o.add(o.mul(o.cast(a, torch.float32), 0.5), o.tanh(o.cast(b, torch.float32)))
        fd.add_output(o.cast(y, dtype))
    return fd


def _flat_note(fd: FusionDefinition) -> bool:
    return any("run as" in n for n in fd._runtime().last.notes)


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1024, 7), (2048, 3), (512, 6)])
def test_odd_rows_run_flat_and_agree(shape: tuple[int, int], dtype: torch.dtype) -> None:
    fd = _scaled_sum(dtype)
    a, b = _randn(*shape, dtype=dtype, seed=1), _randn(*shape, dtype=dtype, seed=2)
    (y,) = fd.execute([a, b])
    assert _flat_note(fd), fd.explain()
    ref = (a.float() * 0.5 + torch.tanh(b.float())).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y, ref, atol=tol, rtol=tol)


def test_misaligned_contiguous_view_runs_flat_and_agrees() -> None:
    fd = _scaled_sum(torch.float16)
    base = _randn(1024 * 5 + 1, dtype=torch.float16, seed=3)
    a = base[1:].view(1024, 5)  # contiguous strides, pointer 2 bytes off 16
    b = _randn(1024, 5, dtype=torch.float16, seed=4)
    (y,) = fd.execute([a, b])
    assert _flat_note(fd)
    ref = (a.float() * 0.5 + torch.tanh(b.float())).half()
    torch.testing.assert_close(y, ref, atol=1e-3, rtol=1e-3)


def test_what_depends_on_rows_keeps_its_layout() -> None:
    """A transposed input, a broadcast column operand and an iota each keep [rows, cols]."""
    with FusionDefinition("strided") as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.sub(a, b))
    a = _randn(7, 1024, dtype=torch.float32, seed=5).t()
    b = _randn(1024, 7, dtype=torch.float32, seed=6)
    (y,) = fd.execute([a, b])
    assert not _flat_note(fd)
    torch.testing.assert_close(y, a - b)

    with FusionDefinition("bcast") as fd:
        a, c = fd.define_tensor([-1, -1]), fd.define_tensor([-1])
        fd.add_output(fd.ops.mul(a, fd.ops.broadcast_in_dim(c, shape=a.shape, broadcast_dims=[1])))
    a, c = _randn(1024, 7, dtype=torch.float32, seed=7), _randn(7, dtype=torch.float32, seed=8)
    (y,) = fd.execute([a, c])
    assert not _flat_note(fd)
    torch.testing.assert_close(y, a * c)

    with FusionDefinition("iota") as fd:
        a = fd.define_tensor([-1, -1])
        col = fd.ops.iota(a.shape, dim=1, dtype=torch.float32)
        fd.add_output(fd.ops.add(a, col))
    a = _randn(1024, 7, dtype=torch.float32, seed=9)
    (y,) = fd.execute([a])
    assert not _flat_note(fd)
    torch.testing.assert_close(y, a + torch.arange(7, dtype=torch.float32, device=DEVICE))
