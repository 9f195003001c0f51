"""One-pass cross-entropy under torch.compile (fuser/dynamo/ce_op.py, ce_rewrite.py,
ce_lower.py, ce_scale.py): F.cross_entropy becomes fuser::cross_entropy before
AOTAutograd, whose forward kernel writes the loss and the gradient and whose backward
scales the saved gradient in place.

Loss and gradient against eager in float32 (the reference: the logits upcast, eager's
own ops) for bf16/fp16/fp32 logits, with and without .float(), every reduction,
ignore_index (a block of ignored rows, every row ignored), label smoothing, odd V, one
row, [B, T, V] logits flattened by view, a strided (sliced) view, an upstream gradient
that is not 1, on both backends; a target out of range raises; the compiled graphs hold
no float32 copy of the logits and the backward reads no logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.errors import OutOfBoundsError

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the gradient is rounded once to the logits' dtype; the loss sums rows in float32
GRAD_TOL = {F32: 1e-5, F16: 2e-3, BF16: 1.6e-2}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _data(rows: int, v: int, dtype: torch.dtype, ignored: list[int] = (), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, v, generator=g) * 2).to(dtype)
    t = torch.randint(0, v, (rows,), generator=g)
    t[list(ignored)] = -1
    return x.to(DEVICE), t.to(DEVICE)


def _loss_fn(upcast: bool, reduction: str, smoothing: float, scale: float = 1.0):
    def f(x, t):
        y = x.float() if upcast else x
        y = y.view(-1, y.shape[-1])
        loss = F.cross_entropy(
            y, t.view(-1), reduction=reduction, ignore_index=-1, label_smoothing=smoothing
        )
        return loss * scale if scale != 1.0 else loss

    return f


def _reference(x, t, reduction, smoothing, scale, upstream):
    xr = x.detach().float().requires_grad_(True)
    loss = F.cross_entropy(
        xr.view(-1, x.shape[-1]), t.view(-1), reduction=reduction, ignore_index=-1,
        label_smoothing=smoothing,
    ) * scale  # fmt: skip
    (loss * upstream).sum().backward()
    return loss.detach(), xr.grad


def _compiled(f, x, t, upstream, backend=None):
    xc = x.detach().clone().requires_grad_(True)
    g = torch.compile(f, backend=backend or "fuser")
    loss = g(xc, t)
    (loss * upstream).sum().backward()
    return g, loss.detach(), xc.grad


def _check(x, t, *, upcast=True, reduction="mean", smoothing=0.0, scale=1.0, upstream=1.0):
    f = _loss_fn(upcast, reduction, smoothing, scale)
    want_loss, want_grad = _reference(x, t, reduction, smoothing, scale, upstream)
    b = FuserBackend(strict=True)
    _, loss, grad = _compiled(f, x, t, upstream, b)
    assert sum(c.cross_entropy for c in b.captures) == 1, "the call was not made one-pass"
    assert grad.dtype == x.dtype and grad.shape == x.shape
    assert loss.dtype == (F32 if upcast else x.dtype)
    ltol = 1e-5 if loss.dtype == F32 else GRAD_TOL[loss.dtype] * 4
    torch.testing.assert_close(loss.float(), want_loss, atol=ltol, rtol=ltol, equal_nan=True)
    tol = GRAD_TOL[x.dtype]
    torch.testing.assert_close(grad.float(), want_grad, atol=tol * 1e-1, rtol=tol)


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("upcast", [True, False])
def test_dtypes_mean(backend: str, dtype: torch.dtype, upcast: bool) -> None:
    x, t = _data(5, 1001, dtype, ignored=[2])
    _check(x, t, upcast=upcast)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reductions_with_smoothing_and_ignored_block(backend: str, reduction: str) -> None:
    x, t = _data(9, 333, BF16, ignored=[3, 4, 5, 6])
    _check(x, t, reduction=reduction, smoothing=0.1)


@pytest.mark.nonfinite  # 0 valid targets: eager's mean is 0/0 = nan
def test_every_target_ignored(backend: str) -> None:
    x, t = _data(4, 257, BF16, ignored=[0, 1, 2, 3])
    _check(x, t, smoothing=0.2)


def test_one_row_and_odd_vocabulary(backend: str) -> None:
    x, t = _data(1, 997, F16)
    _check(x, t)


def test_batch_time_vocabulary_view(backend: str) -> None:
    """[B, T, V] logits and [B, T] targets flattened by view, as nanoGPT writes it."""
    x, t = _data(6, 211, BF16)
    _check(x.view(2, 3, 211), t.view(2, 3))


def test_strided_rows(backend: str) -> None:
    """Logits that are a column slice of a wider tensor (pad_mm.py's padded lm head)."""
    wide, t = _data(5, 520, BF16)
    x = wide[:, :513]
    f = _loss_fn(True, "mean", 0.0)

    def sliced(w, t):
        return f(w[:, :513], t)

    want_loss, want_grad = _reference(x, t, "mean", 0.0, 1.0, 1.0)
    wc = wide.clone().requires_grad_(True)
    loss = torch.compile(sliced, backend=FuserBackend(strict=True))(wc, t)
    loss.backward()
    torch.testing.assert_close(loss, want_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wc.grad[:, :513].float(), want_grad, atol=2e-3, rtol=1.6e-2)
    assert not wc.grad[:, 513:].any()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_upstream_gradient_not_one(backend: str, reduction: str) -> None:
    """A loss scaled inside the graph and an upstream gradient from outside it (loss
    scaling, gradient accumulation): the in-place scaling is taken, not skipped."""
    x, t = _data(6, 300, BF16, ignored=[1])
    _check(x, t, reduction=reduction, scale=0.25, upstream=3.0)


def test_target_out_of_range_raises(backend: str) -> None:
    x, t = _data(3, 100, BF16)
    t[1] = 100
    # the message itself (not the FX wrapper text "call_module[target=...]" that a CPU
    # launch adds, and a GPU one raised later by check_errors() does not)
    with pytest.raises(OutOfBoundsError, match=r"Target 100 is out of bounds: .* \[0, 100\)"):
        _compiled(_loss_fn(True, "mean", 0.0), x, t, 1.0, FuserBackend(strict=True))
        # on a GPU the kernel reports through the host flag without a synchronization:
        # the next fuser call raises, or check_errors(), which waits for the kernels
        fuser.check_errors()


def test_graphs_hold_no_upcast_copy_and_backward_reads_no_logits() -> None:
    x, t = _data(4, 500, BF16)
    b = FuserBackend(strict=True)
    _compiled(_loss_fn(True, "mean", 0.0), x, t, 1.0, b)
    fw, bw = b.captures[0].graphs
    assert "_to_copy" not in fw.aten_graph and "_log_softmax" not in fw.aten_graph
    assert "fuser.cross_entropy" in fw.aten_graph
    (region,) = fw.fused
    k = [k for k in region.kernels if "max" in k.source]
    assert len(k) == 1  # the row kernel: max, sum, loss and gradient
    # the backward's only op scales the saved gradient in place: no kernel, no logits
    assert bw.kernels == [] and "scale_in_place" in (bw.program.source or "scale_in_place")
    calls = [n for n in bw.module.graph.nodes if n.op == "call_function"]
    assert [n.target.__name__ for n in calls][0] == "scale_in_place"
    assert all("view" in str(n.target) for n in calls[1:]), calls
    # its inputs: the saved gradient and the upstream gradient, no logits
    assert len([n for n in bw.module.graph.nodes if n.op == "placeholder"]) == 2
    text = str(fuser.explain(b))
    assert "scale_in_place" in text


def test_no_grad_keeps_the_old_path() -> None:
    """Without a backward there is no gradient to write: the call stays F.cross_entropy."""
    x, t = _data(4, 100, F32)
    b = FuserBackend(strict=True)
    with torch.no_grad():
        loss = torch.compile(_loss_fn(True, "mean", 0.0), backend=b)(x, t)
    torch.testing.assert_close(loss, F.cross_entropy(x, t), atol=1e-5, rtol=1e-5)
    assert b.captures[0].cross_entropy == 0


def test_eager_op_matches_torch() -> None:
    """The op's ATen implementation (the fallback, and what runs without a compile)."""
    x, t = _data(7, 50, BF16, ignored=[0, 6])
    xr = x.float().requires_grad_(True)
    want = F.cross_entropy(xr, t, ignore_index=-1, label_smoothing=0.3)
    want.backward()
    loss, grad = torch.ops.fuser.cross_entropy(x, t, 1, -1, 0.3, True)
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(grad.float(), xr.grad, atol=1e-3, rtol=1.6e-2)


def test_autocast_loss_is_float32_as_eager(backend: str) -> None:
    """Under autocast eager computes cross-entropy in float32 and returns a float32 loss
    from bf16 logits with no .float() written; the one-pass op must too (found on the
    H100: a GPT-2 step's loss came back in bf16)."""
    x, t = _data(6, 300, BF16)
    f = _loss_fn(False, "mean", 0.0)
    with torch.autocast(DEVICE, dtype=BF16):
        want = f(x, t)
        b = FuserBackend(strict=True)
        g = torch.compile(f, backend=b)
        xc = x.detach().clone().requires_grad_(True)
        got = g(xc, t)
    assert sum(c.cross_entropy for c in b.captures) == 1
    assert got.dtype == want.dtype == torch.float32
    got.backward()
    assert xc.grad.dtype == BF16
    xr = x.detach().float().requires_grad_(True)
    ref = F.cross_entropy(xr, t)
    ref.backward()
    torch.testing.assert_close(got.detach(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xc.grad.float(), xr.grad, rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize(
    "vocab, returned, rule, one_pass",
    [
        (64, False, "one-pass", True),
        (64, True, "one-pass", True),
        (64, True, "two-pass", False),
        (67, True, "two-pass", True),
        (64, False, "two-pass", True),
    ],
)
def test_returned_logits_take_the_form_the_rule_says(
    monkeypatch: pytest.MonkeyPatch, vocab: int, returned: bool, rule: str, one_pass: bool
) -> None:
    """A model that returns its logits: by default the one-pass form (the caller that drops
    them frees them; the gradient is the one [N, V] buffer at the backward); with
    FUSER_CE_RETURNED=two-pass, where their rows are 16-byte aligned, the two-pass form
    saves them instead (ce_rewrite.py _two_pass_for_returned); unaligned rows keep the
    one-pass form either way (pad_mm copies the logits there). The loss and both
    gradients as eager's either way."""
    monkeypatch.setattr(config, "ce_returned_logits", rule)
    g = torch.Generator().manual_seed(vocab)
    x0, w0 = torch.randn(12, 16, generator=g), torch.randn(vocab, 16, generator=g) * 0.3
    t = torch.randint(0, vocab, (12,), generator=g)

    def step(x, w):  # noqa: ANN001, ANN202
        logits = x @ w.t()
        loss = F.cross_entropy(logits, t)
        return (loss, logits) if returned else loss

    b = FuserBackend(strict=True)
    got_want = []
    for fn in (step, torch.compile(step, backend=b)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fn(x, w)
        (out[0] if returned else out).backward()
        got_want.append((out[0] if returned else out, x.grad, w.grad))
    for got, want in zip(got_want[1], got_want[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    fw = b.captures[0].graphs[0]
    assert ("fuser.cross_entropy" in fw.aten_graph) == one_pass, fw.aten_graph
    # explain says which form and why (the capture's notes, printed under it)
    text = "\n".join(b.captures[0].linear_ce)
    assert ("one pass (loss and gradient" in text) == one_pass, text
    assert ("two-pass" in text and "returns its logits" in text) != one_pass, text


@pytest.mark.parametrize("rule", ["one-pass", "two-pass"])
def test_rewrite_keeps_an_inlined_vmap(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    """Dynamo inlines torch.vmap as calls nobody reads (vmap nesting levels): the rewrite
    drops only what it orphaned, not the graph's other unread nodes; dropping those made
    AOTAutograd fail ("tensor escaped from inside a function being vmapped") on
    transformers' Mamba, whose scan runs under vmap (ce_rewrite.drop_orphans)."""
    monkeypatch.setattr(config, "ce_returned_logits", rule)
    g = torch.Generator().manual_seed(11)
    x0, w0 = torch.randn(12, 16, generator=g), torch.randn(64, 16, generator=g) * 0.3
    t = torch.randint(0, 64, (12,), generator=g)

    def step(x, w):  # noqa: ANN001, ANN202
        h = torch.vmap(lambda r: r * torch.sigmoid(r))(x)  # a per-row map under vmap
        logits = h @ w.t()
        return F.cross_entropy(logits, t), logits

    got_want = []
    for fn in (step, torch.compile(step, backend=FuserBackend(strict=True))):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss, logits = fn(x, w)
        loss.backward()
        got_want.append((loss, logits, x.grad, w.grad))
    for got, want in zip(got_want[1], got_want[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_an_unknown_returned_logits_rule_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """FUSER_CE_RETURNED takes one-pass or two-pass; a misspelling names itself."""
    monkeypatch.setattr(config, "ce_returned_logits", "onepass")
    g = torch.Generator().manual_seed(12)
    x, w = torch.randn(6, 8, generator=g), torch.randn(64, 8, generator=g, requires_grad=True)
    t = torch.randint(0, 64, (6,), generator=g)

    def step(x, w):  # noqa: ANN001, ANN202
        logits = x @ w.t()
        return F.cross_entropy(logits, t), logits

    with pytest.raises(Exception, match="FUSER_CE_RETURNED='onepass'"):
        torch.compile(step, backend=FuserBackend(strict=True))(x, w)


def test_logits_gathered_from_a_table(backend: str) -> None:
    """Logits that are an embedding's rows, unreduced: the row kernel gathers them and reads
    each row's target column through a one-column tile. With one row the target is a
    single value for every row, and the Triton kernel stored a [1, 1] tile through a
    scalar pointer, which Triton refuses (found by fuser.fuzz.programs)."""

    def f(ids: torch.Tensor, table: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(F.embedding(ids, table), t, reduction="none")
        return loss - loss.mean(-1, keepdim=True)

    rows = 1
    g = torch.Generator().manual_seed(rows)
    table = torch.randn(33, 4, generator=g).to(DEVICE)
    ids = torch.randint(0, 33, (rows,), generator=g).to(DEVICE)
    t = torch.randint(0, 4, (rows,), generator=g).to(DEVICE)
    up = torch.randn(rows, generator=g).to(DEVICE)
    w1, w2 = table.clone().requires_grad_(), table.clone().requires_grad_()
    got = torch.compile(f, backend=FuserBackend(strict=True))(ids, w1, t)
    want = f(ids, w2, t)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    (got * up).sum().backward()
    (want * up).sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-6)
