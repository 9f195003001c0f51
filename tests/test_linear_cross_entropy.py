"""The chunked linear + cross-entropy (fuser/dynamo/linear_ce.py, linear_ce_chunk.py, the
rewrite in ce_rewrite.py): loss and gradients (dx, dW, db) against
F.cross_entropy(F.linear(...)) in float32 from the same values, at odd sizes (N=37, H=24,
V=101, chunks that do not divide N), fp32 and bf16, with ignored rows, every row ignored,
no rows, a sum, label smoothing, a padded vocabulary (-inf logits past V), the
out-of-place fallback, a transposed x, a weight tied to an embedding, bf16 autocast with
fp32 weights; a bad target raises; the rewrite's choices (another user of the logits,
"auto" on CPU, reduction 'none', off) and a tiny GPT-2 compiled with it forced on:
losses and every parameter's gradient as eager's, explain showing the chunks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fuser
import fuser.dynamo.linear_ce as linear_ce
import fuser.dynamo.linear_ce_chunk as linear_ce_chunk
from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.dynamo.ce_rewrite import chunk_linear_cross_entropy
from fuser.dynamo.linear_ce import linear_cross_entropy, plan_chunks
from fuser.examples.gpt2 import GPT, get_config

F32, BF16 = torch.float32, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, H, V = 37, 24, 101
# bf16: the logits and their gradient are rounded to bf16 once each (as eager's are)
TOL = {F32: 2e-5, BF16: 2e-2}


def _data(dtype: torch.dtype, n: int = N, bias: bool = True, ignored: tuple = (), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, H, generator=g).to(dtype)
    w = (torch.randn(V, H, generator=g) * 0.5).to(dtype)
    b = (torch.randn(V, generator=g) * 0.5).to(dtype) if bias else None
    t = torch.randint(0, V, (n,), generator=g)
    t[list(ignored)] = -100
    return tuple(a.to(DEVICE) if a is not None else None for a in (x, w, b, t))


def _grads(fn, x, w, b, t):
    leaves = [a.detach().clone().requires_grad_(True) for a in (x, w, b) if a is not None]
    xs, ws, bs = leaves[0], leaves[1], leaves[2] if b is not None else None
    loss = fn(xs, ws, bs, t)
    loss.backward()
    return loss.detach(), [a.grad for a in leaves]


def _reference(x, w, b, t, **kw):
    def ref(xs, ws, bs, tt):
        bf = bs.float() if bs is not None else None
        return F.cross_entropy(F.linear(xs.float(), ws.float(), bf), tt, **kw)

    return _grads(ref, x, w, b, t)


def _check(x, w, b, t, chunk_rows=10, target_dtype=torch.int64, **kw):
    def ours(xs, ws, bs, tt):
        return linear_cross_entropy(xs, ws, tt.to(target_dtype), bs, chunk_rows=chunk_rows, **kw)

    loss, grads = _grads(ours, x, w, b, t)
    want_loss, want = _reference(x, w, b, t, **kw)
    tol = TOL[x.dtype]
    assert loss.dtype == x.dtype
    torch.testing.assert_close(loss.float(), want_loss, atol=tol, rtol=tol, equal_nan=True)
    for name, g, r in zip(("dx", "dW", "db"), grads, want):
        assert g.dtype == x.dtype and g.shape == r.shape, name
        _close(g, r, tol, name)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str = "") -> None:
    """Within tol of the largest |want| (a gradient's small elements are rounded at that
    scale in bf16, by eager too) and tol relative."""
    scale = want.abs().max().item() if want.numel() else 1.0
    err = (got.float() - want).abs()
    bad = err > tol * scale + tol * want.abs()
    assert not bad.any(), f"{what}: largest error {err.max().item():.3g} at scale {scale:.3g}"


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_mean_with_ignored_rows_and_a_bias(dtype: torch.dtype) -> None:
    """4 chunks of 10 rows (the last of 7), rows 3..8 ignored (across a chunk boundary)."""
    _check(*_data(dtype, ignored=tuple(range(3, 9))))


def test_sum_with_label_smoothing_no_bias() -> None:
    _check(*_data(F32, bias=False, ignored=(0, 36)), reduction="sum", label_smoothing=0.1)


@pytest.mark.nonfinite  # 0 valid targets: eager's mean is 0/0 = nan
def test_every_row_ignored_and_no_rows() -> None:
    x, w, b, t = _data(F32, ignored=tuple(range(N)))
    loss, grads = _grads(lambda *a: linear_cross_entropy(a[0], a[1], a[3], a[2]), x, w, b, t)
    want_loss, want = _reference(x, w, b, t)
    assert want_loss.isnan() and loss.isnan()
    for g, r in zip(grads, want):  # no valid row: every gradient is 0, as eager's
        torch.testing.assert_close(g, r)
    _check(*_data(F32, n=0))


def test_padded_vocabulary_and_out_of_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """V=101 padded to 104 (bf16: 16-byte rows) with -inf logits past V; then the kernel
    run through fd.execute (out of place) instead of over the logits."""
    monkeypatch.setattr(linear_ce, "MIN_PADDED_VOCAB", 0)
    assert plan_chunks(N, V, BF16).padded == 104
    data = _data(BF16, ignored=(5,))  # a bias too: padded with zeros
    _check(*data)
    x, w, _, t = _data(F32, bias=False)
    with torch.autocast(DEVICE, dtype=BF16):  # fp32 weights: dW is a view of the padded one
        loss, (dx, dw) = _grads(lambda *a: linear_cross_entropy(a[0], a[1], a[3]), x, w, None, t)
    _close(dw, _reference(x, w, None, t)[1][1], 2e-2, "dW")
    monkeypatch.setattr(linear_ce_chunk, "IN_PLACE_KINDS", ())
    _check(*data)


def test_aten_fallback_where_fuser_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors in a process with a GPU, say: the chunks' cross-entropy runs as ATen
    ops, with a warning, and the results are the same."""
    monkeypatch.setattr(linear_ce_chunk, "_CACHE", {})
    monkeypatch.setattr(linear_ce_chunk, "device_problem", lambda *a: "no kernels here (test)")
    with pytest.warns(UserWarning, match="runs as ATen ops: no kernels here"):
        _check(*_data(BF16, ignored=(1,)))


