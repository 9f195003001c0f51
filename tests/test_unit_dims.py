"""Batch 1: values that differ from the kernel's domain only by size-1 row dims.

At B=1 a decoder's matmul output [T, C] is viewed as [1, T, C] and added to the residual
stream; the view is a broadcast that inserts a dim, and the value before it has the same
rows as the domain. It is a full tile of it (fuser/segmenter/classify.py); the residual
add and the norm after it are one kernel, as at B > 1 (before: two ATen segments that
copied the view). Against eager, forward and backward, with odd sizes.
"""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import FuserBackend
from fuser.dynamo.explain import explain

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE)


@pytest.mark.parametrize("lead", [(1,), (1, 1)])
def test_residual_norm_at_batch_one(lead: tuple[int, ...]) -> None:
    t, c = 13, 40

    def fn(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = r + x.view(*lead, t, c)
        y = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * h * w
        return h, y.view(t, c)

    args = [rand(t, c, seed=1), rand(*lead, t, c, seed=2), rand(c, seed=3)]
    fb = FuserBackend(strict=True, check=True)
    compiled = torch.compile(fn, backend=fb, dynamic=False)
    results = []
    for f in (fn, compiled):
        xs = [a.detach().requires_grad_() for a in args]
        outs = f(*xs)
        sum((o * rand(*o.shape, seed=9 + i)).sum() for i, o in enumerate(outs)).backward()
        results.append((outs, [x.grad for x in xs]))
    (want, want_grads), (got, grads) = results
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b)
    text = explain(fb)
    assert "ATen fallback" not in text, text
    forward = fb.captures[0].graphs[0]
    assert len(forward.kernels) == 1, text


def _run(fn, args: list[torch.Tensor]) -> str:  # noqa: ANN001
    fb = FuserBackend(strict=True, check=True)
    got = torch.compile(fn, backend=fb, dynamic=False)(*args)
    torch.testing.assert_close(got, fn(*args))
    return explain(fb)


def test_a_row_value_without_the_domains_unit_dims() -> None:
    """[T] per query, broadcast over a [1, 1, T, T] score tile at batch 1 (GPT-J's, BLOOM's
    and MPT's masks): a row value whose dims other than 1s are the domain's row dims."""
    t = 9
    s, bias = rand(1, 1, t, t, seed=4), rand(t, seed=5)
    text = _run(lambda a, b: torch.softmax(a + b[:, None], -1), [s, bias])
    assert "ATen fallback" not in text, text


def test_a_column_value_with_fewer_unit_dims() -> None:
    """[1, C] over a [1, 1, C] domain (Mixtral's router at one token): a column value."""
    c = 24
    x, w = rand(1, 1, c, seed=6), rand(1, c, seed=7)
    text = _run(lambda a, b: (a * b).sum(-1, keepdim=True) * a, [x, w])
    assert "ATen fallback" not in text, text
