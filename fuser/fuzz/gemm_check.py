"""Run a GEMM fuzz case (fuzz/gemm.py) through the GEMM template and judge it.

The case's function is traced with make_fx on its inputs (fake tensors with their
strides), its matmul chains lowered with FUSER_GEMM=template (dynamo/gemm.lower_gemm,
the case's backend), and the rewritten graph run. It is judged against the exact result
of the operands eager gives its matmul: the function run in float64 with each matmul
reading eager's own operands (A after the prologue's cast and scale, rounded as eager
rounds them; the template's prologue rounds them alike, bit for bit), every other op in
float64 (a cast a copy). The rounding of those operands is shared by fuser and eager, so
it leaves the comparison: a float64 run that skipped the casts charged it to both, and
flagged fuser wherever eager's own later error happened to cancel it (GPU soak seed 26:
three outputs where fuser was the exactly rounded answer for its operands). Each output
must have eager's shape and dtype, be finite where the reference is, and lie, per
element, within
  - twice eager's own error (eager rounds after every op where fuser keeps the fp32
    tile: where eager was lucky at an element, the two sit a rounding step apart),
  - how far roundings of the case's coarsest dtype between the ops move the reference
    (every op's result moved by that unit roundoff: up, down, a random sign each),
  - how far the fp32 accumulations can move it (each matmul's and sum's result moved by
    its accumulation bound, up and down: see ACC_ULPS),
  - one rounding step of the output (see _compare) and an fp32 floor for the epilogue's math;
on average it must be no further off than eager (1.5x) plus the accumulations' allowance,
which catches a systematic error too small for any one element. On a GPU a second run
must repeat the first's bits (split-K adds its partials in a fixed order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import traceback
from collections.abc import Iterator, Sequence
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
# fp32 accumulation of n terms, per element, in fp32 steps (2**-23) of the partial sums'
# size (the terms' root sum of squares, plus the sum itself where the terms share a sign):
# round-to-nearest adds drift as sqrt(n) steps, a tensor core's truncating adds (one per
# 16-wide k step) as n / 16. The H200's template at K=4096 (fp16, soak seed 26): 2 fp16
# ulps of y0 (1.6e-3), against 8.5e-3 allowed.
ACC_ULPS = 8.0
TC_STEP = 16
FP32_FLOOR_ULPS = 8.0  # fp32 steps of the output's scale: the epilogue's erf, tanh, exp
EPS32 = torch.finfo(torch.float32).eps
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
SUMS = {torch.ops.aten.sum.dim_IntList, torch.ops.aten.sum.default}


class GemmResult(NamedTuple):
    """status (ok, mismatch, error, invalid), the problems, the matmuls' choices (the
    template's epilogue tag, or "cublas"), and how many matmuls stayed with cuBLAS."""

    status: str
    problems: list[str]
    kinds: list[str]
    fallbacks: int


class References(NamedTuple):
    """Eager's outputs, the float64 reference from eager's matmul operands, and that
    reference with the roundings moved (`moved`) and with the fp32 accumulations moved
    (`accumulated`): one list of outputs per run."""

    eager: list[torch.Tensor]
    ref: list[torch.Tensor]
    moved: list[list[torch.Tensor]]
    accumulated: list[list[torch.Tensor]]


def check_gemm_case(case: GemmCase, device: str = "cpu", runs: int = 1) -> GemmResult:
    fn = function(case)
    try:
        inputs = make_inputs(case, device)
        fn(*inputs)
    except Exception as e:  # ATen rejects it: the generator's fault
        return GemmResult("invalid", [f"{type(e).__name__}: {e}"], [], 0)
    saved = config.backend
    try:
        refs = references(case, inputs)
        config.backend = case.backend
        gm = make_fx(fn, tracing_mode="fake")(*inputs)
        notes = lower_gemm(gm, "template")
        if case.split_k > 1:
            _force_split(gm, case.split_k)
        got = list(gm(*inputs))
        problems = judge(got, refs.eager, refs.ref, refs.moved, refs.accumulated)
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


