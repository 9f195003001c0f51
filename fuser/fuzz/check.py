"""Run a fusion with fuser and with ATen, and judge the difference.

Fuser follows eager's roundings op by op (half ops compute in float32 and round to half
after every op, reductions accumulate in float32), so each output is compared with
eager ATen (`reference`, as `fd.reference`) within:

- the output dtype's own precision, grown with the reduction length
  (`fuser.ir.evaluate.tolerance`; one ulp relative for half and bfloat16);
- 3x eager's own error against the nearest float64 answer: where an op's float32 result
  sits near a half rounding boundary, fuser's (GPU) exp or division may round to the
  other neighbour, a flip worth about twice eager's rounding error there, then amplified;
- the output's sensitivity to small errors in every intermediate: the float64
  evaluation rerun six times (all up, all down, four random mixes) with every op's
  result moved by +-16 float32 eps (+-2 eps for half ops), on the definition and on the
  decomposed graph fuser compiles. A GPU's approximate exp/log/rsqrt/division are off by
  a few float32 ulps; where later ops amplify that (cancellation, x - mean of a constant
  row, sin of a large argument, a floor at its threshold) the perturbed runs move by as
  much, and only there. They keep every comparison as the float64 run decides it.

A comparison is a discontinuity, judged apart: where its operands lie within their own
spread (from the perturbed runs) of each other, it may go either way, and the graph is
run again with all such comparisons turned (`flip_uncertain`). Fuser may match that
answer (or the decomposed graph's own float64 answer) within its own spread, but not
anything between two branches.

Fuser may also match the correctly rounded op-by-op answer where eager does not. NaN and
infinity must sit where eager (or the float64 evaluation, or a perturbed run, or another
branch) has them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fuser.frontend.fusion_definition import FusionDefinition
from fuser.fuzz.reference import Flips, Operands, flip_uncertain, held, reference, widen_spread
from fuser.ir.dtypes import DType
from fuser.ir.evaluate import tolerance
from fuser.ir.graph import Graph
from fuser.ir.ops import COMPOSITE, REDUCE, Op
from fuser.passes import run_pipeline

CHAOTIC_FRACTION = 0.25
EAGER_ERROR_FACTOR = 3.0
FLIPPED_RUNS = 3  # perturbed runs (all up, all down, a mix) with comparisons flipped
MAX_REPORTED = 3  # worst elements shown per output


# -- tolerance ------------------------------------------------------------------------
def reduction_lengths(graph: Graph) -> dict[int, int]:
    """For every value of a concrete graph: how many input elements feed one element."""
    n: dict[int, int] = {v.id: 1 for v in graph.inputs}
    for node in graph.nodes:
        base = max((n[v.id] for v in node.inputs), default=1)
        if node.op in REDUCE or node.op in (Op.MEAN, Op.VAR_MEAN):
            x = node.inputs[0]
            base *= math.prod(int(x.shape[d]) for d in node.attr("dims")) if x.rank else 1
        elif node.op in COMPOSITE and node.inputs[0].rank:
            base *= int(node.inputs[0].shape[-1])
        for v in node.outputs:
            n[v.id] = max(base, 1)
    return n


def output_tolerance(dtype: torch.dtype, n: int) -> tuple[float, float]:
    """(atol, rtol): float32's for `n` accumulated terms, plus one ulp for half outputs."""
    atol, rtol = tolerance(DType.float32, n)
    if dtype in (torch.float16, torch.bfloat16):
        rtol += torch.finfo(dtype).eps
    elif dtype == torch.float64:
        atol, rtol = tolerance(DType.float64, n)
    return atol, rtol


# -- comparison -----------------------------------------------------------------------
def _where(mask: torch.Tensor, limit: int = MAX_REPORTED) -> list[tuple[int, ...]]:
    idx = mask.nonzero()[:limit].tolist()
    return [tuple(i) for i in idx]


