"""Registers, spills and shared memory of a GEMM template plan compiled for a GPU
architecture, with no GPU: Triton compiles the rendered kernel for sm_90, cuobjdump reads
the cubin (runtime/resources.py does the same for the fused kernels).

The compile takes the specializations Triton's launcher makes for the layouts the
template meets in a model: unit strides where operands are row-major (A column-major
when the plan sums A's rows: the bias gradient's dYᵀ), 16-divisible sizes, strides and
pointers. A process that has run Triton's interpreter compiles in a child process (the
interpreter's patches of triton.language broke later compiles of its jit helpers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

from fuser.codegen.triton.gemm import render_gemm
from fuser.config import use_interpreter
from fuser.errors import CompileError
from fuser.runtime import gemm_sass
from fuser.runtime.resources import cubin_resources, sass
from fuser.schedulers.gemm import Epilogue, GemmPlan, GemmShape, GemmTiles, plan_gemm, retile

_UNIT = {"s_bn", "s_cn", "s_xn", "s_pn", "s_rn", "s_bias", "s_sum"}


def plan_resources(plans: list[GemmPlan], arch: int = 90) -> list[dict[str, int]]:
    """{"registers", "stack", "local", "shared", "hgmma", "hgmma_register_a",
    "hgmma_hazards"} of each plan's main kernel for sm_`arch`, and a split-K plan's
    finalize's as "finalize_registers"... (one child process for all of them where one is
    needed)."""
    if use_interpreter():
        return _in_child(plans, arch)
    return [_compile(p, arch) for p in plans]


def _compile(plan: GemmPlan, arch: int) -> dict[str, int]:
    """The main kernel's figures; with split-K the finalize's as "finalize_<figure>"."""
    import importlib.util
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{plan.name}.py"
        path.write_text(render_gemm(plan))
        spec = importlib.util.spec_from_file_location(f"_res_{plan.name}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        found = _compile_fn(plan, getattr(mod, plan.name), arch, main=True)
        if plan.split:
            fin = _compile_fn(plan, getattr(mod, plan.name + "_finalize"), arch, main=False)
            found |= {f"finalize_{k}": v for k, v in fin.items() if not k.startswith("hgmma")}
        return found


def _compile_fn(plan: GemmPlan, fn: Any, arch: int, main: bool) -> dict[str, int]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t = plan.tiles
    known = {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_K": t.block_k}
    known |= {"GROUP_M": t.group_m, "SPLIT_K": t.split_k}
    consts: dict[str, Any] = {a: known[a] for a in fn.arg_names if a in known}
    unit = _UNIT | ({"s_am"} if plan.epilogue.reduce == "a_rows" else {"s_ak"})
    tensors = set(plan.arguments()) | set(plan.finalize_arguments())
    s = plan.shape
    dtypes = {"A": s.a_dtype, "C": s.out_dtype}
    dtypes["SUMS"] = s.a_dtype if plan.epilogue.reduce == "a_rows" else s.dtype
    sig: dict[str, str] = {}
    for a in fn.arg_names:
        if a in consts:
            sig[a] = "constexpr"
        elif a in unit:
            sig[a], consts[a] = "constexpr", 1
        elif a in ("scale", "mask_scale"):
            sig[a] = "fp32"
        elif a == "MASK":  # dropout's saved mask, bool as it saves it
            sig[a] = "*i1"
        elif a in ("PART", "PSUMS"):  # split-K's fp32 partials
            sig[a] = "*fp32"
        elif a in tensors:  # A as stored (a prologue casts it), C in the output dtype
            sig[a] = f"*{dtypes.get(a, plan.shape.dtype)}"
        else:
            sig[a] = "i32"
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, a in enumerate(fn.arg_names)
        if sig[a] == "i32" or "*" in sig[a]
    }
    opts = {"num_warps": t.num_warps, "num_stages": t.num_stages if main else 1}
    compiled = triton.compile(
        ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", arch, 32), options=opts
    )
    cubin = compiled.asm["cubin"]
    found = dict(next(iter(cubin_resources(cubin).values())))
    # tl.dot on sm_90 should be Hopper's warpgroup MMA (HGMMA in SASS), not mma.sync; how
    # many of them read A from registers, and the register hazards around them (gemm_sass)
    code = sass(cubin) if arch >= 90 and main else ""
    found["hgmma"] = int("HGMMA" in code)
    found["hgmma_register_a"] = gemm_sass.register_a(code)
    found["hgmma_hazards"] = len(gemm_sass.hazards(code))
    return found


def _in_child(plans: list[GemmPlan], arch: int) -> list[dict[str, int]]:
    jobs = [
        {
            "shape": dataclasses.asdict(p.shape),
            "epilogue": dataclasses.asdict(p.epilogue),
            "tiles": dataclasses.asdict(p.tiles),
            "swap_ab": p.swap_ab,
        }
        for p in plans
    ]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "fuser.runtime.gemm_resources"],
        input=json.dumps({"arch": arch, "plans": jobs}),
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        names = ", ".join(p.name for p in plans)
        raise CompileError(f"compiling {names} for sm_{arch} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _main() -> None:
    work = json.loads(sys.stdin.read())
    out = []
    for job in work["plans"]:
        shape, epilogue = GemmShape(**job["shape"]), Epilogue(**job["epilogue"])
        plan = retile(plan_gemm(shape, epilogue), GemmTiles(**job["tiles"]), "as given")
        plan = dataclasses.replace(plan, swap_ab=job["swap_ab"])
        out.append(_compile(plan, work["arch"]))
    print(json.dumps(out))


if __name__ == "__main__":
    _main()
