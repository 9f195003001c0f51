"""The attention choice with its measurement: FUSER_ATTENTION=auto times the template
against SDPA (forward + backward, random data of the shape) on first use on a GPU and
caches the result on disk (runtime/cache: one JSON entry per shape and GPU), so a later
process decides without timing again."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fuser.config import config
from fuser.runtime.attention import attention_backward, attention_forward, plan_for, source_of
from fuser.runtime.cache import digest, load_entry, store_entry
from fuser.runtime.timing import median_ms
from fuser.schedulers.attention import AttentionChoice, AttentionShape, choose, unsupported

_TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_measured: dict[tuple, dict] = {}


def decide(
    q: Any,
    k: Any,
    v: Any,
    causal: bool,
    dropout_p: float = 0.0,
    attn_mask: Any = None,
    mode: str | None = None,
    scale: float | None = None,
) -> AttentionChoice:
    """Template or SDPA for an attention of these (real or fake) tensors, with reasons."""
    mode = config.attention if mode is None else mode
    why = unsupported(q, k, v, dropout_p, attn_mask, scale)
    shape = AttentionShape.of(q, k, causal) if q.dim() == 4 and k.dim() == 4 else None
    if shape is None:
        return choose(AttentionShape(0, 1, 1, 0, 0, 0, "?", causal, "?"), why, "sdpa")
    measured = None
    if mode == "auto" and why is None and shape.device == "cuda":
        measured = measurement(shape)
    return choose(shape, why, mode, measured)


def measurement(shape: AttentionShape) -> dict:
    """The cached timing of template vs SDPA for `shape` on this GPU, timed if missing."""
    name = torch.cuda.get_device_name()
    key = (shape, name)
    if key in _measured:
        return _measured[key]
    # the template's source is in the key: new tiles or kernels are measured again
    entry_key = digest("attention", dataclasses.astuple(shape), name, source_of(plan_for(shape)))
    body = load_entry("attention", entry_key)
    if body is None:
        with unset_fake_temporarily():
            body = _time(shape)
        body["device"] = name
        store_entry("attention", entry_key, body)
    _measured[key] = body
    return body


def _time(shape: AttentionShape, reps: int = 10) -> dict:
    """Median ms of forward + backward, template and SDPA (its own backend choice), on
    random [B, T, H, d] projections viewed as [B, H, T, d] (the layout models hand over).
    It runs while AOTAutograd compiles, where grad mode is off: SDPA's backward needs it
    on."""
    with torch.enable_grad():
        return _time_both(shape, reps)


def _time_both(shape: AttentionShape, reps: int) -> dict:
    s, dt, dev = shape, _TORCH_DTYPE[shape.dtype], shape.device
    q = torch.randn(s.batch, s.t_q, s.heads_q, s.head_dim, device=dev, dtype=dt)
    k = torch.randn(s.batch, s.t_k, s.heads_kv, s.head_dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    do = torch.randn_like(q)

    def template() -> None:
        o, lse = attention_forward(q, k, v, s.causal)
        attention_backward(do, q, k, v, o, lse, s.causal)

    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

    def sdpa() -> None:
        o = torch.nn.functional.scaled_dot_product_attention(
            qg, kg, vg, is_causal=s.causal, enable_gqa=s.group > 1
        )
        o.backward(do)

    return {"template_ms": median_ms(template, reps), "sdpa_ms": median_ms(sdpa, reps)}
