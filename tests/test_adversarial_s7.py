"""torch.compile(fn, backend="fuser") called the ways users call it: dynamic shapes, odd
layouts, aliasing and mutation, mixed dtypes, non-finite values and autograd modes, each
against eager on the CPU (kernels in Triton's interpreter). Each test here failed before
its fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_cross_entropy_backward_follows_symbolic_sizes():
    """nll_loss_backward's stand-in for the log-probabilities (saved.py) was expanded to
    raw SymInts, which FX prints as the sizes of the call traced: the backward of the
    next row count or vocabulary failed ('size mismatch', 'cannot broadcast')."""

    def f(logits, target):
        return F.cross_entropy(logits * 1.5, target)

    compiled = torch.compile(f, backend="fuser", dynamic=True)
    for rows, vocab in ((4, 10), (6, 13), (3, 7)):
        g = _gen(rows)
        x = torch.randn(rows, vocab, generator=g)
        t = torch.randint(0, vocab, (rows,), generator=g)
        xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(xc, t), f(xe, t)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(xc.grad, xe.grad)
