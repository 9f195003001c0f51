"""The causal-mask rewrite (fuser/dynamo/causal_mask.py) against masks built to fool it:
almost causal, causal at other lengths, input- or state-dependent, non-finite, shared
between attentions, under dynamic shapes. Each compiles with backend="fuser" and matches
eager in outputs and gradients; the rewrites counted are the ones that must happen."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

import fuser
import fuser.dynamo.causal_mask as causal_mask
from fuser.config import config
from fuser.dynamo import lower, saved
from fuser.dynamo.causal_mask import is_causal_mask

B, H, T, D = 2, 2, 8, 16
INF = float("inf")


@pytest.fixture
def rewrites(monkeypatch) -> list[str]:
    """The notes of every rewrite made while the test compiles (joint graphs: forward and
    backward, two per attention; inference graphs: one)."""
    notes: list[str] = []

    def counted(gm):
        made = causal_mask.causal_masks(gm)
        notes.extend(made)
        return made

    monkeypatch.setattr(saved, "causal_masks", counted)
    monkeypatch.setattr(lower, "causal_masks", counted)
    torch._dynamo.reset()
    yield notes
    torch._dynamo.reset()


def _pos(t: int) -> torch.Tensor:
    return torch.arange(t)


def _causal(t: int, s: int | None = None) -> torch.Tensor:
    return _pos(t if s is None else s)[None, :] <= _pos(t)[:, None]


def _compare(fn, inputs, train: bool = True, seed: int | None = None):
    """fn compiled with fuser against eager: outputs, and the gradients of every floating
    input (a fresh copy each side); `seed` reseeds before each run (dropout)."""
    ours = [x.detach().clone().requires_grad_(train and x.is_floating_point()) for x in inputs]
    theirs = [x.detach().clone().requires_grad_(train and x.is_floating_point()) for x in inputs]
    if seed is not None:
        torch.manual_seed(seed)
    want = fn(*theirs)
    compiled = torch.compile(fn, backend="fuser")
    if seed is not None:
        torch.manual_seed(seed)
    got = compiled(*ours)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)
    if train:
        g = torch.randn_like(want)
        want.backward(g)
        got.backward(g)
        for a, b in zip(ours, theirs, strict=True):
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4, equal_nan=True)
    return compiled


def _qkv(t: int = T, s: int | None = None, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    s = t if s is None else s
    return [torch.randn(B, H, n, D, generator=g) for n in (t, s, s)]


def _attend(mask_of):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_of(q.shape[2]))

    return fn


def _one_differs(t: int, dim: int) -> torch.Tensor:
    """Causal in every batch (dim 0) or head (dim 1) but the last, whose first key is
    hidden from the queries after it."""
    c = _causal(t)
    odd = c & ((_pos(t)[None, :] != 0) | (_pos(t)[:, None] == 0))
    both = torch.stack([c, odd])
    return both[:, None] if dim == 0 else both[None]


def _where(seen: torch.Tensor, blocked: torch.Tensor | float) -> torch.Tensor:
    return torch.where(seen, torch.zeros(()), blocked)


# (name, mask of T, whether it is the causal mask)
MASKS = [
    ("bool [T, T]", _causal, True),
    ("float [1, 1, T, T]", lambda t: _where(_causal(t), -INF)[None, None], True),
    ("bool [B, H, T, T]", lambda t: _causal(t).expand(B, H, t, t), True),
    ("fp16 lowest", lambda t: _where(_causal(t), -65504.0), True),
    ("triu of -inf", lambda t: torch.full((t, t), -INF).triu(1), True),
    ("strictly lower, diagonal of row 0", lambda t: _causal(t).tril(-1) | (_pos(t) == 0), False),
    ("shifted diagonal", lambda t: _pos(t)[None, :] <= _pos(t)[:, None] + 1, False),
    ("one batch differs", lambda t: _one_differs(t, 0), False),
    ("one head differs", lambda t: _one_differs(t, 1), False),
    ("ALiBi-like bias", lambda t: _where(_causal(t), (_pos(t)[None, :] - _pos(t)[:, None]) * 0.5),
     False),
    ("-1e4 is no block", lambda t: _where(_causal(t), -1e4), False),
    ("just above fp16 lowest", lambda t: _where(_causal(t), -65503.0), False),
    ("int8 positions wrap", lambda t: (lambda p: p[None, :] <= p[:, None])(
        torch.arange(t, dtype=torch.int8) * 40), False),
]  # fmt: skip


@pytest.mark.parametrize(("name", "mask_of", "causal"), MASKS, ids=[m[0] for m in MASKS])
def test_masks_near_causal(rewrites, name, mask_of, causal):
    _compare(_attend(mask_of), _qkv())
    assert len(rewrites) == (2 if causal else 0), rewrites


@pytest.mark.nonfinite
@pytest.mark.parametrize("blocked", [INF, float("nan")], ids=["+inf", "nan"])
def test_nonfinite_masks_stay(rewrites, blocked):
    """+inf or NaN where causal blocks: eager's NaN rows must stay NaN."""
    _compare(_attend(lambda t: _where(_causal(t), blocked)), _qkv())
    assert not rewrites


