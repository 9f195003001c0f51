"""Render the attention template: one Triton module per AttentionPlan.

Four kernels, all reading q, k, v, o and their gradients through their strides (the
[B, H, T, d] views of a [B, T, H, d] projection are read in place, never copied):
  attn_fwd        one program per (query block, batch x query head): Q·Kᵀ tile by tile,
                  running max and sum in fp32 (log2 domain), O and the natural-log LSE;
  attn_bwd_delta  delta = rowsum(dO * O) per query row (fp32);
  attn_bwd_dkdv   one program per (key block, batch x key/value head): walks the query
                  blocks of every query head of its group, dK and dV in fp32 registers;
  attn_bwd_dq     one program per (query block, batch x query head): walks the key blocks.
A causal attention splits each walk into the blocks strictly below the diagonal (no mask)
and the diagonal block (masked). Masks for sequence or head-dim bounds are printed only
when the plan says the sizes need them. Masked scores are -1e30, not -inf: a row never
sees inf - inf, and exp2 of it is exactly 0.
"""

from __future__ import annotations

from fuser.schedulers.attention import AttentionPlan

_NEG = "-1.0e30"


def _masks(plan: AttentionPlan) -> dict[str, str]:
    """Load masks and `other=` clauses: empty where the plan's sizes need none."""
    dmask = plan.block_d != plan.shape.head_dim
    return {
        "dm": "offs_d[None, :] < HEAD_D" if dmask else "",
        "dmT": "offs_d[:, None] < HEAD_D" if dmask else "",
    }


def _and(*parts: str) -> str:
    kept = [p for p in parts if p]
    return " & ".join(f"({p})" for p in kept) if len(kept) > 1 else (kept[0] if kept else "")


def _load(ptr: str, *masks: str) -> str:
    m = _and(*masks)
    return f"tl.load({ptr}, mask={m}, other=0.0)" if m else f"tl.load({ptr})"


def header(plan: AttentionPlan) -> str:
    lines = [
        f"fuser attention template {plan.name} (triton), generated: edit the plan, not this file",
        *plan.explain().splitlines(),
        "kernels: attn_fwd, attn_bwd_delta, attn_bwd_dkdv, attn_bwd_dq (FA2: no atomics, "
        "deterministic)",
    ]
    return '"""' + "\n".join(lines) + '\n"""\n'


_PRELUDE = """import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
"""


def _where(skip: bool, var: str, cond: str) -> str:
    """A line masking `var` to -1e30 where `cond` fails (none when the plan says skip)."""
    return "" if skip else f"\n        {var} = tl.where({cond}, {var}, {_NEG})"


def _walks(
    causal: bool,
    call: str,
    below_note: str,
    below: tuple[str, str],
    diag_note: str,
    diag: tuple[str, str],
    full: tuple[str, str],
    diagonal_first: bool = False,
) -> str:
    """The calls of a walk: one over `full`, or (causal) the unmasked part and the
    diagonal block, each with its comment."""
    if not causal:
        return call.format(lo=full[0], hi=full[1], diag=False)
    a = below_note + "\n" + call.format(lo=below[0], hi=below[1], diag=False)
    b = diag_note + "\n" + call.format(lo=diag[0], hi=diag[1], diag=True)
    return f"{b}\n{a}" if diagonal_first else f"{a}\n{b}"


