"""GEMM + pointwise fuzz cases: a matmul with random work around it, through the GEMM
template (dynamo/gemm.py's matcher and runtime/gemm.py's kernels) against eager.

A case is a small torch function, kept as source lines (the repro prints them), over
inputs in random layouts: one matmul in one of the forms a training graph hands over

    linear     F.linear(x, w, b)            addmm(b, x, wᵀ), 2-D or [B, T, K] rows
    mm         x @ w
    full_bias  torch.addmm(r, x, w)         an [M, N] bias: a residual
    dx         dy @ w                       a backward dX (a GELU backward may follow)
    dw         dyᵀ @ x, dy.sum(0)           a backward dW with the bias gradient
    colsum     x @ w, w.sum(0)              a sum of B over K beside the matmul

with a prologue on A (a cast, a scale by a Python number, both) and a chain of up to
four ops after it, drawn in any order: GELU (erf or tanh), the GELU backward with a
pre-activation input, a residual add, a cast, a mask times a scale (dropout's backward:
y * (mask.to(y.dtype) * 1.25) with a bool mask), and ops the template does not take
(relu, a scale), any intermediate also returned. The matcher takes what it can and must leave
the rest as it was. The function is traced with make_fx on the case's inputs (their
strides kept), lowered with FUSER_GEMM=template, run, and compared with eager run on the
same inputs and with the same function in float64 from eager's own matmul operands (every
other cast a no-op there): fuser may be off that answer by twice eager's own error, how
far the case's roundings and the fp32 accumulations move it, and the output's rounding
(gemm_check.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from fuser.fuzz.case import LAYOUTS, InputSpec, make_input
from fuser.fuzz.generator import Profile, fuzz_cases

FORMS = ("linear", "mm", "full_bias", "dx", "dw", "colsum")
PROLOGUES = ("none", "cast", "scale", "cast_scale")
CHAIN = ("gelu", "gelu_tanh", "dgelu", "dgelu_tanh", "residual", "cast", "mask", "relu", "scale")
FLOATS = ("float32", "bfloat16", "float16")
# matmul extents: odd ones around the CPU interpreter's 32-wide tiles, and the GPU's
# 64..256-wide tiles with K long enough for split-K
CPU_DIMS = (1, 2, 3, 7, 16, 17, 31, 32, 33, 45, 64, 65, 100)
GPU_DIMS = (1, 7, 33, 64, 127, 128, 129, 255, 256, 257, 768, 1000, 2048, 4096)
CPU_BUDGET = 150_000  # M*N*K: a case in well under a second of interpreted tiles
GPU_BUDGET = 2**31


@dataclass(frozen=True)
class GemmCase:
    """A torch function (`lines`, reading `names`, returning `outputs`) and its inputs."""

    names: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    lines: tuple[str, ...]
    outputs: tuple[str, ...]
    data_seed: int = 0
    backend: str = "triton"
    # > 1: the template calls' plans split K this many ways (the CPU planner never
    # splits; a GPU's planner does where its estimate says so)
    split_k: int = 1
    notes: tuple[str, ...] = field(default=(), compare=False)

    def size(self) -> tuple[int, int, int]:
        return (len(self.lines), sum(math.prod(i.shape) for i in self.inputs), len(self.inputs))

    def summary(self) -> str:
        ins = ", ".join(
            f"{n}: {i.dtype}{list(i.shape)}:{i.layout}" for n, i in zip(self.names, self.inputs)
        )
        split = f"; split-K {self.split_k}" if self.split_k > 1 else ""
        return (
            f"GEMM case; inputs {ins}; {' | '.join(self.lines)}; data seed {self.data_seed}{split}"
        )

    def source(self) -> str:
        """The case as a Python function (`cast(t, dtype)` for every dtype change)."""
        body = [f"    {line}" for line in self.lines]
        body.append(f"    return ({', '.join(self.outputs)},)")
        return f"def f({', '.join(self.names)}):\n" + "\n".join(body) + "\n"


def _namespace(float64: bool) -> dict[str, Any]:
    """What the case's source reads: torch, F, aten and `cast` (in float64 a copy: an op
    a perturbed run moves as the cast's rounding would, gemm_check.py)."""

    def cast(t: torch.Tensor, dtype: str) -> torch.Tensor:
        return t.clone() if float64 else t.to(getattr(torch, dtype))

    return {
        "torch": torch,
        "F": torch.nn.functional,
        "aten": torch.ops.aten,
        "cast": cast,
    }