def test_is_causal_mask_edges():
    t = 5
    c = _causal(t)
    assert is_causal_mask(torch.ones(1, 1, dtype=torch.bool), 1, 1)
    assert not is_causal_mask(torch.ones(1, 1, dtype=torch.bool), t, t)  # broadcast: all seen
    assert is_causal_mask(_where(c, -INF).half(), t, t)
    assert is_causal_mask(torch.where(c, -0.0, -INF), t, t)
    for blocked in (INF, float("nan"), -65503.0):
        assert not is_causal_mask(_where(c, blocked), t, t)
    assert not is_causal_mask(
        _where(c, -INF).masked_fill(torch.eye(t, dtype=torch.bool), 1.0), t, t
    )
    assert not is_causal_mask(c.to(torch.uint8), t, t)


def test_tq_differs_from_tk(rewrites):
    """Causal in [Tq, Tk] with Tq != Tk: top-left and bottom-right alignments differ."""
    _compare(_attend(lambda t: _causal(t, T)), _qkv(5, T))
    assert not rewrites


def test_one_mask_two_lengths(rewrites):
    """A [1, 1] mask is causal for a T=1 attention only; the same node broadcast to a T=8
    attention is no mask at all. The proof is per (mask, lengths), not per mask."""

    def fn(q1, k1, v1, q, k, v):
        m = torch.zeros(1, 1)
        a = F.scaled_dot_product_attention(q1, k1, v1, attn_mask=m)
        return torch.cat([a, F.scaled_dot_product_attention(q, k, v, attn_mask=m)], 2)

    _compare(fn, _qkv(1, seed=1) + _qkv())
    assert len(rewrites) == 2  # the T=1 attention's forward and backward


def test_mask_computed_from_another(rewrites):
    """Two causal masks, one computed from the other, each an attention's: both rewritten,
    both computations dropped (erasing one before the other's ancestors are gathered
    raised KeyError and failed the compile)."""

    def fn(q, k, v, q2, k2, v2):
        m1 = _where(_causal(q.shape[2]), -INF)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=m1 * 2)
        return a + F.scaled_dot_product_attention(q2, k2, v2, attn_mask=m1)

    _compare(fn, _qkv() + _qkv(seed=1))
    assert len(rewrites) == 4


def test_shared_mask_several_attentions(rewrites):
    """One causal mask feeding three attentions, the third Tq=5 != Tk=8 (its rows of the
    mask, sliced: not rewritten)."""

    def fn(q, k, v, q5):
        m = _where(_causal(q.shape[2]), -INF)  # float: the very node each kernel reads
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        b = F.scaled_dot_product_attention(k, q, v, attn_mask=m)
        c = F.scaled_dot_product_attention(q5, k, v, attn_mask=m[: q5.shape[2]])
        return torch.cat([a + b, c], 2)

    _compare(fn, _qkv() + _qkv(5)[:1])
    assert len(rewrites) == 4


