"""Hypothesis strategies for random valid fusions (`fuzz_cases(profile)`).

A case lives in a domain D = [rows..., cols]. Every value it computes maps onto D's
axes (`_V.axes`): full tiles, row statistics, column vectors, scalars. Ops are drawn
as small patterns over the values made so far (chains, and DAGs where an older value
is picked again): unary, binary with tensors or Python scalars, comparisons feeding
where(), casts and cast round trips, reductions over the last dim, the leading dims,
all dims or one odd dim, normalization-like reduce -> broadcast back -> combine, and
the composites (softmax, layer_norm, rms_norm, var_mean, gelu), each group's ops as the
frontend op table (fuser/frontend/registry.py) lists them, and slices, pads and cats that
keep a value's width (a rotary embedding's rotate_half, its backward's pads; the inputs
of such a case are static along the dims they need). An operand whose domain the
table restricts (log's, sqrt's, a divisor, pow's) gets abs(x) + c, so a NaN in the
result always comes from a NaN or inf in the data.

Choices are ordered simplest first, so shrinking moves toward small, short, float32,
contiguous cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from fuser.fuzz.case import FuzzCase
from fuser.fuzz.patterns import FLOATS, PATTERN_FNS, Draft

SMALL_COLS = (1, 2, 3, 7, 8, 16, 31, 32, 33, 64, 65, 100, 127, 128, 129, 255, 256, 257)
MID_COLS = (511, 512, 768, 1000, 1024, 1600, 2048, 2049, 4096)
LONG_COLS = (5140, 8192, 12288, 20480, 50257)
ROWS = (1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 100, 128, 255, 256, 1000, 1024, 4096)
PATTERNS = (
    "skip",  # first, so that shrinking turns a pattern the failure does not need into nothing
    "unary",
    "binary",
    "binary_scalar",
    "norm",
    "inner_outer",
    "reduce",
    "where",
    "cast",
    "binary_input",
    "composite",
    "older",
    "logical",
    "layout",
)


@dataclass(frozen=True)
class Profile:
    """Size limits: Triton's CPU interpreter is slow per row, a GPU is not."""

    name: str
    max_ops: int
    # largest domain (elements) for short and for long rows
    max_elems: int
    max_long_rows: int
    # percent of cases with mid-length and long rows (5140 .. 50257)
    mid_pct: int
    long_pct: int
    # the interpreter runs a kernel's programs one after the other: few rows on CPU
    max_rows: int = 1 << 16
    max_rank: int = 3
    # percent of a run's cases that are GEMM + pointwise cases (fuzz/gemm.py) where the
    # run's backends include Triton (the one with a GEMM template)
    gemm_pct: int = 0
    # percent of domains whose element count is a multiple of 1024 with rows that are not
    # (16 x 64): where contiguous pointwise kernels run flattened (runtime/specs.py)
    flat_pct: int = 10
    # a pattern drawn as often as all the others together (`--focus`), for a campaign
    # on what it reaches
    focus: str | None = None


CPU = Profile(
    "cpu", 7, max_elems=4096, max_long_rows=2, mid_pct=15, long_pct=5, max_rows=200, gemm_pct=10
)
GPU = Profile("gpu", 14, max_elems=1 << 22, max_long_rows=256, mid_pct=30, long_pct=20, gemm_pct=10)


# -- domains ----------------------------------------------------------------------------
@st.composite
def domains(draw: Any, profile: Profile) -> tuple[int, ...]:
    """[rows..., cols]: odd sizes and size-1 axes, rows that fit in registers and rows
    that do not (a few long ones, with few rows on the interpreter)."""
    rank = draw(st.sampled_from((2, 1, 3)[: max(1, min(3, profile.max_rank))]))
    bucket = draw(st.integers(0, 99))
    if bucket < 100 - profile.mid_pct - profile.long_pct - profile.flat_pct:
        cols = draw(st.sampled_from(SMALL_COLS) | st.integers(1, 300))
    elif bucket < 100 - profile.mid_pct - profile.long_pct:
        return draw(flat_domains(profile, rank))
    elif bucket < 100 - profile.long_pct:
        cols = draw(st.sampled_from(MID_COLS))
    else:
        cols = draw(st.sampled_from(LONG_COLS))
    if rank == 1:
        return (cols,)
    budget = max(1, profile.max_elems // cols) if cols < 5000 else profile.max_long_rows
    budget = min(budget, profile.max_rows)
    rows = draw(st.sampled_from([r for r in ROWS if r <= budget]) | st.integers(1, budget))
    if rank == 2:
        return (rows, cols)
    lead = draw(st.sampled_from((1, 2, 3, 7)))
    if rows % lead == 0:
        return (lead, rows // lead, cols)
    return (1, rows, cols) if draw(st.booleans()) else (rows, 1, cols)


# widths of domains whose element count is a multiple of 1024 (with the rows that make it
# so): powers of two below it and a few that are not (96 x 32 = 3 x 1024)
FLAT_COLS = (64, 128, 32, 256, 16, 96, 512, 8, 192, 1024, 48, 2048, 4)


@st.composite
def flat_domains(draw: Any, profile: Profile, rank: int) -> tuple[int, ...]:
    """A domain of k * 1024 elements (k * 1024 / cols rows) within the profile's sizes:
    the flattening threshold of contiguous pointwise kernels (runtime/specs.py)."""
    fits = [c for c in FLAT_COLS if 1024 // math.gcd(c, 1024) <= profile.max_rows]
    cols = draw(st.sampled_from(fits))
    if rank == 1:
        return (cols * (1024 // math.gcd(cols, 1024)),)
    step = 1024 // math.gcd(cols, 1024)  # rows come in multiples of this
    most = max(1, min(profile.max_rows, max(profile.max_elems, 1024) // cols) // step)
    rows = step * draw(st.integers(1, most))
    if rank == 2:
        return (rows, cols)
    lead = draw(st.sampled_from((1, 2, 4, 8)))
    return (lead, rows // lead, cols) if rows % lead == 0 else (rows, 1, cols)


@st.composite
def fuzz_cases(
    draw: Any, profile: Profile = CPU, backends: tuple[str, ...] = ("triton",)
) -> FuzzCase:
    """A random valid fusion, its inputs' layouts and its data, and the backend (one of
    `backends`, shrinking toward the first) fuser runs it with."""
    domain = draw(domains(profile))
    d = Draft(draw, domain)
    d.new_input(d.full(), draw(st.sampled_from(FLOATS)))
    patterns = PATTERNS
    if profile.focus is not None:  # as often as the others together
        patterns = PATTERNS + (profile.focus,) * (len(PATTERNS) - 1)
    for _ in range(draw(st.integers(1, profile.max_ops))):
        PATTERN_FNS[draw(st.sampled_from(patterns))](d)
    if all(v.is_input for v in d.vals):
        PATTERN_FNS["unary"](d)
    computed = [i for i, v in enumerate(d.vals) if not v.is_input]
    outputs = [computed[-1]]
    for i in computed[:-1]:
        if draw(st.integers(0, 4)) == 4:  # shrinks toward fewer outputs
            outputs.append(i)
    specials = draw(st.sampled_from(("none",) * 12 + ("nan", "inf", "nan_inf")))
    return FuzzCase(
        domain=domain,
        inputs=tuple(d.inputs),
        steps=tuple(d.steps),
        outputs=tuple(sorted(set(outputs))),
        data_seed=draw(st.integers(0, 2**20)),
        scale=draw(st.sampled_from((1.0, 3.0, 0.1, 30.0, 1000.0))),
        specials=specials,
        backend=draw(st.sampled_from(backends)),
    )


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)
