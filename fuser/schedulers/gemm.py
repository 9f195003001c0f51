"""The GEMM template's scheduler: what a matmul fuses, its tiles, and template vs cuBLAS.

Every matmul leaves a torch.compile graph as an ATen call (cuBLAS), and the pointwise work
around it (bias, GELU, residual add, casts, the bias gradient of the backward) otherwise
runs as a separate kernel that reads and writes the [M, N] activation again. The template
(codegen/triton/gemm.py) is a tiled Triton matmul, C = A @ B with A [M, K] and B [K, N]
read through their strides (a transposed operand is a stride swap, never a copy), fp32
accumulation, and the fused work of an `Epilogue` applied to the fp32 tile before it is
stored. This module decides, once, for one matmul:
  - whether the template can compute it at all (`unsupported`: the reason ATen keeps it);
  - its tiles (`plan_gemm`): BLOCK_M x BLOCK_N x BLOCK_K, the GROUP_M swizzle, warps and
    pipeline stages, each with its reason, as a GemmPlan the renderer only prints;
  - template or cuBLAS plus a separate pointwise kernel (`choose`), from a roofline
    estimate or a measurement (runtime/gemm_tune.py), with FUSER_GEMM's mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from fuser.explanation import Explanation
from fuser.schedulers.device import Device

DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
ACTIVATIONS = ("none", "gelu", "gelu_tanh")
REDUCES = ("none", "a_rows", "b_cols")
SMEM_BUDGET = 200 * 1024  # of the H100's 227 KB a block: the rest for the epilogue's shuffles
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Epilogue:
    """The work fused around acc = A @ B, in the order the kernel does it:

    prologue (on each A tile, before tl.dot): cast to `a_cast`, then times a run-time scale;
    epilogue (on the fp32 tile): + bias[n]; store the pre-activation (`aux`, what a
    backward reads); activation; * gelu'(pre[m, n]) (`gelu_grad`: dX of a GELU); +
    residual[m, n]; cast to the output dtype and store. `reduce` sums an operand over K as
    it streams through (the bias gradient): "a_rows" gives sum_k A[m, k] per row of C,
    "b_cols" sum_k B[k, n] per column; one program owns each sum, so it is deterministic.
    """

    a_cast: str = ""  # dtype name ("bf16"...) A's tiles are cast to; "" none
    a_scale: bool = False
    bias: bool = False
    activation: str = "none"
    aux: bool = False
    gelu_grad: str = "none"  # "gelu" / "gelu_tanh": multiply by that GELU's derivative
    residual: bool = False
    reduce: str = "none"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS or self.gelu_grad not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} / gelu_grad {self.gelu_grad!r}")
        if self.reduce not in REDUCES:
            raise ValueError(f"reduce {self.reduce!r}: expected one of {REDUCES}")
        if self.a_cast and self.a_cast not in BYTES:
            raise ValueError(f"a_cast {self.a_cast!r}: expected one of {tuple(BYTES)}")
        if self.aux and self.activation == "none":
            raise ValueError("aux stores the pre-activation: it needs an activation")

    @property
    def empty(self) -> bool:
        return self == Epilogue()

    def ops(self) -> list[str]:
        """The fused work in order, as explain prints it."""
        out = []
        if self.a_cast:
            out.append(f"A cast to {self.a_cast}")
        if self.a_scale:
            out.append("A * scale")
        if self.bias:
            out.append("+ bias[n]")
        if self.aux:
            out.append("store pre-activation")
        if self.activation != "none":
            out.append(self.activation.replace("gelu_tanh", "gelu(tanh)"))
        if self.gelu_grad != "none":
            out.append(f"* {self.gelu_grad.replace('gelu_tanh', 'gelu(tanh)')}'(pre)")
        if self.residual:
            out.append("+ residual[m, n]")
        if self.reduce == "a_rows":
            out.append("row sums of A over K")
        elif self.reduce == "b_cols":
            out.append("column sums of B over K")
        return out

    def tag(self) -> str:
        parts = [
            "cast" if self.a_cast else "",
            "scale" if self.a_scale else "",
            "bias" if self.bias else "",
            self.activation if self.activation != "none" else "",
            "aux" if self.aux else "",
            f"d{self.gelu_grad}" if self.gelu_grad != "none" else "",
            "res" if self.residual else "",
            {"a_rows": "rowsum", "b_cols": "colsum"}.get(self.reduce, ""),
        ]
        return "_".join(p for p in parts if p) or "plain"


@dataclass(frozen=True)
class GemmShape:
    """One matmul: C [M, N] = A [M, K] @ B [K, N], and where it runs."""

    m: int
    n: int
    k: int
    dtype: str  # of tl.dot's operands: B's, and A's after its prologue cast
    a_dtype: str  # A as stored (differs from dtype when the prologue casts it)
    out_dtype: str
    device: str  # cuda | cpu
    index64: bool = False  # an operand's extent passes 2**31 elements: 64-bit offsets

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def line(self) -> str:
        a = f" (A {self.a_dtype})" if self.a_dtype != self.dtype else ""
        return f"M={self.m} N={self.n} K={self.k} {self.dtype}{a} -> {self.out_dtype}"


def unsupported(shape: GemmShape, epilogue: Epilogue) -> str | None:
    """Why the template cannot compute this matmul (ATen keeps it), or None."""
    names = (shape.dtype, shape.a_dtype, shape.out_dtype)
    if any(d not in BYTES for d in names):
        return f"dtypes {'/'.join(names)}: the template takes fp16, bf16 and fp32"
    a_after = epilogue.a_cast or shape.a_dtype
    if a_after != shape.dtype:
        return f"A is {a_after} and B {shape.dtype}: tl.dot takes one dtype"
    if shape.device not in ("cuda", "cpu"):
        return f"device {shape.device}"
    if shape.device == "cuda" and shape.dtype == "fp32":
        return "fp32 on the GPU: the template's tensor-core tiles are for fp16/bf16"
    if shape.m == 0 or shape.n == 0:
        return "an empty output: no work for a kernel"
    if shape.k == 0:
        return "K = 0: nothing to multiply"
    return None


@dataclass(frozen=True)
class GemmTiles:
    """The kernel's tile: BLOCK_M x BLOCK_N outputs a program, K in steps of BLOCK_K."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    def line(self) -> str:
        return (
            f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} BLOCK_K={self.block_k} "
            f"GROUP_M={self.group_m} num_warps={self.num_warps} num_stages={self.num_stages}"
        )

    def smem(self, itemsize: int) -> int:
        """Shared memory the pipelined A and B tiles take."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * itemsize


# each tensor argument's strides, by the names the kernel reads them under
STRIDES = {
    "A": ("s_am", "s_ak"),
    "B": ("s_bk", "s_bn"),
    "C": ("s_cm", "s_cn"),
    "BIAS": ("s_bias",),
    "AUX": ("s_xm", "s_xn"),
    "PRE": ("s_pm", "s_pn"),
    "RES": ("s_rm", "s_rn"),
    "SUMS": ("s_sum",),
}


@dataclass(frozen=True)
class GemmPlan:
    """Everything the renderer prints and the runtime launches, decided here once."""

    shape: GemmShape
    epilogue: Epilogue
    tiles: GemmTiles
    even_m: bool  # M a multiple of BLOCK_M: no row masks
    even_n: bool
    even_k: bool
    dot_upcast: bool  # tiles cast to fp32 before tl.dot (bf16 in Triton's CPU interpreter)
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        t = self.tiles
        return f"gemm_{self.epilogue.tag()}_{self.shape.dtype}_m{t.block_m}n{t.block_n}k{t.block_k}"

    def grid(self) -> int:
        t, s = self.tiles, self.shape
        return -(-s.m // t.block_m) * -(-s.n // t.block_n)

    def arguments(self) -> list[str]:
        """The kernel's tensor and scalar arguments in order (the strides follow)."""
        e = self.epilogue
        names = ["A", "B", "C"]
        names += ["BIAS"] if e.bias else []
        names += ["AUX"] if e.aux else []
        names += ["PRE"] if e.gelu_grad != "none" else []
        names += ["RES"] if e.residual else []
        names += ["SUMS"] if e.reduce != "none" else []
        names += ["scale"] if e.a_scale else []
        return names

    def signature(self) -> list[str]:
        """Every argument of the kernel in order: tensors, the scale, sizes, strides."""
        names = self.arguments()
        strides = [s for a in names for s in STRIDES.get(a, ())]
        return [*names, "M", "N", "K", *strides]

    def explain(self) -> Explanation:
        s = self.shape
        evens = (("M", self.even_m), ("N", self.even_n), ("K", self.even_k))
        masks = [d for d, even in evens if not even]
        lines = [
            f"GEMM template {self.name}: {s.line()}",
            f"  fused: {', '.join(self.epilogue.ops()) or 'nothing'}",
            f"  tiles: {self.tiles.line()}; {self.grid()} programs",
            f"  masks: {', '.join(masks) + ' bounds' if masks else 'none (exact tiles)'}"
            f"{'; tiles cast to fp32 before tl.dot' if self.dot_upcast else ''}",
        ]
        lines += [f"  why: {r}" for r in self.reasons]
        return Explanation("\n".join(lines))


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fit(block: int, extent: int) -> int:
    """A block no larger than the extent needs (>= 16: tl.dot's smallest side)."""
    return max(16, min(block, _pow2(extent)))