def render_attention(plan: AttentionPlan) -> str:
    """The Triton source of the plan's four kernels, with its header."""
    m = _masks(plan)
    mask_q = "" if plan.even_m else "offs_m[:, None] < t_q"
    mask_qT = "" if plan.even_m else "offs_m[None, :] < t_q"
    mask_k = "" if plan.even_n else "offs_n[:, None] < t_k"
    mask_kT = "" if plan.even_n else "offs_n[None, :] < t_k"
    row_q = "" if plan.even_m else "offs_m < t_q"
    causal = plan.shape.causal
    parts = [header(plan), _PRELUDE]
    parts.append(_FWD_INNER.format(
        load_kT=_load("k_base + offs_d[:, None] * skd + offs_n[None, :] * skn", m["dmT"], mask_kT),
        load_v=_load("v_base + offs_n[:, None] * svn + offs_d[None, :] * svd", mask_k, m["dm"]),
        key_mask=_where(plan.even_n, "qk", "offs_n[None, :] < t_k"),
    ))  # fmt: skip
    fwd_call = (
        "    acc, l_i, m_i = _fwd_walk(acc, l_i, m_i, q, k_base, v_base, skn, skd, svn, svd,\n"
        "        offs_m, offs_d, {lo}, {hi}, t_k, qk_scale, BLOCK_N, HEAD_D, {diag})"
    )
    walk = _walks(
        causal,
        fwd_call,
        "    # keys strictly below the diagonal block need no causal mask",
        ("0", "tl.minimum(start_m, t_k)"),
        "    # the diagonal block: key j is seen by query i only when j <= i (top-left aligned)",
        ("start_m", "tl.minimum(start_m + BLOCK_M, t_k)"),
        ("0", "t_k"),
    )
    parts.append(_FWD.format(
        load_q=_load("q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd", mask_q, m["dm"]),
        walk=walk,
        o_mask=f", mask={_and(mask_q, m['dm'])}" if _and(mask_q, m["dm"]) else "",
        l_mask=f", mask={row_q}" if row_q else "",
    ))  # fmt: skip
    parts.append(_DELTA.format(
        load_o=_load("o_base + offs_m[:, None] * som + offs_d[None, :] * sod", mask_q, m["dm"]),
        load_do=_load("do_base + offs_m[:, None] * sdom + offs_d[None, :] * sdod", mask_q, m["dm"]),
        l_mask=f", mask={row_q}" if row_q else "",
    ))  # fmt: skip
    parts.append(_DKDV_INNER.format(
        load_qT=_load("q_base + offs_d[:, None] * sqd + offs_m[None, :] * sqm", m["dmT"], mask_qT),
        load_do=_load("do_base + offs_m[:, None] * sdom + offs_d[None, :] * sdod", mask_q, m["dm"]),
        load_row=(lambda p: _load(p, row_q)),
        q_mask=_where(plan.even_m, "sT", "offs_m[None, :] < t_q"),
        k_mask=_where(plan.even_n, "sT", "offs_n[:, None] < t_k"),
    ).replace("LOAD_LSE", _load("lse_base + offs_m * slm", row_q))
     .replace("LOAD_DELTA", _load("delta_base + offs_m", row_q)))  # fmt: skip
    dkdv_call = (
        "        dk, dv = _dkdv_walk(dk, dv, k, v, q_base, do_base, lse_base, delta_base,\n"
        "            sqm, sqd, sdom, sdod, slm, offs_n, offs_d, {lo}, {hi}, t_q, t_k,\n"
        "            qk_scale, BLOCK_M, HEAD_D, {diag})"
    )
    dkdv_walk = _walks(
        causal,
        dkdv_call,
        "        # every query below the diagonal block sees all of this key block",
        ("start_n + BLOCK_N", "t_q"),
        "        # the diagonal block of queries (masked)",
        ("start_n", "tl.minimum(start_n + BLOCK_N, t_q)"),
        ("0", "t_q"),
        diagonal_first=True,
    )
    kv_store_mask = _and(mask_k, m["dm"])
    parts.append(_DKDV.format(
        load_k=_load("k_base + offs_n[:, None] * skn + offs_d[None, :] * skd", mask_k, m["dm"]),
        load_v=_load("v_base + offs_n[:, None] * svn + offs_d[None, :] * svd", mask_k, m["dm"]),
        walk=dkdv_walk,
        s_mask=f", mask={kv_store_mask}" if kv_store_mask else "",
    ))  # fmt: skip
    parts.append(_DQ_INNER.format(
        load_kT=_load("k_base + offs_d[:, None] * skd + offs_n[None, :] * skn", m["dmT"], mask_kT),
        load_vT=_load("v_base + offs_d[:, None] * svd + offs_n[None, :] * svn", m["dmT"], mask_kT),
        key_mask=_where(plan.even_n, "s", "offs_n[None, :] < t_k"),
    ))  # fmt: skip
    dq_call = (
        "    dq = _dq_walk(dq, q, do, lse2, delta, k_base, v_base, skn, skd, svn, svd, offs_m,\n"
        "        offs_d, {lo}, {hi}, t_k, qk_scale, BLOCK_N, HEAD_D, {diag})"
    )
    dq_walk = _walks(
        causal,
        dq_call,
        "    # keys strictly below the diagonal block",
        ("0", "tl.minimum(start_m, t_k)"),
        "    # the diagonal block (masked)",
        ("start_m", "tl.minimum(start_m + BLOCK_M, t_k)"),
        ("0", "t_k"),
    )
    parts.append(_DQ.format(
        load_q=_load("q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd", mask_q, m["dm"]),
        load_do=_load("do_base + offs_m[:, None] * sdom + offs_d[None, :] * sdod", mask_q, m["dm"]),
        walk=dq_walk,
        o_mask=f", mask={_and(mask_q, m['dm'])}" if _and(mask_q, m["dm"]) else "",
    ).replace("LOAD_LSE", _load("lse_base + offs_m * slm", row_q))
     .replace("LOAD_DELTA", _load("DELTA + bh.to(tl.int64) * t_q + offs_m", row_q)))  # fmt: skip
    return "\n".join(parts)


_FWD_INNER = '''
@triton.jit
def _fwd_walk(acc, l_i, m_i, q, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, lo, hi,
              t_k, qk_scale, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
              DIAGONAL: tl.constexpr):
    """Fold keys [lo, hi) into the running max m_i, sum l_i and accumulator acc."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kT = {load_kT}
        qk = tl.dot(q, kT)  # raw scores; scaled into the log2 domain below{key_mask}
        if DIAGONAL:
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, -1.0e30)
        # qk_scale > 0, so the scaled max is the max scaled; the scale and the max's
        # subtraction then fuse into one multiply-add per score
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = {load_v}
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i
'''

