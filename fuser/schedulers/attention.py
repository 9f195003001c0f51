"""The attention template's scheduler: which attentions it takes, and its tiles.

An attention leaves the FX graph as one of ATen's SDPA kernels (flash, cuDNN, efficient,
or the CPU flash). The template (codegen/triton/attention.py) is a flash attention in
Triton: a forward that tiles Q·Kᵀ and keeps a running max and sum in fp32 (the T x T
matrix is never written), and the FA2 backward (a preprocess for delta = rowsum(dO*O), a
dK/dV kernel walking query blocks, a dQ kernel walking key blocks; no atomics). This
module decides, once, for one attention shape:
  - whether the template can compute it at all (`unsupported`: the reason SDPA keeps it);
  - its tiles (`plan_attention`): BLOCK_M x BLOCK_N, warps, pipeline stages per kernel,
    each with its reason, as an AttentionPlan the renderer only prints.
Whether the template or SDPA runs a supported shape is `choice.py`'s decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fuser.explanation import Explanation

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
MAX_HEAD_DIM = 128  # the fp32 accumulator of a 128-row tile of d=256 does not fit registers
SMEM_BUDGET = 227 * 1024  # the H100's largest shared memory per block


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: q [B, Hq, Tq, d], k and v [B, Hkv, Tk, d]."""

    batch: int
    heads_q: int
    heads_kv: int
    t_q: int
    t_k: int
    head_dim: int
    dtype: str  # fp16 | bf16 | fp32
    causal: bool
    device: str  # cuda | cpu

    @staticmethod
    def of(q: torch.Tensor, k: torch.Tensor, causal: bool) -> AttentionShape:
        b, hq, tq, d = q.shape
        return AttentionShape(
            b, hq, k.shape[1], tq, k.shape[2], d, _DTYPES.get(q.dtype, str(q.dtype)), causal,
            q.device.type,
        )  # fmt: skip

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def flops(self, backward: bool = False) -> float:
        """Matmul FLOPs (2 per multiply-add): QKᵀ and PV forward, 2.5x that backward (five
        matmuls against two); a causal attention does about half of them."""
        f = 4.0 * self.batch * self.heads_q * self.t_q * self.t_k * self.head_dim
        f = f * 2.5 if backward else f
        return f / 2 if self.causal else f

    def line(self) -> str:
        gqa = f" (GQA {self.heads_q}/{self.heads_kv})" if self.group > 1 else ""
        return (
            f"B={self.batch} Hq={self.heads_q}{gqa} Tq={self.t_q} Tk={self.t_k} "
            f"d={self.head_dim} {self.dtype}{' causal' if self.causal else ''}"
        )


def unsupported(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    attn_mask: object = None,
    scale: float | None = None,
) -> str | None:
    """Why the template cannot compute this attention (SDPA keeps it), or None."""
    if scale is not None and not (0.0 < float(scale) < float("inf")):
        # the forward takes the row max of the unscaled scores and scales it after: only
        # a positive scale keeps it the max of the scaled ones
        return f"scale={scale}: the template takes a positive, finite scale"
    if dropout_p:
        return f"dropout_p={dropout_p}: the template has no dropout (its RNG would not match)"
    if attn_mask is not None:
        return "an attn_mask/attn_bias tensor: the template takes causal or no mask only"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return f"{q.dim()}-d query: the template takes [B, H, T, d]"
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d:
        return f"head dims q {d}, k {k.shape[-1]}, v {v.shape[-1]}: the template needs one d"
    if d > MAX_HEAD_DIM or d < 1:
        return f"head dim {d} > {MAX_HEAD_DIM}: the accumulator would not fit in registers"
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0]:
        return f"k {list(k.shape)} and v {list(v.shape)} do not pair with q {list(q.shape)}"
    if q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads"
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        return f"dtypes {q.dtype}/{k.dtype}/{v.dtype}: the template takes one of fp16/bf16"
    if q.device.type == "cuda" and q.dtype == torch.float32:
        return "fp32 on the GPU: the template's tensor-core tiles are for fp16/bf16"
    if q.device.type not in ("cuda", "cpu"):
        return f"device {q.device.type}"
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        # Triton 3.6's interpreter multiplies bf16 tiles' raw bits in tl.dot (1e10 errors)
        return "bf16 on the CPU: Triton's interpreter computes bf16 dots wrongly"
    if min(q.shape[2], k.shape[2]) == 0 or q.shape[0] * q.shape[1] == 0:
        return "an empty attention: no work for a kernel"
    return None


