"""A region whose simplified definition is one of its inputs in another layout (a bf16 ->
fp32 -> bf16 round trip of a transposed view, then a clone into the contiguous layout, as
SDPA's math path leaves them in ViT's step) is a fused copy kernel, not the input handed
to the call program, which cloned it with ATen's strided copy (fuser/dynamo/region.py,
_hidden_relayouts)."""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import FuserBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def _heads(seed: int, b: int = 2, t: int = 513, h: int = 16, d: int = 72) -> torch.Tensor:
    """[B, H, T, D] bf16 of 1.2M elements: a lone clone under 1M elements is left to ATen
    (support.is_free), so the pattern needs this size to reach a region's output."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, h, d, generator=g).to(torch.bfloat16).to(DEVICE)
    return x.transpose(1, 2)  # [B, H, T, D] view of [B, T, H, D]: not contiguous


def _regions(fb: FuserBackend) -> list:
    return [r for c in fb.captures for g in c.graphs for r in g.fused]


def test_round_trip_then_clone_of_a_transposed_view_is_a_kernel() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b, h, t, d = x.shape  # the heads made contiguous for a bmm, as SDPA's math path
        y = x.float().to(torch.bfloat16).contiguous().view(b * h, t, d)
        return torch.bmm(y, w)

    x = _heads(seed=3)
    g = torch.Generator().manual_seed(9)
    w = torch.randn(x.shape[0] * x.shape[1], x.shape[3], 5, generator=g).to(x)
    fb = FuserBackend(strict=True)
    got = torch.compile(fn, backend=fb, dynamic=False)(x, w)
    assert torch.equal(got, fn(x, w))  # a copy, then the same bmm: bit for bit
    copies = [r for r in _regions(fb) if "clone" in r.ops]
    assert copies and all(r.kernels for r in copies), [(r.ops, r.kernels) for r in copies]


def test_round_trip_in_the_same_layout_stays_the_input() -> None:
    """A contiguous input: the simplified output is the input itself, no copy kernel."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.float().to(torch.bfloat16).contiguous()

    x = _heads(seed=4).contiguous()
    fb = FuserBackend(strict=True)
    got = torch.compile(fn, backend=fb, dynamic=False)(x)
    assert torch.equal(got, fn(x))
    assert not any(r.kernels for r in _regions(fb))


def test_a_gradient_through_the_round_trip() -> None:
    """Forward and backward of the pattern in a differentiable chain match eager."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.float().to(torch.bfloat16).contiguous()
        return (y.float() * 2.5).sum()

    x = _heads(seed=5).detach().requires_grad_(True)
    xe = x.detach().clone().requires_grad_(True)
    got = torch.compile(fn, backend=FuserBackend(strict=True), dynamic=False)(x)
    want = fn(xe)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(x.grad, xe.grad)