_FWD = """
@triton.jit
def attn_fwd(Q, K, V, O, LSE, sm_scale, t_q, t_k, heads_q,
             sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
             sob, soh, som, sod, slb, slh, slm,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             HEAD_D: tl.constexpr, GROUP: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    hk = h // GROUP  # grouped-query attention: GROUP query heads share one key/value head
    q_base = Q + b * sqb + h * sqh
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = {load_q}
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2E
{walk}
    acc = acc / l_i[:, None]
    o_base = O + b * sob + h * soh
    o_ptrs = o_base + offs_m[:, None] * som + offs_d[None, :] * sod
    tl.store(o_ptrs, acc.to(O.dtype.element_ty){o_mask})
    lse = (m_i + tl.math.log2(l_i)) / LOG2E  # natural log, as ATen's kernels save it
    tl.store(LSE + b * slb + h * slh + offs_m * slm, lse{l_mask})
"""

_DELTA = """
@triton.jit
def attn_bwd_delta(O, DO, DELTA, t_q, heads_q, sob, soh, som, sod, sdob, sdoh, sdom, sdod,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_D: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    o_base = O + b * sob + h * soh
    do_base = DO + b * sdob + h * sdoh
    o = {load_o}
    do = {load_do}
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * t_q + offs_m, delta{l_mask})
"""

_DKDV_INNER = '''
@triton.jit
def _dkdv_walk(dk, dv, k, v, q_base, do_base, lse_base, delta_base, sqm, sqd, sdom, sdod, slm,
               offs_n, offs_d, lo, hi, t_q, t_k, qk_scale, BLOCK_M: tl.constexpr,
               HEAD_D: tl.constexpr, DIAGONAL: tl.constexpr):
    """Add the gradients of queries [lo, hi) to this program's key block (transposed: the
    key rows index the tiles, so dK and dV accumulate without a transpose)."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qT = {load_qT}
        lse2 = LOAD_LSE * LOG2E
        sT = tl.dot(k, qT) * qk_scale{q_mask}{k_mask}
        if DIAGONAL:
            sT = tl.where(offs_m[None, :] >= offs_n[:, None], sT, -1.0e30)
        pT = tl.math.exp2(sT - lse2[None, :])  # the forward's probabilities, recomputed
        do = {load_do}
        dv += tl.dot(pT.to(do.dtype), do)
        delta = LOAD_DELTA
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT))
    return dk, dv
'''

_DKDV = """
@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, t_q, t_k, heads_kv,
                  sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                  sdob, sdoh, sdom, sdod, slb, slh, slm,
                  sdkb, sdkh, sdkn, sdkd, sdvb, sdvh, sdvn, sdvd,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  HEAD_D: tl.constexpr, GROUP: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    b = (bhk // heads_kv).to(tl.int64)
    hk = (bhk % heads_kv).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    k = {load_k}
    v = {load_v}
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2E
    for g in range(GROUP):  # every query head that reads this key/value head
        h = hk * GROUP + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdob + h * sdoh
        lse_base = LSE + b * slb + h * slh
        delta_base = DELTA + (b * heads_kv * GROUP + h) * t_q
{walk}
    dk *= sm_scale
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
             dk.to(DK.dtype.element_ty){s_mask})
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvn + offs_d[None, :] * sdvd,
             dv.to(DV.dtype.element_ty){s_mask})
"""

_DQ_INNER = '''
@triton.jit
def _dq_walk(dq, q, do, lse2, delta, k_base, v_base, skn, skd, svn, svd, offs_m, offs_d, lo,
             hi, t_k, qk_scale, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr,
             DIAGONAL: tl.constexpr):
    """Add the gradient through keys [lo, hi) to this program's query block."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kT = {load_kT}
        vT = {load_vT}
        s = tl.dot(q, kT) * qk_scale{key_mask}
        if DIAGONAL:
            s = tl.where(offs_m[:, None] >= offs_n[None, :], s, -1.0e30)
        p = tl.math.exp2(s - lse2[:, None])
        dp = tl.dot(do, vT)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT))
    return dq
'''

_DQ = """
@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, t_q, t_k, heads_q,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                sdob, sdoh, sdom, sdod, slb, slh, slm, sdqb, sdqh, sdqm, sdqd,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                HEAD_D: tl.constexpr, GROUP: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = (bh // heads_q).to(tl.int64)
    h = (bh % heads_q).to(tl.int64)
    hk = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = Q + b * sqb + h * sqh
    do_base = DO + b * sdob + h * sdoh
    lse_base = LSE + b * slb + h * slh
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    q = {load_q}
    do = {load_do}
    lse2 = LOAD_LSE * LOG2E
    delta = LOAD_DELTA
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = sm_scale * LOG2E
{walk}
    dq *= sm_scale
    tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
             dq.to(DQ.dtype.element_ty){o_mask})
"""
