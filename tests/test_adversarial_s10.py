"""Session 10's padded matmuls and cross-entropy gradient pad, called the ways users call
compiled code (fuser/dynamo/pad_mm.py, ce_pad.py): returned padded logits modified in
place, aliased by views returned with them, held across calls, fed to a second graph;
the aligned gradient saved through hooks that hand back other buffers, weight tying,
two losses on one logits, dynamic shapes. Each is compared with eager: values,
gradients, aliasing, and the errors eager raises. The first three tests failed before
their fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pad_helpers import head_both_ways, tanh_head

from fuser.config import config
from fuser.dynamo import FuserBackend

V = 45  # an odd vocabulary: fp32 rows padded to 48, bf16 ones to 48


pytestmark = pytest.mark.usefixtures("pad_every_matmul")  # conftest.py


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _padded(backend: FuserBackend, kind: str = "forward") -> list[str]:
    return [
        n for c in backend.captures for g in c.graphs if g.kind == kind for n in g.matmuls_padded
    ]


def _close(got, want, tol: float = 1e-4) -> None:  # noqa: ANN001
    assert len(got) == len(want)
    for a, b in zip(got, want):
        scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0
        torch.testing.assert_close(a, b, atol=tol * scale, rtol=tol)


# ---- bugs found, fixed


@pytest.mark.parametrize("eager_strides", [False, True])
def test_changing_returned_logits_that_the_backward_reads_raises(monkeypatch, eager_strides):  # noqa: ANN001
    """`l, loss = f(x, w); l.add_(1); loss.backward()` where the backward reads l: eager
    (and aot_eager, and fuser unpadded) raise autograd's in-place error. The returned
    padded logits were a tensor of their own on the storage the backward read (own
    version counter): no error, and a gradient from the changed values. Now the saved
    output is the returned tensor itself."""
    monkeypatch.setattr(config, "eager_output_strides", eager_strides)
    g = _gen(0)
    x0, w0 = torch.randn(2, 6, 32, generator=g), torch.randn(V, 32, generator=g) * 0.3

    def step(x, w):  # noqa: ANN001, ANN202
        logits = torch.tanh(x) @ w.t()
        return logits, (logits * logits).sum()

    backend = FuserBackend()
    compiled = torch.compile(step, backend=backend)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    logits, loss = compiled(x, w)
    assert any("N 45 -> 48" in n for n in _padded(backend))
    logits.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    # untouched, the same call gives eager's gradients
    xe, we = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    step(xe, we)[1].backward()
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    logits, loss = compiled(x, w)
    loss.backward()
    _close((logits.detach(), x.grad, w.grad), (step(x0, w0)[0], xe.grad, we.grad))


def test_eager_output_strides_result_can_be_modified_in_place(monkeypatch) -> None:  # noqa: ANN001
    """FUSER_EAGER_OUTPUT_STRIDES=1: the contiguous copy of 3-D padded logits left the
    graph as a reshape of the copy, a view made inside the compiled function, and
    `logits[0, 0, 0] = 1` raised autograd's custom-Function view error (eager's result is
    a tensor of its own). The copy is returned through returned_alias too now."""
    monkeypatch.setattr(config, "eager_output_strides", True)
    g = _gen(1)
    x0, w0 = torch.randn(2, 7, 30, generator=g), torch.randn(V, 30, generator=g) * 0.3

    def use(y: torch.Tensor) -> None:
        y[:, 0, 3] = -5.0
        y[..., :4].mul_(2)
        y.square().sum().backward()

    results = head_both_ways(x0, w0, use)
    assert results[1][0].stride() == (315, 45, 1) and results[1][0]._base is None
    _close(results[1], results[0])


def test_as_strided_of_a_padded_result_is_not_padded() -> None:
    """as_strided reads storage by the strides it is given: on the padded rows (48 apart)
    `logits.as_strided((14, 5), (45, 1))` read other elements than eager's, silently
    (shapes propagate all the same). Such a graph is left unpadded now."""
    g = _gen(2)
    x0, w0 = torch.randn(14, 30, generator=g), torch.randn(V, 30, generator=g) * 0.3

    def fn(x, w):  # noqa: ANN001, ANN202
        logits = torch.tanh(x) @ w.t()
        return logits.as_strided((14, 5), (45, 1)).exp(), logits.as_strided((3, 4), (45, 2), 7)

    backend = FuserBackend()
    compiled = torch.compile(fn, backend=backend)
    results = []
    for f in (fn, compiled):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        a, b = f(x, w)
        (a.sum() + b.square().sum()).backward()
        results.append((a.detach(), b.detach(), x.grad, w.grad))
    _close(results[1], results[0])
    assert not _padded(backend)


# ---- cases that pass


def test_returned_logits_and_their_views_alias_as_in_eager() -> None:
    """logits, logits[..., :5] and logits.transpose(-1, -2) returned together: a write
    through one is read through the others, `return l, l` is one tensor, and the
    backward through all of them is eager's."""
    g = _gen(3)
    x0, w0 = torch.randn(2, 7, 30, generator=g), torch.randn(V, 30, generator=g) * 0.3

    def fn(x, w):  # noqa: ANN001, ANN202
        logits = torch.tanh(x) @ w.t()
        return logits, logits[..., :5], logits.transpose(-1, -2), logits

    compiled = torch.compile(fn, backend=FuserBackend())
    results = []
    for f in (fn, compiled):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        logits, head, t, same = f(x, w)
        assert same is logits
        (logits.sum() + head.square().sum() + t.cos().sum()).backward()
        with torch.no_grad():
            logits[0, 0, 0] = 100.0
            head[1, 1, 1] = -7.0
            t[1, 3, 2] = 9.0
        seen = torch.stack(
            [head[0, 0, 0], t[0, 0, 0], logits[1, 1, 1], t[1, 1, 1], logits[1, 2, 3]]
        )
        results.append((seen, logits.detach(), x.grad, w.grad))
    assert results[1][1].stride() == (336, 48, 1)
    _close(results[1], results[0])


