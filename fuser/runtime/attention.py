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
from fuser.runtime.kernel import launch_hooked, raw_stream
from fuser.runtime.launchers import direct_launch
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


@functools.lru_cache(maxsize=256)
def _module_of(plan: AttentionPlan, interpret: bool) -> Any:
    return load_module(_source(plan), interpret=interpret)


def _module(plan: AttentionPlan, device: torch.device) -> Any:
    return _module_of(plan, device.type != "cuda")


# Launches after the first skip Triton's JIT (binding ~45 arguments, finding the
# specialization: ~100 us of Python a launch, more than the GPU time of a GPT-2-sized
# attention kernel): the first launch of a kernel for a key returns Triton's compiled
# kernel, and later launches with that key go straight to its launcher
# (runtime/launchers.py). The key (launch_key) holds everything Triton specializes on.
_direct: dict[tuple, Any] = {}


def launch_key(
    plan: AttentionPlan, name: str, grid: tuple[int, int], args: tuple, consts: dict[str, int]
) -> tuple:
    """What a launch of kernel `name` on `args` is specialized on, besides the plan (its
    warps and stages) and the grid: the device; the constexprs (HEAD_D and GROUP are the
    tensors', not the plan's, where a benchmark passes its own plan); each integer
    argument's value (sizes and strides: 1 becomes a constexpr, multiples of 16 and i32
    against i64 change the binary); each tensor's dtype, its pointer's type in the
    signature (the plan holds q's only: out, lse, grad_out and the gradients are the
    caller's, and a binary built for a bf16 grad_out would read an fp32 one as bf16), and
    whether its pointer is 16-byte aligned. A float is an fp32 argument whatever its
    value: not in the key."""
    specialized = tuple(
        (a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a
        for a in args
        if not isinstance(a, float)
    )
    return (plan, name, grid, args[0].device.index, *specialized, *consts.values())


def _run(
    plan: AttentionPlan,
    name: str,
    grid: tuple[int, int],
    args: tuple,
    consts: dict[str, int],
    opts: dict[str, int],
) -> None:
    """Launch kernel `name` of the plan's module on `args` (then `consts`, by name)."""
    device = args[0].device
    if device.type != "cuda":
        getattr(_module(plan, device), name)[grid](*args, **consts, **opts)
        return
    key = launch_key(plan, name, grid, args, consts)
    fast = _direct.get(key)
    if fast is not None and not launch_hooked():
        ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        fast(raw_stream(device.index), ptrs + list(consts.values()))
        return
    kernel = getattr(_module(plan, device), name)  # the first launch of this key only
    with torch.cuda.device(device):
        compiled = kernel[grid](*args, **consts, **opts)
    if len(_direct) >= 4096:  # as many layouts as a process meets: start over
        _direct.clear()
    if compiled is not None and len(consts) + len(args) == len(kernel.arg_names):
        order = kernel.arg_names[len(args) :]
        if list(consts) == order:  # the constexprs follow the arguments, in this order
            _direct[key] = direct_launch(compiled, len(kernel.arg_names), grid)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> None:
    why = unsupported(q, k, v, scale=scale)
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
    checked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ * scale [causal]) v and its natural-log LSE [B, Hq, Tq] (fp32).

    q [B, Hq, Tq, d], k and v [B, Hkv, Tk, d] with Hq a multiple of Hkv, any strides.
    `out`/`lse`, when given, are written in place (any strides; lse may be padded past Tq
    or carry a trailing size-1 dim, as ATen's kernels make it). `plan` overrides the
    planner's tiles (benchmarks/attention_bench.py --sweep). `checked`: the caller has
    checked these inputs with `unsupported` (a compiled graph, at lowering) and passes
    the plan made for them: no check again."""
    if not checked:
        _check(q, k, v, scale)
    group = q.shape[1] // k.shape[1]
    plan = plan_for(AttentionShape.of(q, k, causal)) if plan is None else plan
    b, hq, tq, d = q.shape
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((b, hq, tq), dtype=torch.float32, device=q.device) if lse is None else lse
    sm_scale = 1.0 / math.sqrt(d) if scale is None else scale
    t = plan.forward
    _run(
        plan, "attn_fwd", (triton_cdiv(tq, t.block_m), b * hq),
        (q, k, v, out, lse, sm_scale, tq, k.shape[2], hq,
         *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride()[:3]),
        _consts(plan, t, d, group), _launch_opts(t),
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
    checked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention_forward, from its out and lse (natural log, fp32, read
    through its strides). `grads` are preallocated outputs (any strides); `checked` as
    attention_forward's."""
    if not checked:
        _check(q, k, v, scale)
    plan = plan_for(AttentionShape.of(q, k, causal)) if plan is None else plan
    b, hq, tq, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if scale is None else scale
    if grads is None:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dq, dk, dv = grads
    delta = torch.empty((b, hq, tq), dtype=torch.float32, device=q.device)
    launch_delta(plan, out, grad_out, delta)
    launch_dkdv(plan, q, k, v, grad_out, lse, delta, dk, dv, sm_scale)
    launch_dq(plan, q, k, v, grad_out, lse, delta, dq, sm_scale)
    return dq, dk, dv


# The backward's three kernels, launched one by one: attention_backward runs them in
# order; benchmarks/attention_tiles.py times each alone.


def launch_delta(
    plan: AttentionPlan, out: torch.Tensor, grad_out: torch.Tensor, delta: torch.Tensor
) -> None:
    """delta[b, h, m] = rowsum(dO * O) in fp32, into `delta` (contiguous [B, Hq, Tq])."""
    b, hq, tq, d = out.shape
    t = plan.dq
    _run(
        plan, "attn_bwd_delta", (triton_cdiv(tq, t.block_m), b * hq),
        (out, grad_out, delta, tq, hq, *out.stride(), *grad_out.stride()),
        {"BLOCK_M": t.block_m, "BLOCK_D": plan.block_d, "HEAD_D": d},
        {"num_warps": plan.delta_warps},
    )  # fmt: skip


def launch_dkdv(
    plan: AttentionPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    sm_scale: float,
) -> None:
    """dK and dV, one program per key block and key/value head (walks its query heads)."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    t = plan.dkdv
    _run(
        plan, "attn_bwd_dkdv", (triton_cdiv(tk, t.block_n), b * hkv),
        (q, k, v, grad_out, lse, delta, dk, dv, sm_scale, tq, tk, hkv,
         *_common_strides(q, k, v, grad_out, lse), *dk.stride(), *dv.stride()),
        _consts(plan, t, d, hq // hkv), _launch_opts(t),
    )  # fmt: skip


def launch_dq(
    plan: AttentionPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    dq: torch.Tensor,
    sm_scale: float,
) -> None:
    """dQ, one program per query block and query head (walks its key blocks)."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    t = plan.dq
    _run(
        plan, "attn_bwd_dq", (triton_cdiv(tq, t.block_m), b * hq),
        (q, k, v, grad_out, lse, delta, dq, sm_scale, tq, tk, hq,
         *_common_strides(q, k, v, grad_out, lse), *dq.stride()),
        _consts(plan, t, d, hq // hkv), _launch_opts(t),
    )  # fmt: skip


def _consts(plan: AttentionPlan, t: Any, d: int, group: int) -> dict[str, int]:
    """The constexprs of attn_fwd, attn_bwd_dkdv and attn_bwd_dq, in signature order."""
    return {
        "BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_D": plan.block_d,
        "HEAD_D": d, "GROUP": group,
    }  # fmt: skip


def _common_strides(q: Any, k: Any, v: Any, grad_out: Any, lse: Any) -> tuple[int, ...]:
    return (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *lse.stride()[:3])


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
