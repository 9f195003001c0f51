"""Unaligned matmuls padded on the FX graph (fuser/dynamo/pad_mm.py): the same numbers as
eager forward and backward, the notes say what was padded, and a graph that cannot take
the padded result is left as it was."""

from __future__ import annotations

import pytest
import torch
from pad_helpers import head_both_ways

import fuser
from fuser.config import config
from fuser.dynamo import FuserBackend, pad_mm

torch.set_default_dtype(torch.float32)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors stay ATen on a GPU


pytestmark = pytest.mark.usefixtures("pad_every_matmul")  # conftest.py


def _padded_notes(backend: FuserBackend) -> list[str]:
    return [n for c in backend.captures for g in c.graphs for n in g.matmuls_padded]


def test_lm_head_with_odd_vocabulary_forward_and_backward() -> None:
    """x @ W.T with W [61, 30] (61 and 30 not multiples of 4 fp32 elements) and a
    cross-entropy after it: loss and both gradients as in eager."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(61, 30, generator=g) * 0.2
    x0 = torch.randn(2, 37, 30, generator=g)
    target = torch.randint(0, 61, (2 * 37,), generator=g)

    def step(x, w):
        logits = x @ w.t()
        return torch.nn.functional.cross_entropy(logits.view(-1, 61), target), logits

    be = FuserBackend()
    compiled = torch.compile(step, backend=be)
    results = []
    for fn in (step, compiled):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss, logits = fn(x, w)
        loss.backward()
        results.append((loss.detach(), logits.detach(), x.grad, w.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    notes = _padded_notes(be)
    assert any("N 61 -> 64" in n for n in notes), notes  # forward: the logits' columns
    assert any("K 61 -> 64" in n for n in notes), notes  # backward: dx = dlogits @ w
    assert any("M 61 -> 64" in n for n in notes), notes  # backward: dw = dlogits.T @ x
    assert "padded" in fuser.explain(be)


def test_addmm_bias_is_padded_with_its_columns() -> None:
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(30, 45)
    x = torch.randn(19, 30, generator=g)
    be = FuserBackend()
    got = torch.compile(lambda t: torch.relu(lin(t)), backend=be)(x)
    torch.testing.assert_close(got, torch.relu(lin(x)), atol=1e-5, rtol=1e-5)
    assert any("N 45 -> 48" in n for n in _padded_notes(be))


def test_disabled_by_config(monkeypatch) -> None:
    from fuser.config import config

    monkeypatch.setattr(config, "pad_matmuls", False)
    w = torch.randn(61, 30)
    be = FuserBackend()
    x = torch.randn(5, 30)
    got = torch.compile(lambda t: torch.tanh(t @ w.t()), backend=be)(x)
    torch.testing.assert_close(got, torch.tanh(x @ w.t()), atol=1e-5, rtol=1e-5)
    assert not _padded_notes(be)


def test_aligned_and_small_matmuls_are_left_alone(monkeypatch) -> None:
    monkeypatch.setattr(pad_mm, "MIN_MACS", 10**9)
    w = torch.randn(61, 30)
    be = FuserBackend()
    x = torch.randn(5, 30)
    torch.compile(lambda t: torch.tanh(t @ w.t()), backend=be)(x)
    assert not _padded_notes(be)


def test_a_transpose_that_swaps_nothing_is_not_peeled() -> None:
    """transpose(1, -1) of a 2-D tensor is the tensor itself: padding its "source" the
    other way round gave wrong numbers for square operands (review of 2026-11-22)."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(33, 33, generator=g), torch.randn(33, 33, generator=g)
    for fn in (lambda a, b: a @ b.transpose(1, -1), lambda a, b: a @ b.transpose(0, 0)):
        torch._dynamo.reset()
        be = FuserBackend()
        got = torch.compile(fn, backend=be)(a, b)
        torch.testing.assert_close(got, fn(a, b), atol=1e-4, rtol=1e-4)
        assert _padded_notes(be)


