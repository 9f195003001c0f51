"""Run a GEMM fuzz case (fuzz/gemm.py) through the GEMM template and judge it.

The case's function is traced with make_fx on its inputs (fake tensors with their
strides), its matmul chains lowered with FUSER_GEMM=template (dynamo/gemm.lower_gemm,
the case's backend), and the rewritten graph run. Each output must have eager's shape
and dtype, be finite where the float64 run is, and lie, per element, within 2x eager's
own error of the float64 run plus two steps of the case's coarsest rounding and a K-grown
fp32 term (fuser keeps the fp32 tile through the epilogue where eager rounds after every
op: where eager was lucky at an element, the two sit a rounding step apart); on average
it must be no further off than eager (1.5x), which catches a systematic error too small
for any one element. On a GPU a second run must repeat the first's bits (split-K adds
its partials in a fixed order).
"""

from __future__ import annotations

import dataclasses
import re
import traceback
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from fuser.config import config
from fuser.dynamo.gemm import lower_gemm
from fuser.dynamo.gemm_call import GemmCall
from fuser.fuzz.gemm import GemmCase, function, make_inputs
from fuser.schedulers.gemm import retile

EAGER_ERROR_FACTOR = 2.0
MEAN_FACTOR = 1.5  # fuser's mean error over eager's (a truncating bf16 cast: about 2x)
MEAN_MIN_ELEMENTS = 256  # outputs large enough for their mean error to be stable
FP32_ULPS = 8.0  # fp32 rounding per sqrt(K) summed terms, relative to the output's scale


class GemmResult(NamedTuple):
    """status (ok, mismatch, error, invalid), the problems, the matmuls' choices (the
    template's epilogue tag, or "cublas"), and how many matmuls stayed with cuBLAS."""

    status: str
    problems: list[str]
    kinds: list[str]
    fallbacks: int


def check_gemm_case(case: GemmCase, device: str = "cpu", runs: int = 1) -> GemmResult:
    fn, fn64 = function(case), function(case, float64=True)
    try:
        inputs = make_inputs(case, device)
        eager = list(fn(*inputs))
        wide = [x.double() for x in inputs]
        ref = list(fn64(*wide))
        unit = _eps(case) / 2  # the coarsest dtype's unit roundoff
        moved = [list(_perturbed(fn64, wide, unit, sign, i)) for i, sign in enumerate(SIGNS)]
    except Exception as e:  # ATen rejects it: the generator's fault
        return GemmResult("invalid", [f"{type(e).__name__}: {e}"], [], 0)
    saved = config.backend
    try:
        config.backend = case.backend
        gm = make_fx(fn, tracing_mode="fake")(*inputs)
        notes = lower_gemm(gm, "template")
        if case.split_k > 1:
            _force_split(gm, case.split_k)
        got = list(gm(*inputs))
        problems = judge(got, eager, ref, _k(case), moved)
        for run in range(1, runs):
            again = list(gm(*inputs))
            if any(not _same_bits(a, b) for a, b in zip(again, got)):
                problems.append(f"run {run + 1} differs from run 1")
    except Exception as e:
        tb = traceback.format_exc(limit=-4)
        return GemmResult("error", [f"{type(e).__name__}: {str(e)[:2000]}\n{tb}"], [], 0)
    finally:
        config.backend = saved
    kinds = [_kind(n) for n in notes]
    status = "mismatch" if problems else "ok"
    return GemmResult(status, problems, kinds, kinds.count("cublas"))


def _force_split(gm: Any, split: int) -> None:
    """The graph's template calls with their plans' K split `split` ways."""
    for node in gm.graph.nodes:
        call = node.target
        if isinstance(call, GemmCall) and not call.plan.shape.index64:
            tiles = dataclasses.replace(call.plan.tiles, split_k=split)
            call.plan = retile(call.plan, tiles, f"split-K {split} (forced by the fuzz case)")


def _k(case: GemmCase) -> int:
    """The matmul's K (the summed extent): the first operand's last dim, dW's rows."""
    first = case.inputs[0].shape
    return first[0] if case.lines[0].startswith("y0 = dy.t()") else first[-1]


class _Perturb(TorchDispatchMode):
    """Every computed float result (not a view) moved by a relative `eps`: all up, all
    down, or a random sign per element: how far roundings of that size between the ops
    can move the outputs (a residual add cancelling a large product, a GELU's slope)."""

    def __init__(self, eps: float, sign: float | None, seed: int):
        super().__init__()
        self.eps, self.sign = eps, sign
        self.gen = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view or func in _ALIASES or not isinstance(out, torch.Tensor):
            return out
        if not out.is_floating_point() or out.numel() == 0:
            return out
        if self.sign is None:
            noise = torch.randint(0, 2, out.shape, generator=self.gen).double() * 2 - 1
            return out * (1 + self.eps * noise.to(out.device))
        return out * (1 + self.eps * self.sign)


_ALIASES = {torch.ops.aten._unsafe_view.default, torch.ops.aten.alias.default}
SIGNS = (1.0, -1.0, None, None)


