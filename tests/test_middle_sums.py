"""Sums over a few middle elements, through torch.compile (fuser/dynamo/middle_sums.py).

Grouped-query attention's gradient sums the repeated heads' gradients over a middle dim
([B, G, R, T, D] -> [B, G, T, D]). No reduction kernel takes middle dims, so a sum over
2..16 of them becomes adds of strided views: fused, and fused with the elementwise work
after it. Checked against eager: odd sizes, several reduced dims, keepdim with the squeeze
transformers writes, mean, a dtype argument, bf16 (accumulated in fp32), a non-contiguous
input, and the backward of repeat_kv itself; a sum over more elements stays ATen.
"""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import FuserBackend
from fuser.dynamo.explain import explain
from fuser.dynamo.middle_sums import MAX_TERMS

F32, BF16 = torch.float32, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def rand(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


def compiled(fn, *args: torch.Tensor) -> tuple[torch.Tensor, FuserBackend]:  # noqa: ANN001
    fb = FuserBackend(strict=True, check=True)
    out = torch.compile(fn, backend=fb, dynamic=False)(*args)
    return out, fb


def notes(fb: FuserBackend) -> list[str]:
    return [n for c in fb.captures for g in c.graphs for n in g.middle_sums]


def aten_sums(fb: FuserBackend) -> int:
    """Sums that ran as ATen (a fallback segment inside a region, or no region at all)."""
    text = explain(fb)
    return text.count("ATen fallback (segment 0): sum") + text.count("aten.sum")


@pytest.mark.parametrize(
    "shape, dims, keepdim",
    [
        ((3, 5, 7, 9), [1], False),  # 5 terms, odd everywhere
        ((2, 3, 4, 6, 10), [1, 2], False),  # 12 terms over two dims
        ((2, 2, 3, 5, 8), [2], True),  # keepdim
        ((4, 2, 16, 3), [-2], False),  # a negative dim, MAX_TERMS terms
    ],
)
def test_sum_over_middle_dims(shape, dims, keepdim) -> None:  # noqa: ANN001
    x = rand(*shape, seed=1)
    out, fb = compiled(lambda t: torch.sum(t * 2.0, dims, keepdim=keepdim) + 1.0, x)
    want = torch.sum(x * 2.0, dims, keepdim=keepdim) + 1.0
    torch.testing.assert_close(out, want)
    assert len(notes(fb)) == 1 and aten_sums(fb) == 0, explain(fb)


def test_keepdim_then_squeeze_fuses_with_what_follows() -> None:
    """transformers' repeat_kv gradient: sum(keepdim=True).squeeze(2), then elementwise
    work. The squeeze goes with the keepdim; the adds and the multiply are one kernel."""
    x, w = rand(2, 3, 4, 5, 16, seed=2), rand(5, 16, seed=3)

    def fn(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return t.sum(2, keepdim=True).squeeze(2) * s

    out, fb = compiled(fn, x, w)
    torch.testing.assert_close(out, fn(x, w))
    regions = [r for c in fb.captures for g in c.graphs for r in g.fused]
    assert len(regions) == 1 and len(regions[0].kernels) == 1, explain(fb)
    assert "squeeze" not in explain(fb)


def test_mean_and_dtype_argument() -> None:
    x = rand(3, 6, 5, 8, dtype=BF16, seed=4)
    out, _ = compiled(lambda t: t.mean(1), x)
    torch.testing.assert_close(out, x.mean(1), atol=1e-2, rtol=1e-2)
    out, fb = compiled(lambda t: torch.sum(t, [1], dtype=torch.float32), x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.sum(x, [1], dtype=torch.float32))
    assert len(notes(fb)) == 1


def test_bf16_accumulates_in_fp32() -> None:
    """Terms that cancel: rounding each partial sum to bf16 would lose the small one."""
    big = rand(2, 1, 4, 32, seed=5).abs() * 256 + 256
    small = rand(2, 1, 4, 32, seed=6)
    x = torch.cat([big, small, -big], dim=1).to(BF16)  # [2, 3, 4, 32]; sum is `small`
    out, fb = compiled(lambda t: t.sum(1), x)
    want = x.float().sum(1).to(BF16)
    assert torch.equal(out, want), (out - want).abs().max()
    assert len(notes(fb)) == 1


def test_non_contiguous_input() -> None:
    x = rand(5, 16, 3, 6, seed=7).transpose(0, 3)  # [6, 16, 3, 5], strided everywhere
    out, fb = compiled(lambda t: t.sum(2) - 0.5, x)
    torch.testing.assert_close(out, x.sum(2) - 0.5)
    assert len(notes(fb)) == 1


def test_too_many_terms_stays_aten() -> None:
    x = rand(2, MAX_TERMS + 1, 3, 4, seed=8)
    out, fb = compiled(lambda t: t.sum(1) * 3.0, x)
    torch.testing.assert_close(out, x.sum(1) * 3.0)
    assert notes(fb) == [] and aten_sums(fb) == 1


def test_rows_and_columns_are_not_rewritten() -> None:
    """All leading dims, the last dim: the column and row reductions the schedulers take."""
    x = rand(3, 4, 5, seed=9)
    for fn in (lambda t: t.sum([0, 1]) * 2.0, lambda t: t.sum(2) * 2.0):
        torch._dynamo.reset()
        out, fb = compiled(fn, x)
        torch.testing.assert_close(out, fn(x))
        assert notes(fb) == []


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_repeat_kv_backward(dtype: torch.dtype) -> None:
    """GQA: key heads repeated for 3 query heads each, as transformers' repeat_kv; the
    key's gradient is the sum over the repeats, fused with the scale after it."""
    b, g, r, t, d = 2, 2, 3, 5, 16

    def fn(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        rep = k[:, :, None].expand(b, g, r, t, d).reshape(b, g * r, t, d)
        return (q * rep).sum(-1)

    q = rand(b, g * r, t, d, dtype=dtype, seed=10)
    k = rand(b, g, t, d, dtype=dtype, seed=11)
    fb = FuserBackend(strict=True, check=True)
    grads = []
    for f in (fn, torch.compile(fn, backend=fb, dynamic=False)):
        kk = k.detach().requires_grad_()
        f(q, kk).backward(rand(b, g * r, t, dtype=dtype, seed=12))
        grads.append(kk.grad)
    tol = {} if dtype == F32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grads[1], grads[0], **tol)
    assert len(notes(fb)) == 1, explain(fb)


@pytest.mark.parametrize(
    "shape, dims, keepdim, mean",
    [
        ((3, 5, 7), [0], False, False),  # the position-embedding gradient's form
        ((3, 5, 7), [0], True, False),
        ((2, 3, 4, 5), [0, 1], False, True),
        ((20, 3, 9), [0], False, False),  # more leading elements than MAX_TERMS
    ],
)
def test_sum_over_some_leading_dims(shape, dims, keepdim, mean) -> None:  # noqa: ANN001
    x = rand(*shape, dtype=BF16, seed=13)
    op = torch.mean if mean else torch.sum

    def fn(t: torch.Tensor) -> torch.Tensor:
        return op(t * 2.0, dims, keepdim=keepdim) * 3.0

    out, fb = compiled(fn, x)
    torch.testing.assert_close(out, fn(x), atol=2e-2, rtol=2e-2)
    assert len(notes(fb)) == 1 and "column sum" in notes(fb)[0]
    assert aten_sums(fb) == 0, explain(fb)


def test_leading_sum_of_unmergeable_input_stays_aten() -> None:
    """[3, 7, 5] transposed from [3, 5, 7]: its last two dims do not merge into one
    stride, so a [3, 35] view would be a copy; the sum stays ATen."""
    x = rand(3, 5, 7, seed=14).transpose(1, 2)
    out, fb = compiled(lambda t: t.sum(0) * 2.0, x)
    torch.testing.assert_close(out, x.sum(0) * 2.0)
    assert notes(fb) == []


def test_leading_sum_of_a_transpose_with_a_unit_dim_stays_aten() -> None:
    """[5, 17, 1, 16] with strides (272, 1, 17, 17) (a transpose of [5, 16, 1, 17]): torch's
    fake view accepts it as [5, 272], a real view refuses, so mergeability is worked out
    from the strides (found by fuser.fuzz.programs)."""
    x = rand(5, 16, 1, 17, seed=15).transpose(1, 3)
    out, fb = compiled(lambda t: t.mean(0, keepdim=True) * t, x)
    torch.testing.assert_close(out, x.mean(0, keepdim=True) * x)
    assert notes(fb) == []