def compare_output(
    i: int,
    got: torch.Tensor,
    eager: torch.Tensor,
    ref64: torch.Tensor,
    perturbed: Sequence[torch.Tensor],
    n: int,
    ideal: torch.Tensor | None = None,
    alternatives: Sequence[Sequence[torch.Tensor]] = (),
) -> str | None:
    """None if output `i` of fuser is as good as eager's, else a message saying where not.

    `ideal`: the correctly rounded op-by-op result; fuser may match it instead of eager.
    `alternatives`: other answers, each a float64 run and then more runs of the same
    branch (rounded, perturbed): the decomposed graph's, and those with the uncertain
    comparisons turned (`flip_uncertain`). Fuser may match one within its own spread (also
    where `ref64` is NaN), not anything between two branches.
    """
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return (
            f"output {i}: fuser gives {got.dtype}{list(got.shape)}, "
            f"eager {eager.dtype}{list(eager.shape)}"
        )
    # on the outputs' device: a GPU compares 50257-wide rows far faster than the host
    g, e, r = got.detach(), eager.detach(), ref64.detach().to(got.device)
    best = r if ideal is None else ideal.detach().to(got.device)
    moved = [p.detach().to(got.device) for p in perturbed]
    if not e.is_floating_point():
        # as eager, or as the float64 evaluation, or as the correctly rounded one
        bad = (g != e) & (g != r.to(e.dtype)) & (g != best.to(e.dtype))
        # a comparison right at its threshold may flip: only where the perturbed runs do
        for p in moved:
            bad &= p.to(e.dtype) == r.to(e.dtype)
        for family in alternatives:  # another branch of a comparison at a near-tie
            for p in family:
                bad &= g != p.detach().to(g.device).to(e.dtype)
        if bad.any():
            where = _where(bad)
            vals = [(w, g[w].item(), e[w].item()) for w in where]
            return f"output {i} ({e.dtype}): {int(bad.sum())} element(s) differ, e.g. {vals}"
        return None
    g64, e64, r64 = g.double(), e.double(), r.double()
    finite = g64.isfinite() & e64.isfinite()
    atol, rtol = output_tolerance(e.dtype, n)
    ok_r = r64.isfinite()
    sensitivity = torch.zeros_like(e64)
    for p in moved:
        sens = (p.double() - r64).abs()
        sensitivity = torch.maximum(sensitivity, torch.where(sens.isnan() | ~ok_r, torch.inf, sens))
    # eager's own error: its distance from the nearest answer (eager may sit on another
    # branch of a near-tie: its distance from float64's is then no error bound)
    eager_err = (e64 - r64).abs()
    for family in alternatives:
        eager_err = torch.fmin(eager_err, (e64 - family[0].detach().to(g.device).double()).abs())
    slack = sensitivity.clone()
    both = ok_r & finite
    slack[both] = torch.maximum(slack[both], EAGER_ERROR_FACTOR * eager_err[both])
    # a NaN or inf must be where eager has it; where eager's own NaN/inf disagrees with
    # the float64 evaluation (CPU ATen's vectorized gelu gives NaN for huge and infinite
    # inputs), fuser may match the float64 evaluation instead, or a perturbed one (a
    # variance that is 0 for eager's Welford and 1e-14 for a two-pass sum, times inf)
    special = ~g64.isfinite() | ~e64.isfinite()
    fmax = torch.finfo(e.dtype).max
    near_max = e64.abs() >= fmax * (1 - 4 * torch.finfo(e.dtype).eps)
    as64 = g64.isfinite() & ok_r & ((g64 - r64).abs() <= atol + rtol * r64.abs() + sensitivity)
    # float64 values as the output dtype holds them: 3.409e38 is finite in float64 and
    # inf in float32 (a float32 pow that eager's less accurate sum kept at 3.08e38)
    odd = special & ~_same_class(g64, e64) & ~_same_class(g64, _held(r64, e.dtype)) & ~as64
    for p in moved:  # a perturbed run that lands where fuser did: a flip, not a bug
        p64 = p.double()
        near = g64.isfinite() & p64.isfinite() & ((g64 - p64).abs() <= atol + 2 * rtol * p64.abs())
        odd &= ~_same_class(g64, _held(p64, e.dtype)) & ~near
    other_branch = torch.zeros_like(g64, dtype=torch.bool)
    for family in alternatives:  # another answer, within its own spread
        runs = [p.detach().to(got.device).double() for p in family]
        c64 = runs[0]
        spread = torch.zeros_like(c64)
        for p64 in runs[1:]:
            d = (p64 - c64).abs()
            spread = torch.maximum(spread, torch.where(d.isnan(), torch.inf, d))
        tol = atol + 2 * rtol * c64.abs() + spread
        other_branch |= g64.isfinite() & c64.isfinite() & ((g64 - c64).abs() <= tol)
        for p64 in runs:
            odd &= ~_same_class(g64, _held(p64, e.dtype))
    odd &= ~other_branch
    # the largest finite value rounding to inf, or not (either side)
    g_near_max = g64.abs() >= fmax * (1 - 4 * torch.finfo(e.dtype).eps)
    odd &= ~(g64.isinf() & near_max) & ~(e64.isinf() & g_near_max)
    nan_bad = odd & (g64.isnan() | e64.isnan())
    inf_bad = odd & ~nan_bad
    err = (g64 - e64).abs()
    allowed = atol + rtol * e64.abs() + slack
    val_bad = finite & (err > allowed)
    b64 = best.double()
    val_bad &= ~((g64 - b64).abs() <= atol + rtol * b64.abs() + sensitivity)  # as ideal
    val_bad &= ~other_branch
    # chaotic elements: where perturbing every op by a few eps moves the float64 answer
    # by a quarter of the output's whole scale (cos of 1e9, renormalized), float32 has no
    # answer to compare; NaN and inf placement is still checked above
    # (the answer may be anywhere in the output's range, not anywhere at all: an output
    # that is ~0 everywhere has a tiny scale, and a fuser value far outside it is wrong)
    scale = r64[ok_r].abs().max().item() if bool(ok_r.any()) else 0.0
    if scale > 0:
        chaotic = (sensitivity >= CHAOTIC_FRACTION * scale) & (err <= 2 * scale + allowed)
        val_bad &= ~chaotic
    bad = nan_bad | inf_bad | val_bad
    if not bad.any():
        return None
    parts = []
    if nan_bad.any():
        parts.append(f"NaN pattern differs at {int(nan_bad.sum())} element(s) {_where(nan_bad)}")
    if inf_bad.any():
        parts.append(f"inf differs at {int(inf_bad.sum())} element(s) {_where(inf_bad)}")
    if val_bad.any():
        excess = torch.where(val_bad, err / allowed, torch.zeros_like(err))
        worst = tuple(np.unravel_index(int(excess.argmax()), tuple(e.shape))) if e.dim() else ()
        parts.append(
            f"{int(val_bad.sum())}/{e.numel()} element(s) out of tolerance; worst at {worst}: "
            f"fuser {g64[worst].item():.8g}, eager {e64[worst].item():.8g}, "
            f"float64 {r64[worst].item():.8g}, allowed +-{allowed[worst].item():.3g} "
            f"(atol {atol:.2g}, rtol {rtol:.2g}, n {n})"
        )
    return f"output {i} ({e.dtype}{list(e.shape)}): " + "; ".join(parts)