@dataclass(frozen=True)
class Tiles:
    """One kernel's tile: BLOCK_M query rows x BLOCK_N key rows, its warps and stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def line(self) -> str:
        return (
            f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} num_warps={self.num_warps} "
            f"num_stages={self.num_stages}"
        )


@dataclass(frozen=True)
class AttentionPlan:
    """Everything the renderer prints and the runtime launches, decided here once."""

    shape: AttentionShape
    block_d: int  # head dim rounded up to a power of two (>= 16: tl.dot's smallest K)
    forward: Tiles
    dkdv: Tiles  # BLOCK_N keys per program, BLOCK_M queries per step
    dq: Tiles  # BLOCK_M queries per program, BLOCK_N keys per step
    even_m: bool  # Tq a multiple of every query block: no query-bound masks
    even_n: bool  # Tk a multiple of every key block: no key-bound masks
    reasons: tuple[str, ...] = field(default=(), compare=False)
    # the backward's delta kernel (rowsum(dO * O), dq.block_m query rows a program): an
    # elementwise product and one row sum, 4 warps as Triton's default (not tuned)
    delta_warps: int = 4

    @property
    def name(self) -> str:
        s = self.shape
        causal = "_causal" if s.causal else ""
        group = f"_g{s.group}" if s.group > 1 else ""
        tile = f"m{self.forward.block_m}n{self.forward.block_n}"
        return f"attn_d{s.head_dim}_{s.dtype}{causal}{group}_{tile}"

    def explain(self) -> Explanation:
        lines = [
            f"attention template {self.name}: {self.shape.line()}",
            f"  forward: {self.forward.line()}",
            f"  backward dK/dV: {self.dkdv.line()}; dQ: {self.dq.line()}; "
            f"delta: {self.dq.block_m} queries, {self.delta_warps} warps",
            f"  head dim {self.shape.head_dim} in tiles of {self.block_d}; "
            f"masks: queries {'none' if self.even_m else 'Tq bound'}, "
            f"keys {'none' if self.even_n else 'Tk bound'}"
            f"{', causal diagonal' if self.shape.causal else ''}",
        ]
        lines += [f"  why: {r}" for r in self.reasons]
        return Explanation("\n".join(lines))


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fit(block: int, t: int) -> int:
    """A block no larger than the sequence needs (>= 16, tl.dot's smallest side)."""
    return max(16, min(block, _pow2(t)))


def plan_attention(shape: AttentionShape) -> AttentionPlan:
    """The tiles of the forward and both backward kernels, with the reasons."""
    d = max(16, _pow2(shape.head_dim))
    reasons = []
    if shape.device == "cpu":
        # the interpreter runs every tile op in numpy: small tiles keep tests in seconds
        n = _fit(16, shape.t_k)
        fw = Tiles(max(_fit(32, shape.t_q), n), n, 4, 1)
        dkdv = Tiles(16, _fit(32, shape.t_k), 4, 1)  # BLOCK_N keys per program
        dq = Tiles(_fit(32, shape.t_q), 16, 4, 1)  # BLOCK_M queries per program
        reasons.append("CPU interpreter: tiles of 16-32 rows keep each numpy step small")
    else:
        fw, dkdv, dq = _gpu_tiles(shape, d, reasons)
    if d != shape.head_dim:
        reasons.append(f"head dim {shape.head_dim} is padded to {d} in registers, masked on load")
    even_m = all(shape.t_q % b == 0 for b in (fw.block_m, dkdv.block_m, dq.block_m))
    even_n = all(shape.t_k % b == 0 for b in (fw.block_n, dkdv.block_n, dq.block_n))
    _check(shape, d, fw, dkdv, dq)
    return AttentionPlan(shape, d, fw, dkdv, dq, even_m, even_n, tuple(reasons))


def retile(plan: AttentionPlan, why: str, **tiles: Tiles) -> AttentionPlan:
    """The plan with other tiles (forward=, dkdv=, dq=), its masks recomputed: what a
    tile sweep measures (benchmarks/attention_bench.py --sweep)."""
    fw, dkdv, dq = (tiles.get(k, getattr(plan, k)) for k in ("forward", "dkdv", "dq"))
    s = plan.shape
    _check(s, plan.block_d, fw, dkdv, dq)
    even_m = all(s.t_q % b == 0 for b in (fw.block_m, dkdv.block_m, dq.block_m))
    even_n = all(s.t_k % b == 0 for b in (fw.block_n, dkdv.block_n, dq.block_n))
    return AttentionPlan(s, plan.block_d, fw, dkdv, dq, even_m, even_n, (why,), plan.delta_warps)


def _gpu_tiles(shape: AttentionShape, d: int, reasons: list[str]) -> tuple[Tiles, Tiles, Tiles]:
    # Measured per kernel on an H100 (benchmarks/attention_tiles.py, causal bf16, d=64 at
    # T=1024 and d=128 at T=4096; benchmarks/results/h100-2026-11-28-session13/). On sm_90
    # Triton lowers tl.dot to wgmma, whose atom is 64 rows for one warpgroup (4 warps):
    # a 64-row tile on 4 warps is one atom per warpgroup, while 8 warps on 64 rows split
    # it and lose (dK/dV at d=128: 4.30 ms with 8 warps, 1.99 with 4).
    # Forward: 64 queries x 64 keys, 4 warps, 3 stages was the fastest at both head dims
    # (d=64: 0.095 ms against 0.106 for 128x64 on 8 warps, the tutorial's tile; d=128:
    # 1.19 against 1.23). Smaller query tiles also give a causal grid twice the programs,
    # which evens out the triangle's unequal rows.
    fw = Tiles(_fit(64, shape.t_q), _fit(64, shape.t_k), 4, 3)
    reasons.append(
        f"forward d={d}: 64 queries x 64 keys, 4 warps (one wgmma warpgroup, 64 rows), "
        "3 stages: the fastest measured at d=64 and d=128 (128x64 on 8 warps: 4-11% slower)"
    )
    fw = Tiles(max(fw.block_m, fw.block_n), fw.block_n, fw.num_warps, fw.num_stages)
    # Backward. dK/dV keeps two fp32 [BLOCK_N, d] accumulators per program: 64 keys on 4
    # warps (d=128: 2 x 64 x 128 x 4 B / 128 threads = 128 registers of accumulators),
    # walking 32 queries a step over 4 stages at both head dims. At d=128 a 64-query step
    # measured 3% faster (1.99 ms against 2.04) but spills 56 bytes (ptxas, sm_90); this
    # one takes 253 registers and none. dQ is its mirror: 64 queries x 64 keys on 4 warps
    # at d=64; at d=128 128 queries on 8 warps (two warpgroups of 64 rows), 64 keys a step.
    dkdv = Tiles(_fit(32, shape.t_q), _fit(64, shape.t_k), 4, 4)
    if d <= 64:
        dq = Tiles(_fit(64, shape.t_q), _fit(64, shape.t_k), 4, 3)
        measured = "d=64: dK/dV 0.154 ms against 0.202 for 32x128 on 8 warps; dQ 0.103 / 0.126"
    else:
        dq = Tiles(_fit(128, shape.t_q), _fit(64, shape.t_k), 8, 3)
        measured = "d=128: dK/dV 2.04 ms against 4.30 for 64x64 on 8 warps; dQ 1.44 / 3.51"
    reasons.append(
        f"backward d={d}: dK/dV {dkdv.block_n} keys per program x {dkdv.block_m} queries "
        f"per step on {dkdv.num_warps} warps (two fp32 [{dkdv.block_n}, {d}] accumulators), "
        f"dQ {dq.block_m} queries x {dq.block_n} keys on {dq.num_warps} warps: the fastest "
        f"measured without spills ({measured})"
    )
    # causal diagonal steps must line up: the diagonal query tile is a whole number of steps
    dkdv = Tiles(min(dkdv.block_m, dkdv.block_n), dkdv.block_n, dkdv.num_warps, dkdv.num_stages)
    dq = Tiles(dq.block_m, min(dq.block_n, dq.block_m), dq.num_warps, dq.num_stages)
    return fw, dkdv, dq


def _check(shape: AttentionShape, d: int, *tiles: Tiles) -> None:
    """The invariants the kernels rely on (a planner bug, not user input, breaks them)."""
    fw, dkdv, dq = tiles
    assert fw.block_m % fw.block_n == 0, "forward: the causal diagonal takes whole key steps"
    assert dkdv.block_n % dkdv.block_m == 0, "dK/dV: the diagonal takes whole query steps"
    assert dq.block_m % dq.block_n == 0, "dQ: the diagonal takes whole key steps"
    bytes_ = 2 if shape.dtype != "fp32" else 4
    smem = (fw.block_m + 2 * fw.block_n * fw.num_stages) * d * bytes_
    assert smem <= SMEM_BUDGET, f"forward tiles need {smem} bytes of shared memory"


MODES = ("sdpa", "template", "auto")


@dataclass(frozen=True)
class AttentionChoice:
    """Template or SDPA for one attention, and why (explain prints `line`)."""

    template: bool
    reasons: tuple[str, ...]
    plan: AttentionPlan | None = None

    def line(self) -> str:
        who = f"template {self.plan.name}" if self.template and self.plan else "SDPA"
        return f"{who}: " + "; ".join(self.reasons)


def choose(
    shape: AttentionShape,
    why_not: str | None,
    mode: str,
    measured: dict | None = None,
) -> AttentionChoice:
    """The template or SDPA. `why_not`: what `unsupported` said; `mode`: FUSER_ATTENTION;
    `measured`: the cached timing of both on this GPU (auto mode), ms forward + backward.

    SDPA is the default: its flash and cuDNN kernels are hand-tuned, the template's speed
    against them is not yet measured (benchmarks/attention_bench.py measures it)."""
    if mode not in MODES:
        return AttentionChoice(False, (f"FUSER_ATTENTION={mode!r} is not one of {MODES}",))
    if why_not is not None:
        return AttentionChoice(False, (f"the template does not take this attention: {why_not}",))
    if mode == "sdpa":
        return AttentionChoice(
            False,
            (
                "FUSER_ATTENTION=sdpa (the default): the template is not measured faster than "
                "SDPA's flash/cuDNN kernels; FUSER_ATTENTION=auto measures it on first use, "
                "=template forces it",
            ),
        )
    plan = plan_attention(shape)
    if mode == "template":
        return AttentionChoice(True, ("FUSER_ATTENTION=template forces it",), plan)
    if measured is None:
        return AttentionChoice(
            False,
            (
                "FUSER_ATTENTION=auto, no measurement: the template is timed on a GPU only "
                "(the CPU interpreter's time says nothing about it)",
            ),
        )
    t, s = measured["template_ms"], measured["sdpa_ms"]
    faster = t < s
    verdict = "faster" if faster else "not faster"
    return AttentionChoice(
        faster,
        (
            f"FUSER_ATTENTION=auto, measured on {measured.get('device', 'this GPU')}: template "
            f"{t:.3f} ms vs SDPA {s:.3f} ms forward + backward, {verdict} (cached on disk)",
        ),
        plan if faster else None,
    )
