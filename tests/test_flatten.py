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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_from_positions(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Llama's rotary embedding as transformers writes it: cos and sin from the
    positions each call, rotate_half by slices and a cat."""
    d, t = q.shape[-1], q.shape[-2]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=q.device).float() / d))
    freqs = torch.arange(t, device=q.device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@pytest.mark.parametrize("shape", [(1, 1, 16, 64), (2, 1, 8, 64), (1, 2, 32, 32), (1, 1, 12, 64)])
def test_rotary_backward_of_slices_is_not_flattened(shape: tuple[int, ...]) -> None:
    """The backward of the slices (pads of sin and cos, read through index maps along the
    row) once ran flattened to [total / 1024, 1024] wherever the element count was a
    multiple of 1024: q's and k's gradients were wrong (a Llama's q_proj gradient off by
    100%) while the loss matched. 12 x 64 is the control that never flattened."""
    torch._dynamo.reset()
    q0 = _randn(*shape, dtype=torch.float32, seed=11)
    k0 = _randn(*shape, dtype=torch.float32, seed=12)
    gq = _randn(*shape, dtype=torch.float32, seed=13)
    gk = _randn(*shape, dtype=torch.float32, seed=14)

    def run(fn: object) -> list[torch.Tensor]:
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        a, b = fn(q, k)  # type: ignore[operator]
        ((a * gq).sum() + (b * gk).sum()).backward()
        return [a.detach(), b.detach(), q.grad, k.grad]

    want = run(_rope_from_positions)
    got = run(torch.compile(_rope_from_positions, backend="fuser"))
    for name, g, w in zip(("q_rot", "k_rot", "dq", "dk"), got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("shape", [(16, 64), (8, 128), (32, 96)])
def test_column_index_maps_keep_their_layout(shape: tuple[int, int]) -> None:
    """Slices, pads and a cat (rotate_half) at sizes whose element count is a multiple of
    1024, where contiguous pointwise kernels run flat: each reads through an index map
    along the row, keeps its [rows, cols] layout and agrees with torch."""
    rows, cols = shape
    half = cols // 2
    x = _randn(rows, cols, dtype=torch.float32, seed=10)
    with FusionDefinition("pad_of_slice") as fd:
        o = fd.ops
        t = fd.define_tensor([rows, cols])  # layout ops need static sizes
        fd.add_output(o.mul(o.pad(o.sin(o.slice(t, 1, half, cols)), 1, half, 0), 2.0))
        fd.add_output(o.pad(o.slice(t, 1, 3, cols), 1, 0, 3))  # shift left by 3, zero fill
    upper, shifted = fd.execute([x])
    assert not _flat_note(fd), fd.explain()
    torch.testing.assert_close(upper, torch.nn.functional.pad(x[:, half:].sin(), (half, 0)) * 2)
    torch.testing.assert_close(shifted, torch.nn.functional.pad(x[:, 3:], (0, 3)))

    with FusionDefinition("rotate_half") as fd:
        o = fd.ops
        t = fd.define_tensor([rows, cols])
        fd.add_output(o.cat([o.neg(o.slice(t, 1, half, cols)), o.slice(t, 1, 0, half)], 1))
    (rot,) = fd.execute([x])
    assert not _flat_note(fd)
    torch.testing.assert_close(rot, torch.cat([-x[:, half:], x[:, :half]], 1))