def test_transposed_x_and_int32_targets() -> None:
    """x column-major; int32 targets (which F.cross_entropy refuses on CPU; the op takes
    them, as its kernel does)."""
    x, w, b, t = _data(F32)
    _check(x.t().contiguous().t(), w, b, t, target_dtype=torch.int32)


def test_tied_weight_accumulates_both_gradients() -> None:
    """The lm head's weight is also the embedding's (GPT-2): its gradient is the sum."""
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(V, H, generator=g).to(DEVICE)
    idx = torch.randint(0, V, (N,), generator=g).to(DEVICE)
    t = torch.randint(0, V, (N,), generator=g).to(DEVICE)

    def step(fn):
        w = w0.clone().requires_grad_(True)
        x = torch.tanh(F.embedding(idx, w))
        fn(x, w).backward()
        return w.grad

    got = step(lambda x, w: linear_cross_entropy(x, w, t, chunk_rows=10))
    want = step(lambda x, w: F.cross_entropy(F.linear(x, w), t))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_autocast_bf16_with_fp32_weights() -> None:
    """bf16 activations, fp32 weight and bias: autocast's casts, eager's dtypes out."""
    x, w, b, t = _data(F32)
    x = x.bfloat16()
    with torch.autocast(DEVICE, dtype=BF16):
        loss, grads = _grads(
            lambda *a: linear_cross_entropy(a[0], a[1], a[3], a[2], chunk_rows=10), x, w, b, t
        )
    want_loss, want = _reference(x, w, b, t)
    assert loss.dtype == F32 and [g.dtype for g in grads] == [BF16, F32, F32]
    torch.testing.assert_close(loss, want_loss, atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, want):
        _close(g, r, 2e-2)


def _twice(fn) -> None:
    """fn(), and on a GPU fn() again: a kernel's bad index is reported at the next call."""
    fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        fn()


def test_bad_targets_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, b, t = _data(F32)
    t[4] = V
    with pytest.raises(IndexError):
        _twice(lambda: linear_cross_entropy(x, w, t, b))
    monkeypatch.setattr(linear_ce, "MIN_PADDED_VOCAB", 0)  # V=101 padded to 104 in bf16
    t[4] = 102  # a padding column: the kernel's own check covers [0, 104) only
    with pytest.raises(IndexError, match=r"\[101, 104\)"):
        _twice(lambda: linear_cross_entropy(x.bfloat16(), w.bfloat16(), t))