STATE = {"shift": 0}


@torch.library.custom_op("fuser_test::stateful_mask", mutates_args=())
def _stateful_mask(t: int) -> torch.Tensor:
    return torch.arange(t)[None, :] <= torch.arange(t)[:, None] + STATE["shift"]


@_stateful_mask.register_fake
def _(t: int) -> torch.Tensor:
    return torch.empty(t, t, dtype=torch.bool)


def test_custom_op_mask_is_not_a_constant(rewrites, monkeypatch):
    """A library's op with no tensor input may read state the graph does not see: one
    evaluation at compile time is not what every call computes."""
    monkeypatch.setitem(STATE, "shift", 0)
    fn = _attend(_stateful_mask)
    compiled = _compare(fn, _qkv(), train=False)
    assert not rewrites
    monkeypatch.setitem(STATE, "shift", 2)
    q, k, v = _qkv()
    torch.testing.assert_close(compiled(q, k, v), fn(q, k, v), atol=1e-5, rtol=1e-5)


class _Held(torch.nn.Module):
    """A mask held by the module: a buffer, a parameter (its gradient must flow), or
    positions in a buffer the mask is computed from."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "buffer":
            self.register_buffer("m", _causal(T))
        elif kind == "parameter":
            self.m = torch.nn.Parameter(_where(_causal(T), -1e9))
        else:
            self.register_buffer("p", _pos(T))

    def forward(self, q, k, v):
        m = self.p[None, :] <= self.p[:, None] if self.kind == "positions" else self.m
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


@pytest.mark.parametrize("kind", ["buffer", "parameter", "positions"])
def test_masks_held_by_the_module(rewrites, kind):
    m, ref = _Held(kind), _Held(kind)
    out = torch.compile(m, backend="fuser")(*_qkv())
    want = ref(*_qkv())
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert not rewrites  # an input of the graph, however it was computed
    if kind == "parameter":
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(m.m.grad, ref.m.grad, atol=1e-5, rtol=1e-5)


def test_tensor_constant_mask(rewrites):
    """torch.tensor inside the forward: a lifted constant (get_attr), left as it is."""

    def fn(q, k, v):
        m = torch.tensor([[j <= i for j in range(T)] for i in range(T)])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    _compare(fn, _qkv())


def test_is_causal_with_a_mask_as_eager(rewrites):
    """is_causal=True and a mask together: whatever eager does with both, fuser does."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal(T), is_causal=True)

    try:
        fn(*_qkv())
    except RuntimeError:
        with pytest.raises(Exception):  # noqa: B017, PT011 - Dynamo wraps eager's error
            torch.compile(fn, backend="fuser")(*_qkv())
        return
    _compare(fn, _qkv())
    assert not rewrites


def test_dropout_keeps_its_randomness(rewrites):
    """dropout_p > 0 in training with a causal mask: the same dropped entries as eager
    under one seed (CPU: SDPA's math path, nothing rewritten there), and row i reads no
    value after i."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal(T), dropout_p=0.3)

    compiled = _compare(fn, _qkv(), seed=5)
    q, k, v = _qkv()
    torch.manual_seed(7)
    a = compiled(q, k, v)
    torch.manual_seed(7)
    b = compiled(q, k, v + (_pos(T) >= 5)[:, None] * 100.0)
    torch.testing.assert_close(a[:, :, :5], b[:, :, :5])


def test_gqa_and_scale_take_the_template(rewrites, monkeypatch):
    """Grouped-query attention with an explicit scale and a causal mask: rewritten, then
    the template's (fp32, CPU interpreter) causal forward and backward."""
    monkeypatch.setattr(config, "attention", "template")

    def fn(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=_causal(T), scale=0.37, enable_gqa=True
        )

    q, k, v = _qkv()
    compiled = _compare(fn, [q, k[:, :1], v[:, :1]])
    assert len(rewrites) == 2
    text = str(fuser.explain(compiled))
    assert "fuser_attention_forward" in text and "fuser_attention_backward" in text