# GPU tile candidates for 2-byte operands and the fraction of the tensor cores' peak each
# sustains on a full wave. 128x256x64 with 8 warps (two warpgroups, 128 fp32 accumulator
# registers a thread) and 3 stages (144 KB of A/B tiles) is the tile Triton's Hopper matmul
# tutorial and Inductor's sm_90 configs put first; the smaller tiles trade tensor-core
# efficiency (each A/B byte feeds fewer MACs) for more programs when the grid is short.
# The efficiencies are estimates until benchmarks/gemm_bench.py measures them.
GPU_TILES = (
    (GemmTiles(128, 256, 64, 8, 8, 3), 1.00),
    (GemmTiles(128, 128, 64, 8, 8, 4), 0.92),
    (GemmTiles(128, 64, 64, 8, 4, 4), 0.78),
    (GemmTiles(64, 128, 64, 8, 4, 4), 0.78),
    (GemmTiles(64, 64, 64, 8, 4, 4), 0.55),
)


def plan_gemm(shape: GemmShape, epilogue: Epilogue, sms: int = 132) -> GemmPlan:
    """The tiles of one matmul with the reasons (`sms`: the GPU's SM count)."""
    reasons: list[str] = []
    if shape.device == "cpu":
        # the interpreter runs every tile op in numpy: small tiles keep tests in seconds
        tiles = GemmTiles(_fit(32, shape.m), _fit(32, shape.n), _fit(32, shape.k), 4, 4, 1)
        reasons.append("CPU interpreter: tiles of 16-32 keep each numpy step small")
    else:
        tiles = _gpu_tiles(shape, epilogue, sms, reasons)
    upcast = shape.device == "cpu" and shape.dtype == "bf16"
    if upcast:
        # Triton 3.6's interpreter multiplies bf16 tiles' raw bits in tl.dot (1e10 errors);
        # a bf16 product is exact in fp32, so the fp32 dot gives the bf16 GEMM's result
        reasons.append("bf16 in the CPU interpreter: tiles cast to fp32 before tl.dot")
    return _planned(shape, epilogue, tiles, upcast, tuple(reasons))


