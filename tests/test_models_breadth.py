"""What running transformers families the suite does not cover through backend="fuser"
found, each reduced to the few ops that show it, against eager.

The families (tiny, random weights; a training step, an eval forward, greedy generate)
are benchmarks/family_configs.py's, run by benchmarks/families.py; the findings:

- Mamba's selective scan (state 8) reduced rows of 8 columns: no persistent layout put
  32 threads on them within 4 rows a block, so each row got the looped kernel's warp (a
  grid of 4096 one-warp programs, 94% of their lanes idle; 30 s a launch in Triton's
  interpreter, over 5 minutes for the tiny model's step).
"""

from __future__ import annotations

import pytest
import torch

import fuser
from fuser.frontend.fusion_definition import FusionDefinition


def _softmax(dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition("narrow_softmax") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.cast(fd.ops.softmax(fd.ops.cast(x, torch.float32)), dtype))
    return fd


@pytest.mark.parametrize("cols", [2, 3, 8])
@pytest.mark.parametrize("rows", [37, 300])
def test_narrow_rows_share_a_warp(backend: str, rows: int, cols: int) -> None:
    """A softmax over a few columns (an MoE router's experts) puts a warp of rows in a
    block, not a warp on each row; odd row counts leave the last block part empty, and a
    non-contiguous input is read through its strides."""
    g = torch.Generator().manual_seed(rows * 100 + cols)
    x = torch.randn(rows, 2 * cols + 1, generator=g)[:, 1 : cols + 1]
    fd = _softmax(torch.float32)
    (out,) = fd.execute([x], backend=backend)
    (k,) = fd.kernels
    s = k.schedule
    assert s.kind == "inner_persistent", s.explain()
    assert s.threads_per_row * s.rows_per_block >= 32, s.explain()
    torch.testing.assert_close(out, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)


def test_narrow_rows_keep_wider_schedules() -> None:
    """Rows that 4 rows a block already fill a warp with keep their layout: the wider
    search only runs when nothing else fits."""
    fd = _softmax(torch.float32)
    (k,) = fd.compile([torch.empty(1000, 16, device="meta")], device="h100")
    assert (k.schedule.threads_per_row, k.schedule.rows_per_block) == (8, 4), k.schedule.explain()


def test_scan_state_reduction_through_compile() -> None:
    """Mamba's scan backward, reduced: a product summed over a state of 8 per (batch,
    channel, step), forward and backward against eager."""

    def scan_step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (torch.exp(a) * b * c[:, None, :, :]).sum(-1)

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(2, 16, 5, 8, generator=g, requires_grad=True) for _ in range(2))
    c = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    want = scan_step(a, b, c)
    grads_want = torch.autograd.grad(want.sum(), (a, b, c))
    t = fuser.trace(scan_step, a, b, c, backward=False)
    got = t.outputs
    grads = torch.autograd.grad(got.sum(), (a, b, c))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for gg, gw in zip(grads, grads_want):
        torch.testing.assert_close(gg, gw, rtol=1e-5, atol=1e-6)
    kinds = {k.schedule.kind for k in t.kernels}
    assert "inner_looped" not in kinds, t.explain()