def test_chunk_rule_at_gpt2_124m() -> None:
    n, v = 16 * 1024, 50257
    p = plan_chunks(n, v, BF16)
    assert p.padded == 50264 and p.rows % linear_ce.ROW_ALIGN == 0
    assert p.rows * p.padded * 2 <= linear_ce.CHUNK_BYTES and (p.chunks - 1) * p.rows < n
    assert plan_chunks(n, v, BF16, smoothing=0.1).padded == v  # smoothing sums pad columns


# -- the rewrite ------------------------------------------------------------------------
def _dynamo_graph(fn, *args):
    """The graph Dynamo captures for fn(*args), before any backend rewrite."""
    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=grab)(*args)
    torch._dynamo.reset()
    return graphs[0]


def _head(x, w, t):
    return F.cross_entropy(F.linear(x, w).view(-1, V).float(), t.view(-1))


def _head_and_logits(x, w, t):
    logits = F.linear(x, w)
    return F.cross_entropy(logits.view(-1, V).float(), t.view(-1)), logits


def test_rewrite_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, _, t = _data(F32)
    x, w = x.view(1, N, H).requires_grad_(), w.requires_grad_()
    returns_logits = _dynamo_graph(_head_and_logits, x, w, t)
    monkeypatch.setattr(config, "linear_cross_entropy", "1")
    (note,) = chunk_linear_cross_entropy(returns_logits)
    assert "not chunked: the logits are also read by" in note
    plain = _dynamo_graph(_head, x, w, t)
    monkeypatch.setattr(config, "linear_cross_entropy", "yes")
    with pytest.raises(ValueError, match="FUSER_LINEAR_CE"):
        chunk_linear_cross_entropy(copy.deepcopy(plain))
    for mode, says in (("0", None), ("auto", "auto: the logits are"), ("1", "chunked")):
        monkeypatch.setattr(config, "linear_cross_entropy", mode)
        notes = chunk_linear_cross_entropy(copy.deepcopy(plain))
        assert notes == [] if says is None else says in notes[0], (mode, notes)
    per_row = _dynamo_graph(
        lambda x, w, t: F.cross_entropy(F.linear(x, w).view(N, V), t, reduction="none").sum(),
        x,
        w,
        t,
    )
    assert "reduction 'none'" in chunk_linear_cross_entropy(per_row)[0]


def test_compiled_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "linear_cross_entropy", "1")
    x, w, b, t = _data(F32, ignored=(2,))
    torch._dynamo.reset()
    f = torch.compile(
        lambda x, w, b, t: F.cross_entropy(F.linear(x, w, b), t), backend=FuserBackend(strict=True)
    )
    with torch.autocast(DEVICE, dtype=BF16):
        loss, grads = _grads(f, x, w, b, t)
    torch._dynamo.reset()
    want_loss, want = _reference(x, w, b, t)
    assert loss.dtype == F32 and all(g.dtype == F32 for g in grads)
    torch.testing.assert_close(loss, want_loss, atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, want):
        _close(g, r, 2e-2)


def test_tiny_gpt2_compiled_with_the_rewrite(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lm head is tied to the token embedding; the loss is the model's second output
    (a caller that drops the logits: Dynamo's graph then has no other user of them)."""
    monkeypatch.setattr(config, "linear_cross_entropy", "1")
    torch.manual_seed(0)
    model = GPT(get_config("tiny")).to(DEVICE)
    ref_model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 64, (2, 8), generator=g).to(DEVICE)
    tgt = torch.randint(0, 64, (2, 8), generator=g).to(DEVICE)
    tgt[0, :3] = -100
    backend = FuserBackend(strict=True)
    torch._dynamo.reset()
    step = torch.compile(lambda i, t: model(i, t)[1], backend=backend)
    for _ in range(2):  # the second step runs the generated call programs
        model.zero_grad()
        loss = step(idx, tgt)
        loss.backward()
    torch._dynamo.reset()
    want = ref_model(idx, tgt)[1]
    want.backward()
    torch.testing.assert_close(loss, want.detach(), atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    text = str(fuser.explain(backend))
    assert "chunked into fuser::linear_cross_entropy (forced: FUSER_LINEAR_CE=1)" in text
    assert "chunked linear + cross-entropy" in text and "chunk kernel for 16 rows" in text
