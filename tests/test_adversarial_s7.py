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


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_cross_entropy_backward_twice_with_retain_graph(scale):
    """The one-pass cross-entropy's backward scaled its saved gradient in place and bumped
    its version: a second backward (retain_graph=True) raised autograd's 'modified by an
    inplace operation', which eager does not. Scaled out of place, the result kept
    contiguous rows where the gradient's were padded (logits made in the graph): the call
    program's views read it at the padded stride (rows shifted)."""

    def f(x, t):
        return F.cross_entropy(x * 2, t) * 3

    compiled = torch.compile(f, backend="fuser")
    g = _gen(1)
    x0, t = torch.randn(5, 11, generator=g), torch.randint(0, 11, (5,), generator=g)
    for _ in range(2):  # the second call runs the call program
        xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        le, lc = f(xe, t) * scale, compiled(xc, t) * scale
        for loss in (le, lc):
            loss.backward(retain_graph=True)
            loss.backward()
        torch.testing.assert_close(lc, le)
        torch.testing.assert_close(xc.grad, xe.grad)


def _mask_rows(x, m):
    z = x[m]  # as many rows as the mask has: a size no input size fixes (unbacked)
    return z.t() @ z, (x * 2).exp()


@pytest.mark.parametrize("dynamic", [False, True])
def test_sizes_that_depend_on_the_data(dynamic):
    """With capture_dynamic_output_shape_ops: the call program took the first call's
    row count of x[m] for fixed (its views resolved to 3 rows: 'mat1 and mat2 shapes
    cannot be multiplied' at the next mask); with dynamic shapes, the propagation of the
    concrete sizes raised DynamicOutputShapeException from torch.compile's call."""
    x = torch.randn(6, 4, generator=_gen(2))
    masks = [torch.tensor(b).bool() for b in ([1, 0, 1, 0, 0, 1], [1, 1, 1, 0, 1, 0])]
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(_mask_rows, backend="fuser", dynamic=dynamic)
        for m in masks * 2:
            for got, want in zip(compiled(x, m), _mask_rows(x, m)):
                torch.testing.assert_close(got, want)
        if dynamic:  # and a new input size: specialized at run time
            y = torch.randn(5, 4, generator=_gen(3))
            for got, want in zip(compiled(y, masks[0][:5]), _mask_rows(y, masks[0][:5])):
                torch.testing.assert_close(got, want)


def test_a_row_of_more_column_tiles_than_a_grid_allows_is_refused():
    """A pointwise kernel puts a row's column tiles on the grid's y, which CUDA caps at
    65535 blocks: a 1-D tensor of 600M elements was planned on a grid of (1, 146485),
    which no GPU launches. Refused at planning (a torch.compile region then stays ATen,
    with this reason) instead of failing at launch."""
    from fuser.errors import ScheduleError
    from fuser.frontend.fusion_definition import FusionDefinition

    with FusionDefinition("wide_pointwise") as fd:
        x = fd.define_tensor([-1], torch.float32)
        fd.add_output(fd.ops.mul(fd.ops.exp(x), x))
    with pytest.raises(ScheduleError, match=r"grid \(1, 146485\) exceeds CUDA's"):
        fd.compile([torch.empty(600_000_000, device="meta")])
    fd.compile([torch.empty(200_000_000, device="meta")])  # 48829 tiles: fine


def test_saved_tensors_come_back_from_hooks_in_other_strides():
    """Saved-tensor hooks may hand the backward its saved tensors back in other strides
    (torch.autograd.graph.save_on_cpu on a GPU returns them contiguous; here a hook that
    does the same): the one-pass cross-entropy's gradient, saved with padded rows, came
    back [5, 11] at stride 11, and the backward's call program, built at a call without
    the hooks, read it at stride 12 (gradients off by ~2, silently). A backward graph's
    program now checks its inputs' strides and hands other ones to the old path."""

    def f(x, t):
        return F.cross_entropy(x * 2, t) * 3

    compiled = torch.compile(f, backend="fuser")
    g = _gen(4)
    x0, t = torch.randn(5, 11, generator=g), torch.randint(0, 11, (5,), generator=g)
    for offload in (False, False, True, True, False):
        xe, xc = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        f(xe, t).backward()
        if offload:
            with torch.autograd.graph.saved_tensors_hooks(lambda s: s.contiguous(), lambda s: s):
                loss = compiled(xc, t)
        else:
            loss = compiled(xc, t)
        loss.backward()
        torch.testing.assert_close(xc.grad, xe.grad)
