"""The GEMM template's scheduler: what a matmul fuses, its tiles, and template vs cuBLAS.

Every matmul leaves a torch.compile graph as an ATen call (cuBLAS), and the pointwise work
around it (bias, GELU, residual add, casts, the bias gradient of the backward) otherwise
runs as a separate kernel that reads and writes the [M, N] activation again. The template
(codegen/triton/gemm.py) is a tiled Triton matmul, C = A @ B with A [M, K] and B [K, N]
read through their strides (a transposed operand is a stride swap, never a copy), fp32
accumulation, and the fused work of an `Epilogue` applied to the fp32 tile before it is
stored. This module decides, once, for one matmul:
  - whether the template can compute it at all (`unsupported`: the reason ATen keeps it);
  - its tiles (`plan_gemm`): BLOCK_M x BLOCK_N x BLOCK_K, the GROUP_M swizzle, warps,
    pipeline stages and split-K, each with its reason, as a GemmPlan the renderer only
    prints.
Template or cuBLAS plus a separate pointwise kernel is schedulers/gemm_choice.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from fuser.explanation import Explanation
from fuser.schedulers.device import PRESETS, Device

DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
ACTIVATIONS = ("none", "gelu", "gelu_tanh")
REDUCES = ("none", "a_rows", "b_cols")
SMEM_BUDGET = 200 * 1024  # of the H100's 227 KB a block: the rest for the epilogue's shuffles
INT32_MAX = 2**31 - 1
H100 = PRESETS["h100"]
# dense fp16/bf16 tensor-core peaks by compute capability (NVIDIA's datasheets: H100 SXM
# 989 TFLOP/s, A100 312)
PEAK_TFLOPS = {90: 989.0, 80: 312.0}
# the fraction of that peak the template reaches on a full wave at the GPT-2 124M shapes:
# an estimate, to be replaced by what benchmarks/gemm_bench.py measures
TEMPLATE_EFFICIENCY = 0.60
LAUNCH_US = 3.0  # a separate kernel's launch gap and ramp


@dataclass(frozen=True)
class Epilogue:
    """The work fused around acc = A @ B, in the order the kernel does it:

    prologue (on each A tile, before tl.dot): cast to `a_cast`, then times a run-time scale;
    epilogue (on the fp32 tile): + bias[n]; store the pre-activation (`aux`, what a
    backward reads); activation; * mask[m, n] * a run-time scale (`mask`: dropout with a
    saved mask, as a backward applies it to a matmul's result); * gelu'(pre[m, n])
    (`gelu_grad`: dX of a GELU); + residual[m, n]; cast to the output dtype and store.
    `reduce` sums an operand over K as it streams through (the bias gradient): "a_rows"
    gives sum_k A[m, k] per row of C, "b_cols" sum_k B[k, n] per column; one program owns
    each sum, so it is deterministic.
    """

    a_cast: str = ""  # dtype name ("bf16"...) A's tiles are cast to; "" none
    a_scale: bool = False
    bias: bool = False
    activation: str = "none"
    aux: bool = False
    gelu_grad: str = "none"  # "gelu" / "gelu_tanh": multiply by that GELU's derivative
    residual: bool = False
    reduce: str = "none"
    mask: bool = False  # * mask[m, n] * mask_scale (dropout with its saved mask)

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
        if self.mask:
            out.append("* mask[m, n] * mask_scale (dropout)")
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
            "mask" if self.mask else "",
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
    # split-K: K cut into this many ranges, one program each; each writes its fp32
    # partial tile to a workspace and a finalize kernel adds them in a fixed order (the
    # same bits every run) before the epilogue. For a grid too short for the SMs: dW.
    split_k: int = 1

    def line(self) -> str:
        split = f" SPLIT_K={self.split_k}" if self.split_k > 1 else ""
        return (
            f"BLOCK_M={self.block_m} BLOCK_N={self.block_n} BLOCK_K={self.block_k} "
            f"GROUP_M={self.group_m} num_warps={self.num_warps} num_stages={self.num_stages}"
            f"{split}"
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
    "MASK": ("s_dm", "s_dn"),
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
    # bf16 converted through its bits (helpers _cvt/_f32): Triton 3.6's interpreter
    # truncates float32 -> bf16 where a GPU and torch round to nearest even
    exact_bf16: bool = False
    # the dot computed as Cᵀ = Bᵀ·Aᵀ (the tile transposed back after the loop): A's
    # prologue output is the second operand, which wgmma reads from shared memory
    swap_ab: bool = False
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def split(self) -> bool:
        """K split over several programs, their partial tiles added by a finalize kernel."""
        return self.tiles.split_k > 1

    @property
    def name(self) -> str:
        t = self.tiles
        split = f"_sk{t.split_k}" if self.split else ""
        return (
            f"gemm_{self.epilogue.tag()}_{self.shape.dtype}_m{t.block_m}n{t.block_n}k{t.block_k}"
            f"{split}"
        )

    def tile_grid(self) -> int:
        """BLOCK_M x BLOCK_N tiles of C (the finalize kernel's programs)."""
        t, s = self.tiles, self.shape
        return -(-s.m // t.block_m) * -(-s.n // t.block_n)

    def grid(self) -> int:
        """Programs of the main kernel: a tile and a K range each."""
        return self.tile_grid() * self.tiles.split_k

    def _epilogue_tensors(self) -> list[str]:
        e = self.epilogue
        names = ["C"]
        names += ["BIAS"] if e.bias else []
        names += ["AUX"] if e.aux else []
        names += ["MASK"] if e.mask else []
        names += ["PRE"] if e.gelu_grad != "none" else []
        names += ["RES"] if e.residual else []
        names += ["SUMS"] if e.reduce != "none" else []
        return names

    def _workspaces(self) -> list[str]:
        """The split's fp32 partials: [SPLIT_K, M, N] tiles and [SPLIT_K, M or N] sums."""
        return ["PART"] + (["PSUMS"] if self.epilogue.reduce != "none" else [])

    def arguments(self) -> list[str]:
        """The main kernel's tensor and scalar arguments in order (the strides follow)."""
        names = ["A", "B"]
        names += self._workspaces() if self.split else self._epilogue_tensors()
        names += ["scale"] if self.epilogue.a_scale else []
        names += ["mask_scale"] if self.epilogue.mask and not self.split else []
        return names

    def finalize_arguments(self) -> list[str]:
        """The finalize kernel's tensor and scalar arguments (none without a split)."""
        if not self.split:
            return []
        mask_scale = ["mask_scale"] if self.epilogue.mask else []
        return [*self._workspaces(), *self._epilogue_tensors(), *mask_scale]

    def signature(self, finalize: bool = False) -> list[str]:
        """Every argument of the main (or the finalize) kernel in order: tensors, the
        scale, sizes, strides (the workspaces are contiguous: no strides)."""
        names = self.finalize_arguments() if finalize else self.arguments()
        strides = [s for a in names for s in STRIDES.get(a, ())]
        sizes = ["M", "N"] if finalize else ["M", "N", "K"]
        return [*names, *sizes, *strides]

    def kernels(self) -> list[tuple[str, int, list[str]]]:
        """(function name, programs, signature) of each kernel, in launch order."""
        out = [(self.name, self.grid(), self.signature())]
        if self.split:
            out.append((f"{self.name}_finalize", self.tile_grid(), self.signature(True)))
        return out

    def workspace_bytes(self) -> int:
        """The split's fp32 partials (0 without a split)."""
        if not self.split:
            return 0
        s, e = self.shape, self.epilogue
        sums = {"a_rows": s.m, "b_cols": s.n}.get(e.reduce, 0)
        return 4 * self.tiles.split_k * (s.m * s.n + sums)

    def explain(self) -> Explanation:
        s = self.shape
        evens = (("M", self.even_m), ("N", self.even_n), ("K", self.even_k))
        masks = [d for d, even in evens if not even]
        lines = [
            f"GEMM template {self.name}: {s.line()}",
            f"  fused: {', '.join(self.epilogue.ops()) or 'nothing'}",
            f"  tiles: {self.tiles.line()}; {self._programs()}",
            f"  masks: {', '.join(masks) + ' bounds' if masks else 'none (exact tiles)'}"
            f"{'; tiles cast to fp32 before tl.dot' if self.dot_upcast else ''}"
            f"{'; bf16 rounded to nearest even by its bits' if self.exact_bf16 else ''}",
        ]
        lines += [f"  why: {r}" for r in self.reasons]
        return Explanation("\n".join(lines))

    def _programs(self) -> str:
        if not self.split:
            return f"{self.grid()} programs"
        return (
            f"{self.tile_grid()} tiles x {self.tiles.split_k} K ranges = {self.grid()} "
            f"programs, then a finalize of {self.tile_grid()} adding the fp32 partials "
            f"({self.workspace_bytes() / 1e6:.1f} MB workspace) in a fixed order"
        )


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


def plan_gemm(
    shape: GemmShape,
    epilogue: Epilogue,
    sms: int = 132,
    device: Device | None = None,
    allow_split: bool = True,
) -> GemmPlan:
    """The tiles of one matmul with the reasons (`sms`: the GPU's SM count; `device`:
    its peak and bandwidth for the split-K trade, the H100's by default;
    `allow_split=False`: the best plan without split-K, the benchmark's baseline)."""
    reasons: list[str] = []
    if shape.device == "cpu":
        # the interpreter runs every tile op in numpy: small tiles keep tests in seconds
        tiles = GemmTiles(_fit(32, shape.m), _fit(32, shape.n), _fit(32, shape.k), 4, 4, 1)
        reasons.append("CPU interpreter: tiles of 16-32 keep each numpy step small")
    else:
        tiles = _gpu_tiles(shape, epilogue, sms, device or H100, reasons, allow_split)
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
    if t.split_k > 1 and (shape.index64 or t.split_k * shape.m * shape.n > INT32_MAX):
        raise ValueError(f"SPLIT_K={t.split_k}: the fp32 partials pass 2**31 elements")
    even = (shape.m % t.block_m == 0, shape.n % t.block_n == 0, shape.k % t.block_k == 0)
    # the interpreter truncates float32 -> bf16 (0.7 ulp errors a GPU does not make)
    exact = shape.device == "cpu" and "bf16" in (shape.a_dtype, shape.dtype, shape.out_dtype)
    swap = SWAP_PROLOGUE_AB and shape.device == "cuda" and bool(epilogue.a_cast or epilogue.a_scale)
    if swap:
        reasons += ("A's prologue: the dot transposed, A from shared memory (SWAP_PROLOGUE_AB)",)
    return GemmPlan(shape, epilogue, t, *even, upcast, exact, swap, reasons)


# An A tile changed in registers (the prologue's cast or scale) is a register operand of
# sm_90's wgmma, which Triton 3.6 pipelines 3 deep; ptxas before CUDA 13.3 rewrites it for
# the next step before the wgmma reading it is waited for (Triton issue 9433; gemm_sass.py
# finds it in such plans' SASS, 64x64 to 128x256 tiles). As tl.dot's second operand the
# tile goes through shared memory (loads still pipelined, each step's wgmmas waited).
SWAP_PROLOGUE_AB = True


def _heavy_epilogue(epilogue: Epilogue) -> bool:
    """Whether the epilogue's GELU (or its derivative) runs on the tile: its temporaries
    beside the accumulator. ptxas (sm_90, Triton 3.6) spilled both on a 128x256 tile with
    8 warps (bias + GELU(tanh) + aux: 255 registers and 112 bytes of stack; the GELU
    backward: 64 bytes) and fit them at 128x128 (124 and 150 registers); a residual add
    fit at 128x256 (246 registers)."""
    return epilogue.activation != "none" or epilogue.gelu_grad != "none"


# split-K candidates (K ranges a tile's work is cut into) and the fewest BLOCK_K steps a
# range walks (an estimate: with a handful of steps the pipeline's prologue and the fp32
# partial's store cost as much as the loop; dW at GPT-2 shapes has 256 steps of 64)
SPLITS = (1, 2, 3, 4, 6, 8)
MIN_K_STEPS = 8
# Measured on an H100 (benchmarks/results/h100-2026-11-27-kernels/gemm): the dW template
# with the bias-gradient sum gave wrong results (max error 0.65-0.78 against 3e-3) with
# 128x256 tiles, split or not, while the CPU interpreter and the fuzzer found them right.
# Until a GPU run shows the cause fixed, GPU plans with a sum keep to 128x128 tiles and
# never split K (the split plans were 128x256; split-K is unverified on a GPU).
SPLIT_K_ON_GPU = False


def _splits(shape: GemmShape, t: GemmTiles) -> list[int]:
    """The split-K factors that give every K range at least MIN_K_STEPS steps (none
    empty) and keep the fp32 partials' offsets in 32 bits."""
    steps = -(-shape.k // t.block_k)
    out = [1]
    for s in SPLITS[1:]:
        per = -(-steps // s)
        if shape.index64 or s * shape.m * shape.n > INT32_MAX:
            break
        if per >= MIN_K_STEPS and (s - 1) * per < steps:
            out.append(s)
    return out


def _gpu_tiles(
    shape: GemmShape,
    epilogue: Epilogue,
    sms: int,
    device: Device,
    reasons: list[str],
    allow_split: bool = True,
) -> GemmTiles:
    """The candidate with the least estimated time: waves of programs x the time of one
    program (its MACs over its tile's tensor-core efficiency). A short grid leaves SMs
    idle in its last wave, which the smaller tiles avoid at a lower efficiency, and
    split-K at the cost of writing and re-reading fp32 partials (and a finalize launch)."""
    peak_sm = PEAK_TFLOPS.get(device.arch, PEAK_TFLOPS[80]) * 1e12 * TEMPLATE_EFFICIENCY / sms
    bw = device.dram_gbps * 1e9
    best, best_us, unsplit_us, lines = None, math.inf, math.inf, []
    for tiles, eff in GPU_TILES:
        t = replace(
            tiles,
            block_m=_fit(tiles.block_m, shape.m),
            block_n=_fit(tiles.block_n, shape.n),
            block_k=_fit(tiles.block_k, shape.k),
        )
        if _heavy_epilogue(epilogue) and t.block_m * t.block_n > 128 * 128:
            continue  # spills (see _heavy_epilogue)
        if epilogue.reduce != "none" and t.block_m * t.block_n > 128 * 128:
            continue  # wrong on an H100 (see SUM_ON_GPU)
        itemsize = BYTES[shape.dtype]
        while t.num_stages > 2 and t.smem(itemsize) > SMEM_BUDGET:
            t = replace(t, num_stages=t.num_stages - 1)
        n_tiles = -(-shape.m // t.block_m) * -(-shape.n // t.block_n)
        steps = -(-shape.k // t.block_k)
        for split in _splits(shape, t) if allow_split and SPLIT_K_ON_GPU else [1]:
            programs = n_tiles * split
            waves = -(-programs // sms)
            k = -(-steps // split) * t.block_k
            us = waves * 2.0 * t.block_m * t.block_n * k / (peak_sm * eff) * 1e6
            if split > 1:
                partials = 4 * split * shape.m * shape.n
                us += 2 * partials / bw * 1e6 + LAUNCH_US  # written, read back; a launch
            else:
                lines.append(f"{t.block_m}x{t.block_n}: {programs} programs, {waves} wave(s)")
                unsplit_us = min(unsplit_us, us)
            if us < best_us - 1e-9:
                best, best_us = replace(t, split_k=split), us
    assert best is not None
    reasons.append(
        f"tile {best.block_m}x{best.block_n}x{best.block_k}, {best.num_warps} warps, "
        f"{best.num_stages} stages: fewest waves x tile time over {sms} SMs "
        f"({'; '.join(lines)})"
    )
    if best.split_k > 1:
        programs = -(-shape.m // best.block_m) * -(-shape.n // best.block_n) * best.split_k
        reasons.append(
            f"split-K {best.split_k}: {programs} programs in {-(-programs // sms)} wave(s), "
            f"est. {best_us:.0f} us with the fp32 partials written and added back vs "
            f"{unsplit_us:.0f} us unsplit (K={shape.k} is long, the grid short)"
        )
    if _heavy_epilogue(epilogue):
        reasons.append("a GELU in the epilogue: tiles of at most 128x128 (128x256 spills)")
    if epilogue.reduce != "none":
        reasons.append("a sum in the epilogue: tiles up to 128x128 (128x256 was wrong on an H100)")
    if allow_split and not SPLIT_K_ON_GPU:
        reasons.append("split-K off on a GPU: unverified there (SPLIT_K_ON_GPU)")
    reasons.append(f"GROUP_M={best.group_m}: row blocks walk columns in groups (B tiles in L2)")
    return best