def retile(plan: GemmPlan, tiles: GemmTiles, why: str) -> GemmPlan:
    """The plan with other tiles, its masks recomputed: what the autotune measures."""
    return _planned(plan.shape, plan.epilogue, tiles, plan.dot_upcast, (why,))


def _planned(
    shape: GemmShape, epilogue: Epilogue, t: GemmTiles, upcast: bool, reasons: tuple[str, ...]
) -> GemmPlan:
    for side in (t.block_m, t.block_n, t.block_k):
        assert side >= 16 and side & (side - 1) == 0, f"tile side {side}: a power of two >= 16"
    even = (shape.m % t.block_m == 0, shape.n % t.block_n == 0, shape.k % t.block_k == 0)
    return GemmPlan(shape, epilogue, t, *even, upcast, reasons)


def _heavy_epilogue(epilogue: Epilogue) -> bool:
    """Whether the epilogue's GELU (or its derivative) runs on the tile: its temporaries
    beside the accumulator. ptxas (sm_90, Triton 3.6) spilled both on a 128x256 tile with
    8 warps (bias + GELU(tanh) + aux: 255 registers and 112 bytes of stack; the GELU
    backward: 64 bytes) and fit them at 128x128 (124 and 150 registers); a residual add
    fit at 128x256 (246 registers)."""
    return epilogue.activation != "none" or epilogue.gelu_grad != "none"


