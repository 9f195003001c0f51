"""fuser/dynamo/tidy.py: casts moved before the views they read, repeated calls merged.

Against eager through torch.compile: SDPA's math backward casts transposed fp32 views to
bf16 for its bmms; the cast now reads its source in order, the transpose after it a free
view. Two equal casts feeding two matmuls are one. Random ops are never merged, and two
graph outputs never become one tensor.
"""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import FuserBackend
from fuser.dynamo.explain import explain

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


def records(fb: FuserBackend) -> list:
    return [g for c in fb.captures for g in c.graphs]


def test_a_cast_of_a_transposed_view_moves_before_it() -> None:
    """p^T cast to bf16 for a bmm (dV = p^T dO): the cast's kernel reads p in its own
    order, the transpose is a view of its result."""

    def fn(p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return torch.bmm(p.transpose(1, 2).to(torch.bfloat16), d)

    p, d = rand(3, 24, 40, seed=1), rand(3, 24, 8, seed=2, dtype=torch.bfloat16)
    fb = FuserBackend(strict=True, check=True)
    got = torch.compile(fn, backend=fb, dynamic=False)(p, d)
    torch.testing.assert_close(got, fn(p, d))
    (g,) = records(fb)
    assert g.casts_moved == 1, explain(fb)
    (k,) = g.kernels
    assert "col stride 1" in k.source.split("# arguments:")[1].split("# schedule")[0]


def test_a_cast_that_feeds_fused_work_stays() -> None:
    """Where the cast's user fuses, moving it would put the view inside the region."""

    def fn(p: torch.Tensor) -> torch.Tensor:
        return p.transpose(1, 2).to(torch.bfloat16) * 2

    p = rand(3, 24, 40, seed=3)
    fb = FuserBackend(strict=True, check=True)
    got = torch.compile(fn, backend=fb, dynamic=False)(p)
    torch.testing.assert_close(got, fn(p))
    assert records(fb)[0].casts_moved == 0


def test_equal_casts_are_one() -> None:
    def fn(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16) @ a + x.to(torch.bfloat16) @ b

    x = rand(16, 32, seed=4)
    a, b = (rand(32, 8, seed=s, dtype=torch.bfloat16) for s in (5, 6))
    fb = FuserBackend(strict=True, check=True)
    got = torch.compile(fn, backend=fb, dynamic=False)(x, a, b)
    torch.testing.assert_close(got, fn(x, a, b))
    assert records(fb)[0].duplicates >= 1, explain(fb)


def test_random_calls_are_never_merged() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.rand_like(x) - torch.rand_like(x)

    out = torch.compile(fn, backend=FuserBackend(strict=True), dynamic=False)(rand(64, seed=7))
    assert out.abs().max() > 0  # two draws, not one drawn twice


@pytest.mark.parametrize("shared", [False, True])
def test_two_outputs_never_become_one_tensor(shared: bool) -> None:
    """Equal outputs, one value in the fusion (its CSE, or one cast merged here): two
    tensors at every call, the first (the region module's) included, where it was one
    returned twice (mutating one changed the other)."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if shared:
            y = x.float()
            return y * 1, y * 1
        return x.float() * 1, x.float() * 1

    compiled = torch.compile(fn, backend=FuserBackend(strict=True), dynamic=False)
    x = rand(8, 4, seed=8, dtype=torch.bfloat16)
    for _ in range(2):  # the first call (region modules), then the call program
        a, b = compiled(x)
        assert a.data_ptr() != b.data_ptr()
        a.add_(1)
        assert not torch.equal(a, b)


def test_two_clones_that_reach_outputs_through_a_view_stay_two() -> None:
    """`y.reshape(2, -1)` of a channels-last y is a clone and an `_unsafe_view` of it (a
    view whose schema does not say so); `y.contiguous()` is the same clone. Both reach the
    outputs, so they are not merged: the two outputs share no storage."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x * 2).relu()
        return y.reshape(2, -1), y.contiguous()

    x = rand(2, 3, 4, 5, seed=9).to(memory_format=torch.channels_last)
    fb = FuserBackend(strict=True)
    a, b = torch.compile(fn, backend=fb, dynamic=False)(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert records(fb)[0].duplicates == 0
