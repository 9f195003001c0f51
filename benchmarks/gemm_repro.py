"""The GEMM template's A-prologue plans on a GPU: the register-operand hazard and its fix.

    python benchmarks/gemm_repro.py --out $OUT/gemm_repro.json [--no-sass]   # ~3 min, H100
    python benchmarks/gemm_repro.py --smoke                                  # CPU, interpreted

A prologue (A cast, scaled) makes A a register operand of sm_90's wgmma, which Triton 3.6
pipelines 3 deep; the ptxas it ships (CUDA 12.8) rewrites those registers before the
wgmma reading them is waited for (Triton issue 9433; runtime/gemm_sass.py finds it in the
SASS). schedulers/gemm.SWAP_PROLOGUE_AB renders such plans' dot transposed (A's tile in
shared memory). For each suspect configuration, both renderings (`swap` False: the dot as
before; True: the fix), each run 5 times:
  - bad: elements off the float64 product of the operands the prologue makes (the
    template rounds them as eager does) by more than the output's rounding plus the fp32
    accumulation bound (fuzz/gemm_check.py's), and the worst ratio to that bound;
  - repeat: the 5 runs' bits equal (a race shows as runs that differ);
  - ms and TFLOP/s (triton.testing.do_bench, median), cuBLAS with the prologue and the
    epilogue as eager ops beside them;
  - hazards: gemm_sass's count in the kernel's SASS (ptxas for sm_90, as
    runtime/gemm_resources specializes it; --no-sass skips).
Then the GPU soak's three GEMM reports (seed 26) through the fuzz checker, which judges
them against eager's own operands now: each should print "ok".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform

import torch
import triton

from fuser.fuzz.case import InputSpec
from fuser.fuzz.gemm import GemmCase
from fuser.fuzz.gemm_check import ACC_ULPS, EPS32, TC_STEP, check_gemm_case
from fuser.runtime.gemm import aten_gemm, gemm, plan_for, shape_of
from fuser.runtime.gemm_resources import plan_resources
from fuser.schedulers.gemm import GPU_TILES, Epilogue, GemmTiles, retile

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TILE = {f"{t.block_m}x{t.block_n}": t for t, _ in GPU_TILES}
# name: M, N, K, A as stored, the dot's dtype, A strided (every other column), epilogue,
# tiles (None: the planner's)
CONFIGS = {
    "soak_k4096_cast_scale_bias": (
        4096, 33, 4096, F32, F16, False, Epilogue("fp16", True, True), None
    ),
    "soak_k257_cast_strided": (1536, 3009, 257, F32, BF16, True, Epilogue("bf16"), None),
    **{
        f"cast_bf16_{name}": (4096, 4096, 4096, F32, BF16, False, Epilogue("bf16"), t)
        for name, t in TILE.items()
    },
    "scale_bf16_128x64": (
        4096, 4096, 4096, BF16, BF16, False, Epilogue(a_scale=True), TILE["128x64"]
    ),
    "fc_cast_bias_gelu_aux": (
        16384, 3072, 768, F32, BF16, False,
        Epilogue("bf16", bias=True, activation="gelu_tanh", aux=True), None,
    ),
}  # fmt: skip
SMOKE = {  # the interpreter's sizes: the script end to end, untimed
    "smoke_cast_scale_bias": (
        37, 33, 70, F32, F16, True, Epilogue("fp16", True, True), GemmTiles(32, 32, 32, 4, 4, 1)
    ),
}  # fmt: skip


def _spec(shape: tuple[int, ...], dtype: str, layout: str = "contiguous") -> InputSpec:
    return InputSpec(shape, dtype, layout)


# the soak's reports, as its repro scripts print them
SOAK = [
    GemmCase(
        ("x", "w", "b", "r1", "m2"),
        (
            _spec((2950, 33), "float32", "row_sliced"),
            _spec((4096, 33), "float16"),
            _spec((4096,), "float16", "strided"),
            _spec((2950, 4096), "float16"),
            _spec((2950, 4096), "float32"),
        ),
        (
            "y0 = F.linear(cast(x, 'float16'), w, b)",
            "y1 = y0 + r1",
            "y2 = y1 * (cast(m2 > 0.43, 'float16') * 1.25)",
            "y3 = torch.relu(y2)",
        ),
        ("y3",),
        1,
    ),
    GemmCase(
        ("x", "w"),
        (_spec((1536, 257), "float32", "strided"), _spec((257, 3009), "bfloat16", "strided")),
        ("y0 = (cast(x, 'bfloat16')) @ w",),
        ("y0",),
        0,
    ),
    GemmCase(
        ("x", "w", "b"),
        (_spec((4096, 4096), "float32"), _spec((33, 4096), "float16"), _spec((33,), "float16")),
        ("y0 = F.linear(cast(x, 'float16') * -1.5, w, b)", "y1 = y0 * 1.5"),
        ("y1",),
        374,
    ),
]


def _inputs(cfg: tuple, device: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    m, n, k, stored, dot, strided, e, _ = cfg
    g = torch.Generator(device=device).manual_seed(m + n + k)
    a = torch.randn(m, 2 * k if strided else k, device=device, generator=g)
    a = (a[:, ::2] if strided else a).to(stored)
    b = (torch.randn(k, n, device=device, generator=g) / math.sqrt(k)).to(dot)
    kw: dict = {"scale": -1.5} if e.a_scale else {}
    if e.bias:
        kw["bias"] = torch.randn(n, device=device, generator=g).to(dot)
    return a, b, kw


def _reference(a: torch.Tensor, b: torch.Tensor, e: Epilogue, kw: dict) -> tuple:
    """float64 outputs from the operand the prologue makes, and the accumulation bound."""
    op = a.to(b.dtype) if e.a_cast else a
    op = (op.float() * kw["scale"]).to(b.dtype) if e.a_scale else op
    a64, b64 = op.double(), b.double()
    plain = dataclasses.replace(e, a_cast="", a_scale=False)
    extra = {k: v.double() for k, v in kw.items() if k == "bias"}
    out, aux, _ = aten_gemm(a64, b64, plain, **extra)
    spread = torch.mm(a64 * a64, b64 * b64).sqrt() + torch.mm(a64, b64).abs()
    k = a.shape[1]
    # the GELU's slope is below 1.13: its output moves at most that much further
    bound = EPS32 * (ACC_ULPS * math.sqrt(k) + k / TC_STEP) * spread * 1.13
    return out, aux, bound


def _bad(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor) -> tuple[int, float]:
    allowed = bound + torch.finfo(got.dtype).eps / 2 * want.abs() + 1e-30
    ratio = (got.double() - want).abs() / allowed
    return int((ratio > 1).sum()), float(ratio.max())


def run_config(name: str, cfg: tuple, device: str, sass: bool) -> list[dict]:
    a, b, kw = _inputs(cfg, device)
    e, tiles = cfg[6], cfg[7]
    plan = plan_for(shape_of(a, b, e, None, *kw.values()), e)
    plan = retile(plan, tiles, "as configured") if tiles is not None else plan
    want, want_aux, bound = _reference(a, b, e, kw)
    variants = [dataclasses.replace(plan, swap_ab=s) for s in (False, True)]
    hazards = plan_resources(variants, 90) if sass else [{}, {}]
    m, n, k = a.shape[0], b.shape[1], a.shape[1]
    rows = []
    for p, res in zip(variants, hazards, strict=True):
        outs = [gemm(a, b, e, plan=p, **kw) for _ in range(5)]
        out, aux, _ = outs[0]
        bad, worst = _bad(out, want, bound)
        if aux is not None:
            bad_aux, worst_aux = _bad(aux, want_aux, bound / 1.13)
            bad, worst = bad + bad_aux, max(worst, worst_aux)
        repeat = all(torch.equal(o[0], out) for o in outs[1:])
        row = {"config": name, "swap_ab": p.swap_ab, "tiles": p.tiles.line(), "bad": bad}
        row |= {"worst_ratio": round(worst, 3), "repeat": repeat, "elements": out.numel()}
        row |= {k2: res.get(k2) for k2 in ("hgmma_register_a", "hgmma_hazards", "registers")}
        if device == "cuda":
            ms = triton.testing.do_bench(lambda p=p: gemm(a, b, e, plan=p, **kw))
            row |= {"ms": round(ms, 4), "tflops": round(2 * m * n * k / ms / 1e9, 1)}
        rows.append(row)
    if device == "cuda":
        ms = triton.testing.do_bench(lambda: aten_gemm(a, b, e, **kw))
        rows.append({"config": name, "impl": "cublas+eager", "ms": round(ms, 4)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="a JSON file for the rows")
    ap.add_argument("--no-sass", action="store_true", help="skip the sm_90 SASS hazard count")
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreted, tiny sizes")
    args = ap.parse_args()
    device = "cpu" if args.smoke else "cuda"
    configs = SMOKE if args.smoke else CONFIGS
    rows = []
    for name, cfg in configs.items():
        for row in run_config(name, cfg, device, sass=not (args.no_sass or args.smoke)):
            print(json.dumps(row))
            rows.append(row)
    soak = [] if args.smoke else [check_gemm_case(c, device, runs=2) for c in SOAK]
    for case, res in zip(SOAK, soak):
        print(f"soak {case.summary()[:90]}...: {res.status} {res.problems[:1]}")
    if args.out:
        meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
        meta |= {"torch": torch.__version__, "triton": triton.__version__}
        meta |= {"ptxas": triton.knobs.nvidia.ptxas.version, "host": platform.node()}
        soak_rows = [{"status": r.status, "problems": r.problems} for r in soak]
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "soak": soak_rows}, f, indent=1)


if __name__ == "__main__":
    main()