def test_a_padded_result_returned_is_a_view_of_the_padded_rows(monkeypatch) -> None:
    """By default a returned padded result is the padded rows' view (eager's stride order,
    as Inductor returns it: no copy); FUSER_EAGER_OUTPUT_STRIDES=1 returns eager's
    contiguous strides."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(20, 30, generator=g), torch.randn(30, 45, generator=g)
    for eager_strides in (False, True):
        torch._dynamo.reset()
        monkeypatch.setattr(config, "eager_output_strides", eager_strides)
        be = FuserBackend()
        y = torch.compile(lambda x, w: x @ w, backend=be)(x, w)
        assert any("N 45 -> 48" in n for n in _padded_notes(be))
        assert y.shape == (20, 45)
        assert y.stride() == ((45, 1) if eager_strides else (48, 1))
        said = "contiguous copy" if eager_strides else "in its padded rows"
        assert any(said in n for n in _padded_notes(be)), _padded_notes(be)
        torch.testing.assert_close(y, x @ w, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(y.view(-1, 45).sum(0), (x @ w).sum(0), atol=1e-4, rtol=1e-4)


def test_returned_padded_result_can_be_modified_in_place() -> None:
    """The returned padded rows are a tensor of their own, not a view made inside the
    compiled function: a caller may write into them (`logits[:, banned] = -1e4`) and
    backpropagate, as with eager's result (a view there raised autograd's error)."""
    g = torch.Generator().manual_seed(7)
    x0, w0 = torch.randn(20, 30, generator=g), torch.randn(45, 30, generator=g)

    def use(y: torch.Tensor) -> None:
        y[:, 3] = -1e4
        y.mul_(1.5)
        (y.exp() * 0 + y.square()).mean().backward()

    results = head_both_ways(x0, w0, use)
    assert results[1][0].stride() == (48, 1)
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_returned_padded_logits_take_an_eager_loss_and_its_backward() -> None:
    """The logits leave the compiled graph as padded rows; a loss computed on them in
    eager, outside the graph, sends its gradient back into the compiled backward: both
    parameters' gradients as eager's, whatever strides the incoming gradient has."""
    g = torch.Generator().manual_seed(6)
    x0, w0 = torch.randn(3, 7, 30, generator=g), torch.randn(61, 30, generator=g) * 0.2
    target = torch.randint(0, 61, (21,), generator=g)

    def use(logits: torch.Tensor) -> None:
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 61), target)
        (loss + logits[:, 1:, :5].square().mean()).backward()

    results = head_both_ways(x0, w0, use)
    assert results[1][0].stride()[-1] == 1
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("one_pass", [False, True])
def test_logits_saved_for_the_backward_keep_their_padded_rows(monkeypatch, one_pass) -> None:
    """GPT-2's lm head: the logits its cross-entropy saves for the backward are the padded
    matmul's rows (no copy), as are the logits returned to the caller. With
    the one-pass cross-entropy (fuser/dynamo/ce_op.py) no logits are saved at all: its
    bf16 gradient is, read from the padded rows by the forward kernel."""
    monkeypatch.setattr(config, "one_pass_cross_entropy", one_pass)
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(2, 10, 30, generator=g).to(DEVICE)
    w0 = torch.randn(45, 30, generator=g).to(DEVICE)
    target = torch.randint(0, 45, (20,), generator=g).to(DEVICE)

    def step(x, w):
        logits = x.bfloat16() @ w.bfloat16().t()
        return torch.nn.functional.cross_entropy(logits.view(-1, 45).float(), target), logits

    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    be = FuserBackend()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, logits = torch.compile(step, backend=be)(x, w)
    assert any("N 45 -> 48" in n for n in _padded_notes(be))
    assert logits.stride() == (480, 48, 1)
    # the returned logits are views of their own: the region reading the logits (the
    # cross-entropy) does not take the returned view as an output to write out (on an
    # H100 that made GPT-2's cross-entropy 4x slower)
    regions = [r for c in be.captures for g in c.graphs for r in g.fused]
    reading = [r for r in regions if any("cross_entropy" in str(n) for n in r.nodes)]
    assert not one_pass or reading
    for r in reading:
        assert not [n for n in r.nodes if "aten.slice" in str(n)], [str(n) for n in r.nodes]
    rows = [t for t in saved if t.dim() > 1 and t.shape[-1] == 45 and t.dtype == torch.bfloat16]
    if one_pass:
        assert [tuple(t.shape) for t in rows] == [(20, 45)]  # the gradient
        assert not [t for t in saved if t.shape[-1] == 45 and t.dtype == torch.float32]
    else:
        assert rows and rows[0].stride()[-2:] == (48, 1), [(t.shape, t.stride()) for t in saved]
    loss.backward()
    xr, wr = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    want, want_logits = step(xr, wr)
    want.backward()
    torch.testing.assert_close(logits, want_logits)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(w.grad, wr.grad, atol=1e-2, rtol=1e-2)


def test_addmm_with_a_scalar_or_a_full_bias() -> None:
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(21, 30, generator=g), torch.randn(30, 45, generator=g)
    for bias in (torch.tensor(1.5), torch.randn(21, 45, generator=g), torch.randn(1, 45)):
        torch._dynamo.reset()
        be = FuserBackend(strict=True)
        got = torch.compile(lambda b, x, w: torch.relu(torch.addmm(b, x, w)), backend=be)(
            bias, x, w
        )
        torch.testing.assert_close(got, torch.relu(torch.addmm(bias, x, w)), atol=1e-5, rtol=1e-5)
        assert any("N 45 -> 48" in n for n in _padded_notes(be)), bias.shape