def references(case: GemmCase, inputs: Sequence[torch.Tensor]) -> References:
    """Eager's outputs on `inputs` and the float64 runs fuser is judged against."""
    fn, fn64 = function(case), function(case, float64=True)
    capture = _Operands()
    with capture, _strict_cublas():
        eager = list(fn(*inputs))
    wide = [x.double() for x in inputs]
    unit = _eps(case) / 2  # the coarsest dtype's unit roundoff
    bounds: dict[int, torch.Tensor] = {}  # the accumulation bounds, by call: both runs'

    def run(**kw: Any) -> list[torch.Tensor]:
        with _Float64(capture.operands, bounds, **kw):
            return list(fn64(*wide))

    ref = run()
    moved = [run(eps=unit, sign=sign, seed=i) for i, sign in enumerate(SIGNS)]
    accumulated = [run(acc=sign) for sign in (1.0, -1.0)]
    return References(eager, ref, moved, accumulated)


@contextlib.contextmanager
def _strict_cublas() -> Iterator[None]:
    """cuBLAS without its reduced-precision reductions, which PyTorch allows by default
    (fp16/bf16 partial sums rounded to the output dtype): eager's error, which fuser is
    allowed twice, is then its ops' roundings (with them the H200's eager was 0.057 off
    its own operands at K=4096, N=33, and 0.045 at K=257 in bf16; unmeasured without)."""
    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (
            matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction,
        ) = saved


class _Operands(TorchDispatchMode):
    """Records the operands of each matmul eager runs, as it computes them."""

    def __init__(self) -> None:
        super().__init__()
        self.operands: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in MATMULS:  # mm(a, b), addmm(bias, a, b)
            self.operands.append((args[-2], args[-1]))
        return func(*args, **(kwargs or {}))


