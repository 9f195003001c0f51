"""The GEMM template's register-operand hazard on sm_90, and the transposed dot that
avoids it (schedulers/gemm.SWAP_PROLOGUE_AB).

A tile of A changed in registers (the prologue's cast or scale) is a register operand of
Hopper's wgmma, which Triton 3.6 pipelines 3 deep; the ptxas it ships (CUDA 12.8, fixed in
13.3: Triton issue 9433) rewrites those registers for the next K step before the wgmma
reading them is waited for. Found in the SASS of the plans the GPU soak of seed 26 ran
(no wrong result traced to it yet, but the program is undefined). With the dot computed
as Cᵀ = Bᵀ·Aᵀ the prologue's tile is wgmma's shared-memory operand. Checked with no GPU:
ptxas for sm_90 and the SASS walked by runtime/gemm_sass.py; the transposed rendering's
results in Triton's interpreter."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

from fuser.runtime import gemm_sass
from fuser.runtime.gemm import gemm, plan_for, shape_of, source_of
from fuser.runtime.gemm_resources import plan_resources
from fuser.schedulers.gemm import Epilogue, GemmShape, GemmTiles, plan_gemm, retile


def _sass(*lines: str) -> str:
    """SASS as cuobjdump prints it, one instruction every 16 bytes."""
    return "\n".join(
        f"        /*{16 * i:04x}*/                   {x} ;" for i, x in enumerate(lines)
    )


# a K loop (0x10-0x50) with a register-A wgmma left in flight over the back edge
LOOP = [
    "MOV R1, c[0x0][0x28]",
    "LDS.128 R60, [R2]",
    "WARPGROUP.ARRIVE",
    "HGMMA.64x64x16.F32.BF16 R24, R60, gdesc[UR4], R24, gsb0",
    "WARPGROUP.DEPBAR.LE gsb0, 0x1",
    "@P0 BRA 0x10",
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",
    "STG.E [R4.64], R24",
    "EXIT",
]


def _with(**at: str) -> str:
    """LOOP with the instructions at the given addresses replaced (`x40="NOP"`)."""
    lines = list(LOOP)
    for addr, text in at.items():
        lines[int(addr[1:], 16) // 16] = text
    return _sass(*lines)


def test_hazards_in_a_pipelined_register_a_loop() -> None:
    """The next step's load rewrites the in-flight wgmma's A fragment (R60-R63); waited
    each step, nothing; the accumulator read with the wgmma in flight is one too; an A
    from shared memory (a descriptor) has no registers to rewrite."""
    (hit,) = gemm_sass.hazards(_sass(*LOOP))
    assert "HGMMA" in hit and "<-  /*0010*/ LDS.128 R60" in hit and "(R60, R61, R62, R63)" in hit
    assert gemm_sass.register_a(_sass(*LOOP)) == 1
    assert gemm_sass.hazards(_with(x40="WARPGROUP.DEPBAR.LE gsb0, 0x0")) == []
    (read,) = gemm_sass.hazards(_with(x50="NOP", x60="NOP"))  # one pass, no final wait
    assert "<-  /*0070*/ STG.E [R4.64], R24" in read and "(R24)" in read
    shared = _with(x30="HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], gdesc[UR4], R24, gsb0")
    assert gemm_sass.hazards(shared) == [] and gemm_sass.register_a(shared) == 0


def _gpu_plans() -> list:
    """The soak's K=4096 linear (fp32 x cast to fp16 and scaled: 64x64 tiles), an fp32
    activation cast to bf16 (128x128) and a bf16 one scaled (128x64), as planned for an
    H100 (the tiles forced where the shape would pick others)."""
    k4096 = GemmShape(4096, 33, 4096, "fp16", "fp32", "fp16", "cuda")
    square = GemmShape(4096, 4096, 4096, "bf16", "fp32", "bf16", "cuda")
    plans = [plan_gemm(k4096, Epilogue(a_cast="fp16", a_scale=True, bias=True))]
    for shape, e, tiles in (
        (square, Epilogue(a_cast="bf16"), GemmTiles(128, 128, 64, 8, 8, 4)),
        (
            dataclasses.replace(square, a_dtype="bf16"),
            Epilogue(a_scale=True),
            GemmTiles(128, 64, 64, 8, 4, 4),
        ),
    ):
        plans.append(retile(plan_gemm(shape, e), tiles, "as an H100 plan may"))
    return plans


@pytest.mark.slow
def test_prologue_plans_read_a_from_shared_memory_on_sm90() -> None:
    plans = _gpu_plans()
    assert all(p.swap_ab for p in plans)
    assert "the dot transposed" in str(plans[0].explain())
    before = [dataclasses.replace(p, swap_ab=False) for p in plans[1:]]
    results = plan_resources(plans + before, 90)
    for plan, res in zip(plans, results[: len(plans)], strict=True):
        assert res["hgmma"] and res["hgmma_register_a"] == 0, (plan.name, res)
        assert res["hgmma_hazards"] == 0 and res["stack"] + res["local"] == 0, (plan.name, res)
    ptxas = tuple(int(x) for x in triton.knobs.nvidia.ptxas.version.split(".")[:2])
    for plan, res in zip(before, results[len(plans) :], strict=True):
        assert res["hgmma_register_a"] > 0, (plan.name, res)
        if ptxas < (13, 3):  # the ptxas Triton ships: the hazard (Triton issue 9433)
            assert res["hgmma_hazards"] > 0, (plan.name, res)


CASES = [  # (M, N, K, A as stored -> the dot's dtype, epilogue, split-K)
    (
        37,
        45,
        70,
        torch.float32,
        torch.bfloat16,
        Epilogue(
            a_cast="bf16", a_scale=True, bias=True, activation="gelu_tanh", aux=True, residual=True
        ),
        1,
    ),
    (
        45,
        19,
        101,
        torch.float32,
        torch.float16,
        Epilogue(a_cast="fp16", gelu_grad="gelu", reduce="b_cols"),
        3,
    ),
    (1, 45, 29, torch.bfloat16, torch.bfloat16, Epilogue(a_scale=True, reduce="a_rows"), 1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}_{c[5].tag()}_sk{c[6]}")
def test_the_transposed_dot_in_the_interpreter(case) -> None:
    """The swapped rendering, forced on the CPU's plans, against float64 from the same
    rounded operands: odd sizes, a strided A, K tails, split-K, both sums."""
    m, n, k, stored, dot, e, split = case
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, 2 * k, generator=g).to(stored)[:, ::2]  # strided, read in place
    b = (torch.randn(n, k, generator=g) / k**0.5).to(dot).t()
    kw: dict = {"scale": 0.37} if e.a_scale else {}
    if e.bias:
        kw["bias"] = torch.randn(n, generator=g).to(dot)
    if e.residual:
        kw["residual"] = torch.randn(m, n, generator=g).to(dot)
    if e.gelu_grad != "none":
        kw["pre"] = torch.randn(m, n, generator=g).to(dot)
    plan = plan_for(shape_of(a, b, e, None, *kw.values()), e)
    if split > 1:
        plan = retile(plan, dataclasses.replace(plan.tiles, split_k=split), "split")
    swapped = dataclasses.replace(plan, swap_ab=True)
    assert "tl.trans(acc)" in source_of(swapped) and "tl.trans" not in source_of(plan)
    out, aux, sums = gemm(a, b, e, plan=swapped, **kw)
    ref_out, ref_aux, ref_sums = gemm(a, b, e, plan=plan, **kw)  # the plain dot
    # float64 from the operand the prologue makes (cast, then scale, each rounded)
    op = a.to(dot) if e.a_cast else a
    op = (op.float() * kw["scale"]).to(dot) if e.a_scale else op
    exact = op.double() @ b.double()
    if e.bias:
        exact = exact + kw["bias"].double()
    tol = {"atol": 2e-2, "rtol": 2e-2} if dot == torch.bfloat16 else {"atol": 4e-3, "rtol": 4e-3}
    if e.aux:
        torch.testing.assert_close(aux.double(), exact.to(dot).double(), **tol)
    torch.testing.assert_close(out.double(), ref_out.double(), **tol)
    assert (out != ref_out).float().mean() < 0.02  # at most a rounding boundary flipped
    if e.reduce != "none":
        assert torch.equal(sums, ref_sums)  # the sums never go through the dot
    if e.activation == "none" and e.gelu_grad == "none" and not e.residual:
        torch.testing.assert_close(out.double(), exact, **tol)
