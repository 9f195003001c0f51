"""The call programs (fuser/dynamo/program/) called the ways users call compiled code:
in-place ops on inputs and intermediates, outputs that alias each other or an input,
clones, views and reshapes of inputs whose layout or storage offset changes between
calls, saved-tensor hooks, user gradients of odd layouts. Every case runs at least three
times (the program is built after the first call) with new tensors each call, and is
compared with eager: outputs, gradients, the inputs' mutations and which outputs share
storage. The first tests failed before their fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fuser.dynamo.backend import FuserBackend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _programs(backend: FuserBackend) -> dict[str, object]:
    return {g.kind: g.program for c in backend.captures for g in c.graphs if g.program}


def _tanh_softmax(x, w):
    y = (x * w).tanh()
    return (y.softmax(-1) * x.sigmoid()).sum(-1)


@pytest.mark.parametrize(
    "unpack",
    [
        pytest.param(lambda t: t[:3].clone() if t.dim() == 2 else t, id="fewer-rows"),
        pytest.param(lambda t: t.double() if t.is_floating_point() else t, id="float64"),
    ],
)
def test_saved_tensors_come_back_from_hooks_in_another_shape_or_dtype(unpack):
    """A backward program's inputs have no Dynamo guard: a saved-tensor hook may return
    them in another shape or dtype. The program checked their strides only and launched
    its kernels on them as the first call saw them: a [3, 10] tensor for a [6, 10] one
    gave gradients silently wrong (eager raises: sizes do not match), a float64 one is
    read as float32 on a GPU (eager raises, aot_eager computes it). Such a call now goes
    the old way, which plans for what it is given (and raises where eager raises)."""
    backend = FuserBackend()
    compiled = torch.compile(_tanh_softmax, backend=backend)
    g = _gen(0)
    for call in range(4):
        x, w = torch.randn(6, 10, generator=g), torch.randn(10, generator=g)
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        _tanh_softmax(xe, we).sum().backward()
        if call < 2:
            compiled(xc, wc).sum().backward()
            torch.testing.assert_close(xc.grad, xe.grad)
            continue
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            loss = compiled(xc, wc).sum()
        try:
            loss.backward()
        except RuntimeError:
            continue  # as eager: sizes that do not match
        torch.testing.assert_close(xc.grad, xe.grad)
    backward = _programs(backend)["backward"]
    assert backward.declined == 2, backward.source