def _held(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` rounded to `dtype` (past its largest finite value: inf), as float64."""
    return x.to(dtype).double()


def _same_class(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Both NaN, or both the same infinity."""
    return (a.isnan() & b.isnan()) | (a.isinf() & (a == b))


def compare(
    fd: FusionDefinition,
    inputs: Sequence[torch.Tensor],
    runs: int = 1,
    backend: str | None = None,
) -> list[str]:
    """Execute `fd` on `inputs` `runs` times with `backend` (default: fd.execute's); the
    problems found (empty: fuser agrees).

    Later runs take the cached plan (on a GPU, the compiled kernel directly): they must
    give bit for bit the first run's outputs.
    """
    inputs = list(inputs)
    got = fd.execute(inputs, backend)
    problems = judge(fd, inputs, got)
    for run in range(1, runs):
        again = fd.execute(inputs, backend)
        for i, (a, b) in enumerate(zip(again, got)):
            if not _same_bits(a, b):
                problems.append(f"output {i}: run {run + 1} differs from run 1 (cached launch)")
    return problems


def perturbed_runs(
    graph: Graph, inputs: Sequence[torch.Tensor], signs: Sequence[float | None]
) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], Operands, Flips]:
    """The float64 run of `graph`, its perturbed runs (one per sign), the float64 run's
    comparisons (`record`) and those of them that may go either way (`flip_uncertain`).

    The perturbed runs keep every comparison as the float64 run decides it: they measure
    how far values move, not which branch a near-tie takes (a branch taken in one
    perturbed run would make anything between the two branches acceptable)."""
    central: Operands = {}
    center = reference(graph, inputs, upcast=True, record=central)
    spread: Operands = {}
    runs = []
    for i, s in enumerate(signs):
        operands: Operands = {}
        runs.append(reference(graph, inputs, seed=i, sign=s, record=operands, flips=held(central)))
        widen_spread(spread, central, operands)
    return center, runs, central, flip_uncertain(central, spread)


def judge(
    fd: FusionDefinition, inputs: Sequence[torch.Tensor], got: Sequence[torch.Tensor]
) -> list[str]:
    """The problems with `got` as fuser's outputs of `fd` on `inputs` (empty: none)."""
    graph = fd.bind(inputs)
    eager = reference(graph, inputs)
    ref64 = reference(graph, inputs, upcast=True)
    ideal = reference(graph, inputs, rounded=True)
    lengths = reduction_lengths(graph)
    # all up, all down (a threshold crossed one way or the other), random mixes (errors
    # that cancel or add up: x - mean(x) needs its two operands moved apart)
    signs = (1.0, -1.0, None, None, None, None)
    # on the definition (a composite's result moves as a whole) and on the decomposed
    # graph fuser's kernels compute (a layer_norm's mean and its squared deviations move
    # on their own)
    final = run_pipeline(graph, fd.relaxed_precision).final
    moved: list[list[torch.Tensor]] = []
    alternatives: list[list[list[torch.Tensor]]] = []
    for g in (graph, final):
        center, runs, central, flips = perturbed_runs(g, inputs, signs)
        if g is graph:
            moved += runs
        else:
            # the decomposed graph's float64 answer is an answer of its own (its gelu goes
            # through erf: at a near-tie it may take the other branch); its runs measure
            # how far values move around it
            moved += [[_recentred(p, c, r) for p, c, r in zip(run, center, ref64)] for run in runs]
            rounded = reference(g, inputs, rounded=True, flips=held(central))
            alternatives.append([center, rounded, *runs])
        # the branches: every comparison that may go either way turned the other way
        if flips:
            # float64, then rounded op by op as eager and fuser round (a bf16 division
            # the float64 run keeps exact), then perturbed: the branch's own spread
            turned: Operands = {}
            family = [reference(g, inputs, upcast=True, flips=flips, record=turned)]
            family.append(reference(g, inputs, rounded=True, flips=held(turned)))
            family += [
                reference(g, inputs, seed=i, sign=s, flips=held(turned))
                for i, s in enumerate(signs[:FLIPPED_RUNS])
            ]
            alternatives.append(family)
    problems = []
    if len(got) != len(eager):
        return [f"fuser gives {len(got)} outputs, eager {len(eager)}"]
    for i, (g, e, r, v) in enumerate(zip(got, eager, ref64, graph.outputs)):
        msg = compare_output(
            i,
            g,
            e,
            r,
            [m[i] for m in moved],
            lengths[v.id],
            ideal[i],
            [[run[i] for run in family] for family in alternatives],
        )
        if msg:
            problems.append(msg)
    return problems


def _recentred(run: torch.Tensor, center: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """A perturbed run of another graph moved to sit around `ref64` as it sat around its
    own `center` (booleans as they are)."""
    if not run.is_floating_point():
        return run
    return ref64.to(run.device).double() + (run - center)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool((a == b).all())
