"""Launch the attention template: forward (out, lse) and backward (dq, dk, dv).

The source comes from the renderer for the plan of the call's shape; it is loaded through
the one Triton path every fuser kernel takes (runtime/triton_backend.load_module: written
to the cache folder under its hash, interpreted for CPU tensors). Nothing is copied: q, k,
v, o and the gradients are passed with their strides, and the outputs are made with the
strides the caller asks for (the ones AOTAutograd traced).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from fuser.codegen.triton.attention import render_attention
from fuser.errors import FuserError
from fuser.runtime.triton_backend import load_module
from fuser.schedulers.attention import AttentionPlan, AttentionShape, plan_attention, unsupported


@functools.lru_cache(maxsize=256)
def plan_for(shape: AttentionShape) -> AttentionPlan:
    return plan_attention(shape)


def source_of(plan: AttentionPlan) -> str:
    return _source(plan)


@functools.lru_cache(maxsize=256)
def _source(plan: AttentionPlan) -> str:
    return render_attention(plan)


def _module(plan: AttentionPlan, device: torch.device) -> Any:
    return load_module(_source(plan), interpret=device.type != "cuda")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    why = unsupported(q, k, v)
    if why is not None:
        raise FuserError(f"attention template: {why}")


def _launch_opts(plan_tiles: Any) -> dict[str, int]:
    return {"num_warps": plan_tiles.num_warps, "num_stages": plan_tiles.num_stages}


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    plan: AttentionPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ * scale [causal]) v and its natural-log LSE [B, Hq, Tq] (fp32).

    q [B, Hq, Tq, d], k and v [B, Hkv, Tk, d] with Hq a multiple of Hkv, any strides.
    `out`/`lse`, when given, are written in place (any strides; lse may be padded past Tq
    or carry a trailing size-1 dim, as ATen's kernels make it). `plan` overrides the
    planner's tiles (benchmarks/attention_bench.py --sweep)."""
    _check(q, k, v)
    shape = AttentionShape.of(q, k, causal)
    plan = plan_for(shape) if plan is None else plan
    b, hq, tq, d = q.shape
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((b, hq, tq), dtype=torch.float32, device=q.device) if lse is None else lse
    sm_scale = 1.0 / math.sqrt(d) if scale is None else scale
    t = plan.forward
    grid = (triton_cdiv(tq, t.block_m), b * hq)
    _module(plan, q.device).attn_fwd[grid](
        q, k, v, out, lse, sm_scale, tq, k.shape[2], hq,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride()[:3],
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_D=plan.block_d, HEAD_D=d,
        GROUP=shape.group, **_launch_opts(t),
    )  # fmt: skip
    return out, lse


def attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    plan: AttentionPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention_forward, from its out and lse (natural log, fp32, read
    through its strides). `grads` are preallocated outputs (any strides)."""
    _check(q, k, v)
    shape = AttentionShape.of(q, k, causal)
    plan = plan_for(shape) if plan is None else plan
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    sm_scale = 1.0 / math.sqrt(d) if scale is None else scale
    if grads is None:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dq, dk, dv = grads
    module = _module(plan, q.device)
    delta = torch.empty((b, hq, tq), dtype=torch.float32, device=q.device)
    lse_s = lse.stride()[:3]
    t = plan.dq
    module.attn_bwd_delta[(triton_cdiv(tq, t.block_m), b * hq)](
        out, grad_out, delta, tq, hq, *out.stride(), *grad_out.stride(),
        BLOCK_M=t.block_m, BLOCK_D=plan.block_d, HEAD_D=d, num_warps=plan.delta_warps,
    )  # fmt: skip
    common = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *lse_s)
    t = plan.dkdv
    module.attn_bwd_dkdv[(triton_cdiv(tk, t.block_n), b * hkv)](
        q, k, v, grad_out, lse, delta, dk, dv, sm_scale, tq, tk, hkv,
        *common, *dk.stride(), *dv.stride(),
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_D=plan.block_d, HEAD_D=d,
        GROUP=shape.group, **_launch_opts(t),
    )  # fmt: skip
    t = plan.dq
    module.attn_bwd_dq[(triton_cdiv(tq, t.block_m), b * hq)](
        q, k, v, grad_out, lse, delta, dq, sm_scale, tq, tk, hq, *common, *dq.stride(),
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_D=plan.block_d, HEAD_D=d,
        GROUP=shape.group, **_launch_opts(t),
    )  # fmt: skip
    return dq, dk, dv


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