@pytest.mark.parametrize("scale", [-0.5, 0.0, 2], ids=["negative", "zero", "int"])
def test_scale_must_be_positive(rewrites, scale):
    """ATen's CPU flash kernel with is_causal=True and a scale <= 0 computes NaN rows (it
    fills the causal half with -inf before scaling: -inf * -0.5 = +inf); with the mask
    eager's values are finite. Only a positive scale is rewritten."""

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=_causal(T), scale=scale)

    _compare(fn, _qkv())
    assert len(rewrites) == (2 if scale > 0 else 0)


def test_inference_graph_and_checkpoint(rewrites, monkeypatch):
    """No joint graph: the pass runs when the graph is lowered (lower.prepare), and the
    template takes the attention. Under activation checkpointing the backward recomputes
    the mask: forward and backward are rewritten all the same."""
    from torch.utils.checkpoint import checkpoint

    monkeypatch.setattr(config, "attention", "template")
    fn = _attend(_causal)
    with torch.no_grad():
        compiled = _compare(fn, _qkv(), train=False)
    assert len(rewrites) == 1
    assert "fuser_attention_forward" in str(fuser.explain(compiled))
    rewrites.clear()
    torch._dynamo.reset()
    _compare(lambda q, k, v: checkpoint(fn, q, k, v, use_reentrant=False), _qkv())
    assert len(rewrites) == 2


def test_mask_above_the_size_limit_stays(rewrites, monkeypatch):
    monkeypatch.setattr(causal_mask, "MAX_ELEMENTS", T * T - 1)
    _compare(_attend(_causal), _qkv())
    assert not rewrites


def test_dynamic_lengths_are_not_specialized(rewrites):
    """Under dynamic shapes the mask is a function of an input's size: the pass must not
    turn the symbolic length into an int in Dynamo's graph (a guard on it: one compile for
    each new length, as many as the recompile limit allows). fuser's own run-time
    specialization of each length makes the sizes constants (lower._fold_sizes): there the
    mask is the causal mask of that length and is rewritten, with no guard."""
    from torch._dynamo.utils import counters

    fn = _attend(_causal)
    compiled = torch.compile(fn, backend="fuser", dynamic=True)
    counters.clear()
    for t in (8, 9, 10):
        q, k, v = (x.requires_grad_() for x in _qkv(t))
        out = compiled(q, k, v)
        out.sum().backward()
        torch.testing.assert_close(out, fn(q, k, v), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert all(any(f"T={t}:" in r for t in (8, 9, 10)) for r in rewrites), rewrites


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the test extra")
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_llama_with_and_without_padding(rewrites, monkeypatch, padded):
    """One-layer tiny Llama under FUSER_ATTENTION=template (fp32): without an
    attention_mask its causal mask is rewritten and the template runs the attention; with
    padding the mask depends on the input and stays (SDPA keeps it). Logits and every
    gradient match eager."""
    from fuser.suite.models import build

    monkeypatch.setattr(config, "attention", "template")
    model = build("llama", "tiny", "cpu")
    del model.model.layers[1:]
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    kw = {"input_ids": ids, "labels": ids}
    if padded:
        kw["attention_mask"] = torch.ones_like(ids)
        kw["attention_mask"][1, :3] = 0  # batch 1 left-padded by 3

    def step(m):
        m.zero_grad()
        out = m(**kw)
        out.loss.backward()
        return [out.logits.detach()] + [
            p.grad.clone() for p in model.parameters() if p.grad is not None
        ]

    want = step(model)
    compiled = torch.compile(model, backend="fuser")
    for got, w in zip(step(compiled), want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)
    text = str(fuser.explain(compiled))
    assert len(rewrites) == (0 if padded else 2)
    assert ("fuser_attention_forward" in text) is not padded