def test_view_of_the_whole_padded_result_raises_a_clear_error(monkeypatch) -> None:  # noqa: ANN001
    """`.view(-1)` of the padded rows is torch's own error (use .reshape), not a wrong
    result; with FUSER_EAGER_OUTPUT_STRIDES=1 it works."""
    g = _gen(4)
    x, w = torch.randn(2, 7, 30, generator=g), torch.randn(V, 30, generator=g)
    y = torch.compile(tanh_head, backend=FuserBackend())(x, w)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        y.view(-1)
    _close((y.reshape(-1),), (tanh_head(x, w).view(-1),))
    torch._dynamo.reset()
    monkeypatch.setattr(config, "eager_output_strides", True)
    y = torch.compile(tanh_head, backend=FuserBackend())(x, w)
    _close((y.view(-1),), (tanh_head(x, w).view(-1),))


def test_outputs_held_across_calls_and_read_by_a_second_graph() -> None:
    """The first calls' logits survive later calls (the memory plan does not reuse the
    storage under a returned tensor), with and without a backward in between; a graph
    after a graph break takes the padded rows as its input."""
    g = _gen(5)
    w0 = torch.randn(V, 30, generator=g) * 0.3
    xs = [torch.randn(2, 7, 30, generator=g) for _ in range(3)]
    arange = torch.arange(V, dtype=torch.float32)

    def fn(x, w):  # noqa: ANN001, ANN202
        logits = torch.tanh(x) @ w.t()
        loss = F.cross_entropy(logits.view(-1, V), torch.arange(14) % V)
        torch._dynamo.graph_break()
        return logits, loss + (logits.sin() * logits[..., :3].sum(-1, keepdim=True)).mean()

    compiled = torch.compile(fn, backend=FuserBackend())
    got, want = [], []
    for i, x0 in enumerate(xs):
        for f, out in ((fn, want), (compiled, got)):
            x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
            logits, loss = f(x, w)
            if i != 1:
                (loss + (logits.softmax(-1) * arange).sum()).backward()
            out.append((logits, loss.detach(), x.grad if i != 1 else x0))
    assert got[0][0].stride() == (336, 48, 1)
    _close([t.detach() for r in got for t in r], [t.detach() for r in want for t in r])


def _nan_gap_copy(t: torch.Tensor) -> torch.Tensor:
    """A saved-tensor hook's copy of a gapped [N, V] tensor in the same layout, the whole
    of a new storage (so padded_rows takes it as its own) whose gaps hold NaN."""
    if t.dim() != 2 or t.stride(1) != 1 or t.stride(0) <= t.shape[1]:
        return t
    n, stride = t.shape[0], t.stride(0)
    out = torch.full((n * stride,), float("nan"), dtype=t.dtype).as_strided(t.shape, t.stride())
    return out.copy_(t)


def _offset_copy(t: torch.Tensor) -> torch.Tensor:
    """The same layout one row into a larger storage: not the buffer planned for, padded
    by a copy."""
    if t.dim() != 2 or t.stride(1) != 1 or t.stride(0) <= t.shape[1]:
        return t
    n, stride = t.shape[0], t.stride(0)
    flat = torch.full(((n + 1) * stride,), float("nan"), dtype=t.dtype)
    return flat.as_strided(t.shape, t.stride(), stride).copy_(t)


