"""The GEMM template or cuBLAS plus a separate pointwise kernel, for one matmul.

A roofline estimate of both ways (`estimate`: the template's FLOPs at its tile's
efficiency over the waves its grid makes, and its bytes, split-K partials included; the
cuBLAS GEMM and each separate kernel's bytes and launch), and the choice (`choose`) from
FUSER_GEMM's mode, the backend, the estimate or a measurement (runtime/gemm_tune.py).
The plan itself (tiles, split-K) is schedulers/gemm.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuser.schedulers.device import Device
from fuser.schedulers.gemm import (
    BYTES,
    GPU_TILES,
    LAUNCH_US,
    PEAK_TFLOPS,
    TEMPLATE_EFFICIENCY,
    Epilogue,
    GemmPlan,
    GemmShape,
    GemmTiles,
    plan_gemm,
    retile,
)

MODES = ("aten", "template", "auto")
# the fraction of the tensor cores' peak cuBLAS reaches at the GPT-2 124M shapes: an
# estimate (cuBLAS ~690 TFLOP/s bf16 on an H100 at large K), to be replaced by what
# benchmarks/gemm_bench.py measures
CUBLAS_EFFICIENCY = 0.70
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
    extra += mn * int(epilogue.mask)  # dropout's saved mask: a byte an element (bool)
    sums = {"a_rows": m, "b_cols": n}.get(epilogue.reduce, 0) * ob
    t_bytes = core + mn * ob + extra + sums
    eff = TEMPLATE_EFFICIENCY * _tile_efficiency(plan, device.sms)
    template_us = max(shape.flops() / (peak * eff), t_bytes / bw) * 1e6
    partials = plan.workspace_bytes() if plan is not None else 0
    if partials:  # split-K: fp32 partials written, read back by the finalize launch
        t_bytes += 2 * partials
        template_us += 2 * partials / bw * 1e6 + LAUNCH_US
    # ATen: the GEMM writes C in the dot dtype; a pointwise kernel reads it back with its
    # other operands and writes the result; a cast prologue is its own kernel; the sum of
    # an operand reads that operand again
    kernels, side = 0, 0
    a_core = m * k * db + k * n * db + (n * db if epilogue.bias else 0) + mn * db
    if epilogue.a_cast or epilogue.a_scale:
        kernels, side = kernels + 1, side + m * k * (ab + db)
    pointwise = epilogue.activation != "none" or epilogue.gelu_grad != "none" or epilogue.mask
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
    plan = plan_gemm(shape, epilogue, device.sms, device)
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