def function(case: GemmCase, float64: bool = False) -> Any:
    ns = _namespace(float64)
    exec(compile(case.source(), "<gemm fuzz case>", "exec"), ns)
    return ns["f"]


def make_inputs(case: GemmCase, device: str = "cpu") -> list[torch.Tensor]:
    return [
        make_input(spec, case.data_seed * 1009 + i, 1.0, "none", device)
        for i, spec in enumerate(case.inputs)
    ]


# -- drawing ----------------------------------------------------------------------------
class _Draft:
    def __init__(self, draw: Any, profile_name: str):
        self.draw = draw
        self.gpu = profile_name == "gpu"
        self.names: list[str] = []
        self.inputs: list[InputSpec] = []
        self.lines: list[str] = []
        self.outputs: list[str] = []

    def input(self, name: str, shape: tuple[int, ...], dtype: str, layout: str = "") -> str:
        layout = layout or self.draw(st.sampled_from(LAYOUTS[:1] * 4 + LAYOUTS[1:]))
        self.names.append(name)
        self.inputs.append(InputSpec(tuple(shape), dtype, layout))
        return name

    def other_float(self, dtype: str) -> str:
        return self.draw(st.sampled_from([d for d in FLOATS if d != dtype]))


def _dims(draw: Any, profile_name: str) -> tuple[int, int, int]:
    dims, budget = (GPU_DIMS, GPU_BUDGET) if profile_name == "gpu" else (CPU_DIMS, CPU_BUDGET)
    m, n, k = (draw(st.sampled_from(dims) | st.integers(1, dims[-1])) for _ in range(3))
    while m * n * k > budget:  # shrink the largest until it fits
        if m >= n and m >= k:
            m = max(1, m // 2)
        elif n >= k:
            n = max(1, n // 2)
        else:
            k = max(1, k // 2)
    return m, n, k


def _prologue(d: _Draft, x: str, dtype: str) -> tuple[str, str]:
    """A's dtype as stored, and the expression the matmul reads."""
    kind = d.draw(st.sampled_from(PROLOGUES[:1] + PROLOGUES))  # none twice as often
    stored = d.other_float(dtype) if "cast" in kind else dtype
    expr = f"cast({x}, {dtype!r})" if "cast" in kind else x
    if "scale" in kind:
        expr = f"{expr} * {d.draw(st.sampled_from((0.37, 2.0, -1.5)))}"
    return stored, expr


def _matmul(d: _Draft, form: str, m: int, n: int, k: int, dtype: str) -> tuple[int, ...]:
    """Inputs and the line `y0 = ...` of the form's matmul; y0's shape."""
    if form in ("dw", "colsum"):
        if form == "dw":  # dy [K, M] (K = the batch rows), x [K, N]
            d.input("dy", (k, m), dtype)
            d.input("x", (k, n), dtype)
            d.lines += ["y0 = dy.t() @ x", "db = dy.sum(0)"]
        else:
            d.input("x", (m, k), dtype)
            d.input("w", (k, n), dtype)
            d.lines += ["y0 = x @ w", "db = w.sum(0)"]
        d.outputs.append("db")
        return (m, n)
    lead = d.draw(st.sampled_from((1, 1, 2, 3))) if form == "linear" else 1
    lead = lead if m % lead == 0 else 1
    rows = (lead, m // lead) if lead > 1 else (m,)
    a = "dy" if form == "dx" else "x"
    stored, expr = _prologue(d, a, dtype)
    d.input(a, (*rows, k), stored)
    if form == "linear":
        d.input("w", (n, k), dtype)
        d.input("b", (n,), dtype)
        d.lines.append(f"y0 = F.linear({expr}, w, b)")
    elif form == "full_bias":
        d.input("w", (k, n), dtype)
        d.input("r0", (m, n), dtype)
        d.lines.append(f"y0 = torch.addmm(r0, {expr}, w)")
    else:
        d.input("w", (k, n), dtype)
        d.lines.append(f"y0 = ({expr}) @ w")
    return (*rows, n)


def _chain(d: _Draft, shape: tuple[int, ...], dtype: str, form: str) -> None:
    ops = list(d.draw(st.lists(st.sampled_from(CHAIN), max_size=4)))
    if form == "dx" and d.draw(st.booleans()):
        ops.insert(0, d.draw(st.sampled_from(("dgelu", "dgelu_tanh"))))
    cur = "y0"
    for i, op in enumerate(ops, 1):
        new = f"y{i}"
        if op in ("gelu", "gelu_tanh"):
            approx = ', approximate="tanh"' if op == "gelu_tanh" else ""
            d.lines.append(f"{new} = F.gelu({cur}{approx})")
        elif op in ("dgelu", "dgelu_tanh"):
            pre = d.input(f"pre{i}", shape, dtype)
            approx = "tanh" if op == "dgelu_tanh" else "none"
            d.lines.append(f"{new} = aten.gelu_backward({cur}, {pre}, approximate={approx!r})")
        elif op == "residual":
            r = d.input(f"r{i}", shape, dtype)
            sides = (cur, r) if d.draw(st.booleans()) else (r, cur)
            d.lines.append(f"{new} = {sides[0]} + {sides[1]}")
        elif op == "cast":
            dtype = d.other_float(dtype)
            d.lines.append(f"{new} = cast({cur}, {dtype!r})")
        elif op == "mask":  # a bool mask, a third of it False, as dropout saves it
            m = d.input(f"m{i}", shape, "float32")
            d.lines.append(f"{new} = {cur} * (cast({m} > 0.43, {dtype!r}) * 1.25)")
        elif op == "relu":
            d.lines.append(f"{new} = torch.relu({cur})")
        else:
            d.lines.append(f"{new} = {cur} * 1.5")
        if d.draw(st.integers(0, 4)) == 4:  # also returned: the matcher must keep it
            d.outputs.append(cur)
        cur = new
    d.outputs.insert(0, cur)


@st.composite
def gemm_cases(draw: Any, profile_name: str = "cpu", backend: str = "triton") -> GemmCase:
    """A random GEMM + pointwise case (sizes for the CPU interpreter or a GPU)."""
    m, n, k = _dims(draw, profile_name)
    floats = ("bfloat16", "float16", "float32") if profile_name == "gpu" else FLOATS
    dtype = draw(st.sampled_from(floats))
    form = draw(st.sampled_from(FORMS))
    d = _Draft(draw, profile_name)
    shape = _matmul(d, form, m, n, k, dtype)
    _chain(d, shape, dtype, form)
    return GemmCase(
        tuple(d.names),
        tuple(d.inputs),
        tuple(d.lines),
        tuple(dict.fromkeys(d.outputs)),
        data_seed=draw(st.integers(0, 2**20)),
        backend=backend,
        split_k=1 if profile_name == "gpu" else draw(st.sampled_from((1, 1, 2, 3))),
    )


def any_cases(profile: Profile, backends: tuple[str, ...] = ("triton",)) -> Any:
    """The runner's cases: `profile.gemm_pct` percent GEMM cases (on Triton, where the
    backends include it), the rest fuzz_cases' fusions."""
    fusions = fuzz_cases(profile, backends)
    if not profile.gemm_pct or "triton" not in backends:
        return fusions
    gemms = gemm_cases(profile.name, "triton")
    cut = 100 - profile.gemm_pct  # fusions below it: shrinking keeps to them
    return st.integers(0, 99).flatmap(lambda b: fusions if b < cut else gemms)