def _gpu_tiles(shape: GemmShape, epilogue: Epilogue, sms: int, reasons: list[str]) -> GemmTiles:
    """The candidate with the least estimated time: waves of programs x the time of one
    tile (its MACs over its tensor-core efficiency). A short grid leaves SMs idle in its
    last wave, which the smaller tiles avoid at a lower efficiency."""
    best, best_cost, lines = None, math.inf, []
    for tiles, eff in GPU_TILES:
        t = replace(
            tiles,
            block_m=_fit(tiles.block_m, shape.m),
            block_n=_fit(tiles.block_n, shape.n),
            block_k=_fit(tiles.block_k, shape.k),
        )
        if _heavy_epilogue(epilogue) and t.block_m * t.block_n > 128 * 128:
            continue  # spills (see _heavy_epilogue)
        itemsize = BYTES[shape.dtype]
        while t.num_stages > 2 and t.smem(itemsize) > SMEM_BUDGET:
            t = replace(t, num_stages=t.num_stages - 1)
        programs = -(-shape.m // t.block_m) * -(-shape.n // t.block_n)
        waves = -(-programs // sms)
        cost = waves * t.block_m * t.block_n / eff
        lines.append(f"{t.block_m}x{t.block_n}: {programs} programs, {waves} wave(s)")
        if cost < best_cost - 1e-9:
            best, best_cost = t, cost
    assert best is not None
    reasons.append(
        f"tile {best.block_m}x{best.block_n}x{best.block_k}, {best.num_warps} warps, "
        f"{best.num_stages} stages: fewest waves x tile time over {sms} SMs "
        f"({'; '.join(lines)})"
    )
    if _heavy_epilogue(epilogue):
        reasons.append("a GELU in the epilogue: tiles of at most 128x128 (128x256 spills)")
    reasons.append(f"GROUP_M={best.group_m}: row blocks walk columns in groups (B tiles in L2)")
    return best


# ---- the choice ---------------------------------------------------------------------

MODES = ("aten", "template", "auto")
# dense fp16/bf16 tensor-core peaks by compute capability (NVIDIA's datasheets: H100 SXM
# 989 TFLOP/s, A100 312)
PEAK_TFLOPS = {90: 989.0, 80: 312.0}
# the fractions of that peak cuBLAS and the template reach at the GPT-2 124M shapes:
# estimates (cuBLAS ~690 TFLOP/s bf16 on an H100 at large K), to be replaced by what
# benchmarks/gemm_bench.py measures
CUBLAS_EFFICIENCY = 0.70
TEMPLATE_EFFICIENCY = 0.60
LAUNCH_US = 3.0  # a separate kernel's launch gap and ramp
MARGIN = 0.95  # the template must be estimated 5% faster: the estimate's own error


@dataclass(frozen=True)
class GemmEstimate:
    """Roofline times of both ways: max(FLOPs / sustained peak, bytes / bandwidth)."""

    template_us: float
    aten_us: float
    template_bytes: int
    aten_bytes: int

    def line(self) -> str:
        return (
            f"estimate: template {self.template_us:.1f} us ({self.template_bytes / 1e6:.1f} MB) "
            f"vs cuBLAS + separate kernels {self.aten_us:.1f} us "
            f"({self.aten_bytes / 1e6:.1f} MB)"
        )


def _tile_efficiency(plan: GemmPlan | None, sms: int) -> float:
    """The plan's tile efficiency (GPU_TILES) over its last wave's idle SMs: 288 programs
    on 132 SMs run as 3 full waves (1.375x the work's time)."""
    if plan is None:
        return 1.0
    t = plan.tiles
    eff = next((e for c, e in GPU_TILES if (c.block_m, c.block_n) == (t.block_m, t.block_n)), 0.55)
    programs = plan.grid()
    return eff * programs / (-(-programs // sms) * sms)


def estimate(
    shape: GemmShape, epilogue: Epilogue, device: Device, plan: GemmPlan | None = None
) -> GemmEstimate:
    """Template time = max(flops / (peak x its efficiency x the plan's tile and wave
    efficiency), its bytes / bandwidth); ATen time = the cuBLAS GEMM's (bias fused, as
    addmm does; cuBLAS's split-K and stream-K kernels are taken to keep its efficiency
    at any grid) + each separate kernel's bytes / bandwidth and launch."""
    peak = PEAK_TFLOPS.get(device.arch, PEAK_TFLOPS[80]) * 1e12
    bw = device.dram_gbps * 1e9
    m, n, k = shape.m, shape.n, shape.k
    ab, ob, db = BYTES[shape.a_dtype], BYTES[shape.out_dtype], BYTES[shape.dtype]
    mn = m * n
    core = m * k * ab + k * n * db + (n * ob if epilogue.bias else 0)
    extra = mn * ob * (int(epilogue.aux) + int(epilogue.residual))
    extra += mn * ob * int(epilogue.gelu_grad != "none")
    sums = {"a_rows": m, "b_cols": n}.get(epilogue.reduce, 0) * ob
    t_bytes = core + mn * ob + extra + sums
    eff = TEMPLATE_EFFICIENCY * _tile_efficiency(plan, device.sms)
    template_us = max(shape.flops() / (peak * eff), t_bytes / bw) * 1e6
    # ATen: the GEMM writes C in the dot dtype; a pointwise kernel reads it back with its
    # other operands and writes the result; a cast prologue is its own kernel; the sum of
    # an operand reads that operand again
    kernels, side = 0, 0
    a_core = m * k * db + k * n * db + (n * db if epilogue.bias else 0) + mn * db
    if epilogue.a_cast or epilogue.a_scale:
        kernels, side = kernels + 1, side + m * k * (ab + db)
    pointwise = epilogue.activation != "none" or epilogue.gelu_grad != "none"
    if pointwise or epilogue.residual or shape.out_dtype != shape.dtype:
        kernels += 1
        side += mn * db + mn * ob + extra - (mn * ob if epilogue.aux else 0)
    if epilogue.reduce != "none":
        kernels += 1
        side += (m * k if epilogue.reduce == "a_rows" else k * n) * db + sums
    gemm_us = max(shape.flops() / (peak * CUBLAS_EFFICIENCY), a_core / bw) * 1e6
    aten_us = gemm_us + side / bw * 1e6 + kernels * LAUNCH_US
    return GemmEstimate(template_us, aten_us, t_bytes, a_core + side)


@dataclass(frozen=True)
class GemmChoice:
    """Template or cuBLAS for one matmul and its fused work, and why."""

    template: bool
    reasons: tuple[str, ...]
    plan: GemmPlan | None = None
    estimate: GemmEstimate | None = None

    def line(self) -> str:
        who = f"template {self.plan.name}" if self.template and self.plan else "cuBLAS"
        return f"{who}: " + "; ".join(self.reasons)


def choose(
    shape: GemmShape,
    epilogue: Epilogue,
    why_not: str | None,
    mode: str,
    device: Device,
    template_backend: bool = True,
    measured: dict | None = None,
) -> GemmChoice:
    """The template or cuBLAS. `why_not`: what `unsupported` said; `mode`: FUSER_GEMM;
    `template_backend`: whether the backend renders the template (CUDA routes GEMMs to
    cuBLAS); `measured`: template vs cuBLAS + separate kernel on this GPU (auto), in ms."""
    if mode not in MODES:
        return GemmChoice(False, (f"FUSER_GEMM={mode!r} is not one of {MODES}",))
    if mode == "aten":
        return GemmChoice(
            False,
            (
                "FUSER_GEMM=aten (the default): the template is not yet measured faster than "
                "cuBLAS + a fused pointwise kernel; =auto chooses by estimate or measurement, "
                "=template forces it",
            ),
        )
    if not template_backend:
        return GemmChoice(False, ("the CUDA backend has no GEMM template: cuBLAS",))
    if why_not is not None:
        return GemmChoice(False, (f"the template does not take this matmul: {why_not}",))
    if epilogue.empty:
        return GemmChoice(False, ("nothing to fuse: cuBLAS alone is the faster GEMM",))
    plan = plan_gemm(shape, epilogue, device.sms)
    est = estimate(shape, epilogue, device, plan)
    if mode == "template":
        return GemmChoice(True, ("FUSER_GEMM=template forces it", est.line()), plan, est)
    if measured is not None:
        t, a = measured["template_ms"], measured["aten_ms"]
        faster = t < a
        tiles = measured.get("tiles")
        if faster and tiles:
            plan = retile(plan, GemmTiles(*tiles), f"autotuned on {measured.get('device')}")
        why = (
            f"FUSER_GEMM=auto, measured on {measured.get('device', 'this GPU')}: template "
            f"{t:.3f} ms vs cuBLAS + separate kernel {a:.3f} ms, "
            f"{'faster' if faster else 'not faster'} (cached on disk)"
        )
        return GemmChoice(faster, (why, est.line()), plan if faster else None, est)
    if shape.device != "cuda":
        why = (
            "FUSER_GEMM=auto on CPU: Triton's interpreter is no match for ATen's CPU matmul "
            "(the estimate is the GPU model's)"
        )
        return GemmChoice(False, (why, est.line()), None, est)
    faster = est.template_us < MARGIN * est.aten_us
    why = f"FUSER_GEMM=auto, no measurement: the estimate says {'template' if faster else 'cuBLAS'}"
    return GemmChoice(faster, (why, est.line()), plan if faster else None, est)
