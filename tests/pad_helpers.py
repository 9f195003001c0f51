"""Helpers of the tests of padded matmuls (fuser/dynamo/pad_mm.py, ce_pad.py): an lm
head run eager and through backend="fuser", with what the caller does to its output."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fuser.dynamo import FuserBackend


def tanh_head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) @ w.t()


def head_both_ways(
    x0: torch.Tensor, w0: torch.Tensor, use: Callable[[torch.Tensor], None]
) -> list[tuple[torch.Tensor, ...]]:
    """[eager, compiled]: tanh_head on fresh leaf copies of x0 and w0, `use(y)` on its
    output (in-place writes, a loss's backward), then (y.detach(), x.grad, w.grad)."""
    compiled = torch.compile(tanh_head, backend=FuserBackend())
    results = []
    for fn in (tanh_head, compiled):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = fn(x, w)
        use(y)
        results.append((y.detach(), x.grad, w.grad))
    return results