def _perturbed(fn: Any, inputs: list, eps: float, sign: float | None, seed: int) -> Any:
    with _Perturb(eps, sign, seed):
        return fn(*inputs)


def _eps(case: GemmCase) -> float:
    """The coarsest rounding in the case (its inputs' dtypes and its casts'): eager
    rounds to it after ops where fuser keeps fp32."""
    dtypes = {i.dtype for i in case.inputs}
    dtypes |= set(re.findall(r"cast\([^,]+, '(\w+)'\)", " ".join(case.lines)))
    return max(torch.finfo(getattr(torch, d)).eps for d in dtypes)


def _kind(note: str) -> str:
    found = re.search(r"template gemm_(\w+?)_(fp32|fp16|bf16)_m", note)
    return found.group(1) if found else "cublas"


def _scale(r: torch.Tensor) -> float:
    finite = r[r.isfinite()]
    return float(finite.abs().max()) if finite.numel() and finite.abs().max() > 0 else 1.0


def judge(
    got: list[torch.Tensor],
    eager: list[torch.Tensor],
    ref: list[torch.Tensor],
    k: int,
    moved: Sequence[Sequence[torch.Tensor]] = (),
) -> list[str]:
    """The problems with fuser's outputs (empty: as good as eager). `k`: the summed
    extent; `moved`: the float64 runs with every op's result perturbed (_Perturb)."""
    if len(got) != len(eager):
        return [f"fuser gives {len(got)} outputs, eager {len(eager)}"]
    problems = []
    for i, (g, e, r) in enumerate(zip(got, eager, ref, strict=True)):
        if g.shape != e.shape or g.dtype != e.dtype:
            problems.append(
                f"output {i}: fuser gives {g.dtype}{list(g.shape)}, eager {e.dtype}{list(e.shape)}"
            )
            continue
        msg = _compare(g, e, r, k, [m[i] for m in moved])
        if msg:
            problems.append(f"output {i} ({e.dtype}{list(e.shape)}): {msg}")
    return problems


def _compare(
    g: torch.Tensor, e: torch.Tensor, r: torch.Tensor, k: int, moved: Sequence[torch.Tensor]
) -> str:
    g64, e64, r64 = g.detach().double(), e.detach().double(), r.detach().double().to(g.device)
    scale = _scale(r64)
    atol = FP32_ULPS * torch.finfo(torch.float32).eps * max(1.0, k**0.5) * scale
    sensitivity = torch.zeros_like(r64)
    for m in moved:
        sensitivity = torch.maximum(sensitivity, (m.double().to(g.device) - r64).abs())
    # per element: eager's own error (twice), how far the case's roundings move it, and
    # the output's own rounding
    err, eager_err = (g64 - r64).abs(), (e64 - r64).abs()
    own = torch.finfo(e.dtype).eps / 2 * r64.abs()
    allowed = EAGER_ERROR_FACTOR * eager_err + sensitivity + own + atol
    bad = (err > allowed) | (g64.isfinite() != r64.isfinite())
    if bad.any():
        worst = _worst(torch.where(bad, err / allowed, torch.zeros_like(err)))
        return (
            f"{int(bad.sum())}/{e.numel()} element(s) out of tolerance; worst at {worst}: "
            f"fuser {g64[worst].item():.8g}, eager {e64[worst].item():.8g}, float64 "
            f"{r64[worst].item():.8g}, allowed +-{allowed[worst].item():.3g}"
        )
    # on average: a systematic error (a truncating cast, a lost term) shows in the mean
    # long before any one element leaves the per-element bound; fuser, rounding less
    # often than eager, is on average no further off
    finite = r64.isfinite() & g64.isfinite()
    if finite.sum() >= MEAN_MIN_ELEMENTS:
        mean, eager_mean = err[finite].mean().item(), eager_err[finite].mean().item()
        if mean > MEAN_FACTOR * eager_mean + atol:
            return (
                f"mean error {mean:.3g} against eager's {eager_mean:.3g} (allowed "
                f"{MEAN_FACTOR}x + {atol:.2g}): a systematic error"
            )
    return ""


def _worst(excess: torch.Tensor) -> tuple[int, ...]:
    flat = int(excess.nan_to_num(float("inf")).argmax())
    return tuple(int(x) for x in torch.unravel_index(torch.tensor(flat), excess.shape))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def repro(case: GemmCase, device: str = "cpu") -> str:
    """A runnable script: the case's function (as a comment), the case, the check."""
    lines = [f"# fuser GEMM fuzz repro: {case.summary()}", *[f"# {n}" for n in case.notes]]
    lines += [f"#   {line}" for line in case.source().splitlines()]
    lines += [
        "from fuser.fuzz.case import InputSpec",
        "from fuser.fuzz.gemm import GemmCase",
        "from fuser.fuzz.gemm_check import check_gemm_case",
        "",
        f"case = {case!r}",
        f"print(check_gemm_case(case, {device!r}).problems or 'no mismatch')",
    ]
    return "\n".join(lines) + "\n"
