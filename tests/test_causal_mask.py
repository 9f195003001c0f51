"""Attention masks computed from sizes that are the causal mask become is_causal=True
(fuser/dynamo/causal_mask.py); every other mask is left as the graph computes it."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.config import config
from fuser.dynamo.causal_mask import is_causal_mask


def test_is_causal_mask_bool_and_float():
    t = 6
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    assert is_causal_mask(causal, t, t)
    assert is_causal_mask(causal.expand(3, 2, t, t), t, t)  # every batch and head
    zeros = torch.zeros(t, t)
    for blocked in (float("-inf"), torch.finfo(torch.float32).min, -65504.0):
        assert is_causal_mask(zeros.masked_fill(~causal, blocked), t, t)
    # torch hands cuDNN a boolean mask as -65504, which is -65536 in bf16
    assert is_causal_mask(zeros.bfloat16().masked_fill(~causal, -65504.0), t, t)
    # -1e4 is a bias scores could outweigh: only fp16's lowest and below count as blocked
    assert not is_causal_mask(zeros.masked_fill(~causal, -1e4), t, t)
    assert not is_causal_mask(torch.ones(t, t, dtype=torch.bool).tril(-1), t, t)  # j < i
    window = causal & torch.ones(t, t, dtype=torch.bool).triu(-2)  # sliding window of 3
    assert not is_causal_mask(window, t, t)
    assert not is_causal_mask(causal, t, t + 1) and not is_causal_mask(causal[0], t, t)
    one_batch_padded = causal.expand(2, 1, t, t).clone()
    one_batch_padded[1, 0, :, 0] = False  # batch 1's first key is padding
    assert not is_causal_mask(one_batch_padded, t, t)
    assert not is_causal_mask(torch.zeros(t, t, dtype=torch.int64), t, t)


class Attend(torch.nn.Module):
    """q/k/v projections and SDPA with a mask the forward builds the way `transformers`
    does: from positions, by arange and a comparison (`kind` picks which)."""

    def __init__(self, kind: str, width: int = 32, heads: int = 2):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv = torch.nn.Linear(width, 3 * width)

    def mask(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
        t = x.shape[1]
        pos = torch.arange(t, device=x.device)
        if self.kind == "window":
            seen = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - 3)
        else:
            seen = pos[None, :] <= pos[:, None]
        seen = seen[None, None].expand(x.shape[0], 1, t, t)
        if pad is not None:
            seen = seen & pad[:, None, None, :]
        if self.kind == "float":  # as transformers writes it: the fill values are scalars
            return torch.where(seen, 0.0, float("-inf"))
        return seen

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(x, pad))
        return y.transpose(1, 2).reshape(b, t, c)


def _run(monkeypatch, kind: str, pad: bool = False, attention: str = "sdpa") -> str:
    monkeypatch.setattr(config, "attention", attention)
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Attend(kind)
    x = torch.randn(2, 9, 32, requires_grad=True)
    p = torch.tensor([[True] * 9, [False] * 2 + [True] * 7]) if pad else None
    m(x, p).square().sum().backward()
    want = [x.grad] + [q.grad for q in m.parameters()]
    x.grad = None
    m.zero_grad()
    cm = torch.compile(m, backend="fuser")
    out = cm(x, p)
    out.square().sum().backward()
    torch.testing.assert_close(out, m(x, p), atol=1e-5, rtol=1e-5)
    for got, w in zip([x.grad] + [q.grad for q in m.parameters()], want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)
    return str(fuser.explain(cm))


def _saved(text: str) -> int:
    """How many tensors the forward keeps for the backward (explain's summary line)."""
    line = next(ln for ln in text.splitlines() if "saved for the backward:" in ln)
    return int(re.search(r"saved for the backward: (\d+) tensors", line).group(1))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_causal_mask_from_positions_becomes_is_causal(monkeypatch, kind):
    text = _run(monkeypatch, kind)
    assert text.count("is the causal mask of T=9: is_causal=True") >= 2  # forward, backward
    monkeypatch.setattr(config, "causal_masks", False)
    kept = _run(monkeypatch, kind)
    assert "is_causal=True" not in kept
    assert _saved(text) == _saved(kept) - 1  # the mask is no longer kept for the backward


def test_causal_mask_takes_the_template(monkeypatch):
    text = _run(monkeypatch, "bool", attention="template")
    assert "fuser_attention_forward" in text and "fuser_attention_backward" in text
    assert "an attn_mask" not in text


@pytest.mark.parametrize(("kind", "pad"), [("window", False), ("bool", True), ("float", True)])
def test_other_masks_stay(monkeypatch, kind, pad):
    """A sliding window is computed from sizes but is not causal; a padding mask is an
    input: neither is rewritten, and both still match eager."""
    text = _run(monkeypatch, kind, pad)
    assert "is_causal=True" not in text
