"""Run OpInfo samples through torch.compile(backend=FuserBackend) and compare with eager.

Each sample gets a fresh Dynamo cache and its own FuserBackend, so its captures say
whether a fused region really ran (`fused`) or everything stayed ATen (`fallback`, with
the reasons explain would show). Outputs (and, for targets whose backward fuser claims,
the gradients of the float inputs) are compared with torch.testing.assert_close at
per-dtype tolerances; integer and bool results must be equal.
"""

from __future__ import annotations

import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fuser.dynamo.backend import FuserBackend
from fuser.opdb.claims import Target

# (atol, rtol): fuser computes half types in float32 as ATen does, so results differ by
# the rounding of a different float32 evaluation order: about one ulp of the output dtype
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1.3e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}
PASSED, FALLBACK, FAILED, SKIPPED = "passed", "fallback", "failed", "skipped"


@dataclass
class SampleResult:
    """One sample of one OpInfo in one dtype."""

    target: str
    dtype: str
    index: int
    status: str  # passed (a fused region ran and matched), fallback, failed, skipped
    detail: str = ""  # the failure, the fallback reasons, or why it was skipped
    seconds: float = 0.0
    repro: str = ""


@dataclass
class OpReport:
    """Counts per OpInfo target."""

    target: str
    claims: list[str]
    samples: list[SampleResult] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(s.status == status for s in self.samples)

    @property
    def ran(self) -> int:
        return len(self.samples) - self.count(SKIPPED)

    @property
    def first_failure(self) -> SampleResult | None:
        return next((s for s in self.samples if s.status == FAILED), None)


def repro(target: Target, dtype: torch.dtype, index: int, device: str) -> str:
    """The one-line command that runs this sample again."""
    name = str(dtype).removeprefix("torch.")
    return (
        f"python -m fuser.opdb --ops {target.name} --dtypes {name} --device {device} "
        f"--sample {index} -v"
    )


def _clone(tree: Any, grad: bool) -> Any:
    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        y = x.detach().clone()
        return y.requires_grad_(grad and x.requires_grad)

    return pytree.tree_map(one, tree)


def _call(op: Any, sample: Any, grad: bool) -> tuple[list[torch.Tensor], list, list]:
    """op on a copy of the sample: (tensor outputs, tensor leaves of the inputs, grads)."""
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs), grad)
    out = op(inp, *args, **kwargs)
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    leaves = [x for x in pytree.tree_leaves((inp, args, kwargs)) if isinstance(x, torch.Tensor)]
    grads: list = []
    if grad:
        diff = [o for o in outs if o.requires_grad]
        wrt = [x for x in leaves if x.requires_grad]
        if diff and wrt:
            g = torch.Generator(device=diff[0].device).manual_seed(0)
            cot = [torch.randn(o.shape, generator=g, device=o.device).to(o.dtype) for o in diff]
            grads = list(torch.autograd.grad(diff, wrt, cot, allow_unused=True))
    return [o.detach() for o in outs], leaves, grads


def _compare(got: list, want: list, what: str) -> None:
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} tensors, eager gives {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            if (g is None) != (w is None):
                raise AssertionError(f"{what} {i}: {g is None=} {w is None=}")
            continue
        atol, rtol = TOLERANCES.get(w.dtype, (0.0, 0.0))
        torch.testing.assert_close(
            g,
            w,
            atol=atol,
            rtol=rtol,
            equal_nan=True,
            check_stride=False,
            msg=lambda m, head=f"{what} {i} ({w.dtype}{list(w.shape)})": f"{head}: {m}",
        )


def _fused(backend: FuserBackend) -> tuple[bool, list[str]]:
    """Whether a fused region ran, and why the rest stayed ATen (as explain says)."""
    ran, reasons = False, []
    for c in backend.captures:
        for g in c.graphs:
            if g.error:
                reasons.append(f"graph lowering failed: {g.error}")
            for r in g.regions:
                if r.fused and r.calls:
                    ran = True
                elif r.fallback is not None:
                    reasons.append(f"region {r.ops}: {r.fallback}")
            reasons += [f"{f.op}: {f.reason}" for f in g.fallbacks]
            crashed = [f for f in g.fallbacks if f.reason.startswith("lowering failed")]
            if crashed:  # support.try_lower caught a lowering bug: not a declined op
                raise AssertionError(f"{crashed[0].op}: {crashed[0].reason}")
    if not backend.captures:
        reasons.append("Dynamo captured no graph")
    return ran, list(dict.fromkeys(reasons))


def run_sample(
    target: Target, sample: Any, dtype: torch.dtype, index: int, device: str
) -> SampleResult:
    """One sample: eager, then compiled with a fresh Dynamo cache, then compared."""
    t0 = time.perf_counter()
    result = SampleResult(target.name, str(dtype).removeprefix("torch."), index, SKIPPED)
    result.repro = repro(target, dtype, index, device)
    op = target.opinfo.op
    try:
        with warnings.catch_warnings():  # eager's own warnings (var's dof <= 0) are noise
            warnings.simplefilter("ignore")
            want, _, want_grads = _call(op, sample, target.grad)
    except Exception as e:  # not a valid sample for this op in eager: nothing to compare
        result.detail = f"eager raised {type(e).__name__}: {str(e)[:200]}"
        return result
    torch._dynamo.reset()
    # strict: an unexpected error in fuser raises (a failure here) instead of being
    # turned into a quiet run-time fallback; declined ops (NotLowerable) still fall back
    backend = FuserBackend(strict=True)

    def fn(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    compiled = torch.compile(fn, backend=backend, fullgraph=False, dynamic=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, _, got_grads = _call(compiled, sample, target.grad)
        _compare(got, want, "output")
        if target.grad:
            _compare(got_grads, want_grads, "grad of input")
        ran, reasons = _fused(backend)
    except Exception as e:
        result.status = FAILED
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        result.detail = text[:2000]
    else:
        fuser_warnings = [str(w.message) for w in caught if "fuser" in str(w.message)]
        result.status = PASSED if ran else FALLBACK
        result.detail = "; ".join(fuser_warnings + reasons)[:2000]
    finally:
        torch._dynamo.reset()
    result.seconds = time.perf_counter() - t0
    return result


def run_target(
    target: Target,
    dtypes: list[torch.dtype],
    device: str = "cpu",
    max_samples: int | None = None,
    only: int | None = None,
) -> OpReport:
    """Up to max_samples samples of `target` per dtype it supports among `dtypes`."""
    report = OpReport(target.name, target.claims)
    info = target.opinfo
    supported = info.supported_dtypes(device)
    for dtype in dtypes:
        if dtype not in supported:
            continue
        samples = info.sample_inputs(device, dtype, requires_grad=target.grad)
        for i, sample in enumerate(samples):
            if max_samples is not None and i >= max_samples:
                break
            if only is not None and i != only:
                continue
            report.samples.append(run_sample(target, sample, dtype, i, device))
    return report