class _Float64(TorchDispatchMode):
    """The float64 run: the i-th matmul reads eager's i-th operands (widened: exact).
    With `eps`, every computed float result (not a view) is moved by that relative amount:
    all up (sign 1), all down (-1), or a random sign per element (None): how far roundings
    of that size between the ops can move the outputs (a residual add cancelling a large
    product, a GELU's slope). With `acc` (1 or -1), each matmul's and sum's result is
    moved that way by its fp32 accumulation bound (ACC_ULPS)."""

    def __init__(
        self,
        operands: list[tuple[torch.Tensor, torch.Tensor]],
        bounds: dict[int, torch.Tensor],
        eps: float = 0.0,
        sign: float | None = None,
        seed: int = 0,
        acc: float = 0.0,
    ):
        super().__init__()
        self.operands, self.bounds = operands, bounds
        self.eps, self.sign, self.acc = eps, sign, acc
        self.gen = torch.Generator().manual_seed(seed)
        self.matmuls = self.sums = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        key = None  # an accumulation's number, its bound's key
        if func in MATMULS:
            key, self.matmuls = 2 * self.matmuls, self.matmuls + 1
            args = (*args[:-2], *self._eager_operands(key // 2, args[-2], args[-1]))
        elif func in SUMS:
            key, self.sums = 2 * self.sums + 1, self.sums + 1
        out = func(*args, **kwargs)
        if func.is_view or func in _ALIASES or not isinstance(out, torch.Tensor):
            return out
        if not out.is_floating_point() or out.numel() == 0:
            return out
        if self.acc and key is not None:
            if key not in self.bounds:
                self.bounds[key] = _accumulation_bound(func, args, kwargs, out)
            out = out + self.acc * self.bounds[key]
        if not self.eps:
            return out
        if self.sign is None:
            noise = torch.randint(0, 2, out.shape, generator=self.gen).double() * 2 - 1
            return out * (1 + self.eps * noise.to(out.device))
        return out * (1 + self.eps * self.sign)

    def _eager_operands(
        self, i: int, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if i >= len(self.operands):
            raise RuntimeError(f"the float64 run makes matmul {i + 1}; eager made {i}")
        ea, eb = self.operands[i]
        if ea.shape != a.shape or eb.shape != b.shape:
            raise RuntimeError(
                f"matmul {i + 1}: the float64 run's operands {list(a.shape)} @ {list(b.shape)}, "
                f"eager's {list(ea.shape)} @ {list(eb.shape)}"
            )
        return ea.to(a.device, torch.float64), eb.to(b.device, torch.float64)


_ALIASES = {torch.ops.aten._unsafe_view.default, torch.ops.aten.alias.default}
SIGNS = (1.0, -1.0, None, None)


def _accumulation_bound(func: Any, args: Any, kwargs: dict, out: torch.Tensor) -> torch.Tensor:
    """How far an fp32 accumulation of `func`'s terms (a matmul's products over K, a
    sum's elements) can be off, per element of `out` (ACC_ULPS)."""
    if func in MATMULS:
        a, b = args[-2], args[-1]
        n = a.shape[-1]
        spread = torch.mm(a * a, b * b).sqrt() + torch.mm(a, b).abs()
    else:
        x = args[0]
        n = x.numel() // max(1, out.numel())
        spread = func(x * x, *args[1:], **kwargs).sqrt() + out.abs()
    return EPS32 * (ACC_ULPS * math.sqrt(n) + n / TC_STEP) * spread


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
    moved: Sequence[Sequence[torch.Tensor]] = (),
    accumulated: Sequence[Sequence[torch.Tensor]] = (),
) -> list[str]:
    """The problems with fuser's outputs (empty: as good as eager). `ref`: the float64
    reference; `moved`: it with every op's result perturbed, `accumulated`: with each
    accumulation moved by its bound (References, one list of outputs per run)."""
    if len(got) != len(eager):
        return [f"fuser gives {len(got)} outputs, eager {len(eager)}"]
    problems = []
    for i, (g, e, r) in enumerate(zip(got, eager, ref, strict=True)):
        if g.shape != e.shape or g.dtype != e.dtype:
            problems.append(
                f"output {i}: fuser gives {g.dtype}{list(g.shape)}, eager {e.dtype}{list(e.shape)}"
            )
            continue
        msg = _compare(g, e, r, [m[i] for m in moved], [a[i] for a in accumulated])
        if msg:
            problems.append(f"output {i} ({e.dtype}{list(e.shape)}): {msg}")
    return problems


def _spread(runs: Sequence[torch.Tensor], r64: torch.Tensor) -> torch.Tensor:
    """How far the runs move each element of the reference, at most."""
    out = torch.zeros_like(r64)
    for m in runs:
        out = torch.maximum(out, (m.double().to(r64.device) - r64).abs())
    return out


def _compare(
    g: torch.Tensor,
    e: torch.Tensor,
    r: torch.Tensor,
    moved: Sequence[torch.Tensor],
    accumulated: Sequence[torch.Tensor],
) -> str:
    g64, e64, r64 = g.detach().double(), e.detach().double(), r.detach().double().to(g.device)
    floor = FP32_FLOOR_ULPS * EPS32 * _scale(r64)
    sensitivity, accumulation = _spread(moved, r64), _spread(accumulated, r64)
    # per element: eager's own error (twice), how far the case's roundings and the fp32
    # accumulations move it, and the output's own rounding
    err, eager_err = (g64 - r64).abs(), (e64 - r64).abs()
    # a full rounding step of the output, not half: where eager rounded the chain's
    # intermediates the fused epilogue kept them in fp32 (or rounded them from a
    # different fp32 accumulation), so an element near a rounding boundary lands on the
    # other neighbour (GPU soak seed 27: three outputs 0.97, 0.90 and 0.89 steps off the
    # exact value, against 0.74-0.84 allowed with a half step); a systematic error this small
    # is the mean check's to catch
    own = torch.finfo(e.dtype).eps * r64.abs()
    allowed = EAGER_ERROR_FACTOR * eager_err + sensitivity + accumulation + own + floor
    bad = (err > allowed) | (g64.isfinite() != r64.isfinite())
    if bad.any():
        worst = _worst(torch.where(bad, err / allowed, torch.zeros_like(err)))
        return (
            f"{int(bad.sum())}/{e.numel()} element(s) out of tolerance; worst at {worst}: "
            f"fuser {g64[worst].item():.8g}, eager {e64[worst].item():.8g}, reference "
            f"{r64[worst].item():.8g}, allowed +-{allowed[worst].item():.3g}"
        )
    # on average: a systematic error (a truncating cast, a lost term) shows in the mean
    # long before any one element leaves the per-element bound; fuser, rounding less
    # often than eager, is on average no further off
    finite = r64.isfinite() & g64.isfinite()
    if finite.sum() >= MEAN_MIN_ELEMENTS:
        mean, eager_mean = err[finite].mean().item(), eager_err[finite].mean().item()
        acc = accumulation[finite]
        slack = acc[acc.isfinite()].mean().nan_to_num(0.0).item() + floor
        if mean > MEAN_FACTOR * eager_mean + slack:
            return (
                f"mean error {mean:.3g} against eager's {eager_mean:.3g} (allowed "
                f"{MEAN_FACTOR}x + {slack:.2g}): a systematic error"
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