@pytest.mark.parametrize("pack", [_nan_gap_copy, _offset_copy])
def test_cross_entropy_gradient_through_hooks_with_retain_graph(pack) -> None:  # noqa: ANN001
    """The saved aligned gradient comes back from a hook as a buffer of its own (NaN in
    the gap) or one row into a larger one: two backwards (retain_graph, upstream 2 then
    3), ignored rows, label smoothing; loss and gradients as eager's, call after call."""
    g = _gen(6)
    x0, w0 = torch.randn(2, 6, 32, generator=g), torch.randn(V, 32, generator=g) * 0.3
    target = torch.randint(0, V, (12,), generator=g)
    target[[2, 7]] = -100

    def step(x, w):  # noqa: ANN001, ANN202
        logits = x.bfloat16() @ w.bfloat16().t()
        return F.cross_entropy(logits.view(-1, V).float(), target, label_smoothing=0.1)

    compiled = torch.compile(step, backend=FuserBackend())
    results = []
    for f in (step, compiled, compiled):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = f(x, w)
        (loss * 2).backward(retain_graph=True)
        (loss * 3).backward()
        results.append((loss.detach(), x.grad, w.grad))
    _close(results[1], results[0], 2e-2)
    _close(results[2], results[0], 2e-2)


def test_weight_tying_two_losses_on_one_logits_returned() -> None:
    """The lm head's weight is the embedding's; two cross-entropies (one smoothed, with
    ignored rows) read the same bf16 logits, which are returned too; upstream 1.7."""
    g = _gen(7)
    emb0 = torch.randn(V, 32, generator=g) * 0.3
    ids = torch.randint(0, V, (2, 6), generator=g)
    t1, t2 = torch.randint(0, V, (12,), generator=g), torch.randint(0, V, (12,), generator=g)
    t2[3] = -100

    def step(emb):  # noqa: ANN001, ANN202
        x = F.embedding(ids, emb)
        logits = (torch.tanh(x) + x).bfloat16() @ emb.bfloat16().t()
        flat = logits.view(-1, V).float()
        return F.cross_entropy(flat, t1) + 0.5 * F.cross_entropy(
            flat, t2, label_smoothing=0.1
        ), logits

    compiled = torch.compile(step, backend=FuserBackend())
    results = []
    for f in (step, compiled):
        emb = emb0.clone().requires_grad_()
        loss, logits = f(emb)
        (loss * 1.7).backward()
        results.append((loss.detach(), logits.detach().float(), emb.grad))
    _close(results[1], results[0], 2e-2)


def test_dynamic_batch_and_m_padded_gradients_held() -> None:
    """dynamic=True over batch sizes (symbolic M: not padded, the rest as eager's), and a
    static M = 45 padded as well as V: the parameters' gradients of each call, held,
    keep eager's values and strides."""
    g = _gen(8)
    w0 = torch.randn(V, 30, generator=g) * 0.3

    def step(x, w):  # noqa: ANN001, ANN202
        logits = torch.tanh(x).bfloat16() @ w.bfloat16().t()
        rows = logits.view(-1, V)
        return F.cross_entropy(rows.float(), torch.arange(rows.shape[0]) % V), logits

    for dynamic, batches in ((True, (2, 3, 5)), (None, (5, 5))):
        torch._dynamo.reset()
        compiled = torch.compile(step, backend=FuserBackend(), dynamic=dynamic)
        got, want = [], []
        for b in batches:
            x0 = torch.randn(b, 9, 30, generator=g)
            for f, out in ((step, want), (compiled, got)):
                x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
                loss, logits = f(x, w)
                (loss * 2).backward()
                out.append((loss.detach(), logits.detach().float(), x.grad, w.grad))
        for a, b in zip(got, want):
            _close(a, b, 2e-2)
            assert a[2].stride() == b[2].stride() and a[3].stride() == b[3].stride()


@pytest.mark.parametrize("grad", [False, True])
def test_eager_output_strides_views_share_the_copy(monkeypatch, grad) -> None:  # noqa: ANN001
    """FUSER_EAGER_OUTPUT_STRIDES=1 under no_grad: each returned view of the padded logits
    was a contiguous copy of its own, so a write through `logits` was not seen through
    `logits[:, :7]` or `logits.t()` (eager's are views of one tensor), and `logits.t()`
    had a copy's strides, not eager's. Now one copy, the views replayed on it."""
    monkeypatch.setattr(config, "eager_output_strides", True)
    g = _gen(9)
    x0, w0 = torch.randn(14, 32, generator=g), torch.randn(V, 32, generator=g) * 0.3

    def fn(x, w):  # noqa: ANN001, ANN202
        logits = x @ w.t()
        return logits, logits[:, :7], logits.t()

    compiled = torch.compile(fn, backend=FuserBackend())
    results = []
    for f in (fn, compiled):
        with torch.set_grad_enabled(grad):
            outs = f(x0.clone().requires_grad_(grad), w0)
        strides = [o.stride() for o in outs]
        logits, head, t = (o.detach() for o in outs)
        logits[:, 0] = 3.0
        t[2, 1] = 11.0
        results.append((strides, torch.stack([head[5, 0], head[1, 2], t[0, 4], logits[1, 2]])))
    assert results[1][0] == results[0][0]
    _close((results[1][1],), (results[0][1],))
