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

from fuser.dynamo.backend import FuserBackend, decompositions
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


def _clone(tree: Any, grad: bool, wide: bool = False) -> Any:
    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        y = x.detach().clone()
        if wide and y.is_floating_point():
            y = y.double()
        return y.requires_grad_(grad and x.requires_grad)

    return pytree.tree_map(one, tree)


def _call(
    op: Any, sample: Any, grad: bool, wide: bool = False, cot_dtypes: list | None = None
) -> tuple[list[torch.Tensor], list]:
    """op on a copy of the sample (its float tensors in float64 when `wide`): the tensor
    outputs, and with `grad` the gradients of the inputs that require them for a seeded
    cotangent (rounded to `cot_dtypes`, the low-precision run's output dtypes)."""
    inp, args, kwargs = _clone((sample.input, sample.args, sample.kwargs), grad, wide)
    out = op(inp, *args, **kwargs)
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    grads: list = []
    if grad:
        leaves = pytree.tree_leaves((inp, args, kwargs))
        wrt = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        diff = [o for o in outs if o.requires_grad]
        if diff and wrt:
            g = torch.Generator(device=diff[0].device).manual_seed(0)
            low = cot_dtypes or [o.dtype for o in diff]
            cot = [
                torch.randn(o.shape, generator=g, device=o.device).to(d).to(o.dtype)
                for o, d in zip(diff, low)
            ]
            grads = list(torch.autograd.grad(diff, wrt, cot, allow_unused=True))
    return [o.detach() for o in outs], grads


def _as_accurate(got: torch.Tensor, want: torch.Tensor, ref: Any, atol: float, rtol: float) -> bool:
    """Whether every element of fuser's result is close to eager's, close to the float64
    run's, or no farther from the float64 run than eager's (eager is not exact either: a
    layer_norm of one element gives x - mean(x) != 0 in eager, 0 in fuser)."""
    if not isinstance(ref, torch.Tensor) or ref.shape != want.shape:
        return False
    g, w, r = got.double(), want.double(), ref.detach().double()
    ok = torch.isclose(g, w, rtol, atol, equal_nan=True)
    ok |= torch.isclose(g, r, rtol, atol, equal_nan=True)
    ok |= (g - r).abs() <= (w - r).abs()
    return bool(ok.all())


def _same(got: torch.Tensor, graph: Any, atol: float, rtol: float) -> bool:
    """Whether fuser's result is close to the captured graph's run op by op in ATen."""
    if not isinstance(graph, torch.Tensor) or graph.shape != got.shape:
        return False
    return bool(torch.isclose(got, graph.to(got.dtype), rtol, atol, equal_nan=True).all())


def _compare(got: list, want: list, ref: Any, what: str) -> int:
    """Raise if a result differs from eager's beyond tolerance, unless it is as accurate
    or equal to the same graph run by ATen (`ref()` gives those runs' results: float64
    eager, the captured graph in ATen); returns how many needed `ref`."""
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} tensors, eager gives {len(want)}")
    by_ref = 0
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            if (g is None) != (w is None):
                raise AssertionError(f"{what} {i}: {g is None=} {w is None=}")
            continue
        atol, rtol = TOLERANCES.get(w.dtype, (0.0, 0.0))
        try:
            torch.testing.assert_close(
                g,
                w,
                atol=atol,
                rtol=rtol,
                equal_nan=True,
                check_stride=False,
                msg=lambda m, head=f"{what} {i} ({w.dtype}{list(w.shape)})": f"{head}: {m}",
            )
        except AssertionError:
            wide, graph = ref() if w.is_floating_point() and g.dtype == w.dtype else (None, None)
            r = wide[i] if wide is not None and i < len(wide) else None
            o = graph[i] if graph is not None and i < len(graph) else None
            if not (_as_accurate(g, w, r, atol, rtol) or _same(g, o, atol, rtol)):
                raise
            by_ref += 1
    return by_ref


def _fused(backend: FuserBackend) -> tuple[bool, list[str]]:
    """Whether a fused region ran, and why the rest stayed ATen (as explain says)."""
    ran, reasons = False, []
    for c in backend.captures:
        for g in c.graphs:
            if g.error:
                reasons.append(f"graph lowering failed: {g.error}")
            for r in g.regions:
                if r.fused and r.total_calls:
                    ran = True
                elif r.fallback is not None:
                    reasons.append(f"region {r.ops}: {r.fallback}")
            reasons += [f"{f.op}: {f.reason}" for f in g.fallbacks]
            crashed = [f for f in g.fallbacks if f.reason.startswith("lowering failed")]
            if crashed:  # support.try_lower caught a lowering bug: not a declined op
                raise AssertionError(f"{crashed[0].op}: {crashed[0].reason}")
    if not backend.captures:
        reasons.append("Dynamo captured no graph")
    elif not ran and not reasons:
        reasons.append("the captured graphs hold no ATen op (x.float() of a float32 x)")
    return ran, list(dict.fromkeys(reasons))


def run_sample(
    target: Target, sample: Any, dtype: torch.dtype, index: int, device: str
) -> SampleResult:
    """One sample: eager, then compiled with a fresh Dynamo cache, then compared."""
    t0 = time.perf_counter()
    result = SampleResult(target.name, str(dtype).removeprefix("torch."), index, SKIPPED)
    result.repro = repro(target, dtype, index, device)
    op, grad = target.opinfo.op, target.grad
    try:
        with warnings.catch_warnings():  # eager's own warnings (var's dof <= 0) are noise
            warnings.simplefilter("ignore")
            want, want_grads = _call(op, sample, grad)
    except Exception as e:  # not a valid sample for this op in eager: nothing to compare
        result.detail = f"eager raised {type(e).__name__}: {str(e)[:200]}"
        return result

    wide: dict[str, Any] = {}

    def reference(grads: bool) -> list | None:
        """The float64 run's outputs (or grads), computed once, None if it cannot run."""
        if "run" not in wide:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cots = [w.dtype for w in want if w.requires_grad or grad]
                    wide["run"] = _call(op, sample, grad, wide=True, cot_dtypes=cots)
            except Exception:
                wide["run"] = None
        return None if wide["run"] is None else wide["run"][1 if grads else 0]

    def graph_reference(grads: bool) -> list | None:
        """The captured graph run op by op in ATen (Dynamo rewrites some calls: addcdiv
        with a value becomes div, mul, add, each rounded to the input's dtype)."""
        if "graph" not in wide:
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=aten_backend(), fullgraph=False, dynamic=False)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    wide["graph"] = _call(compiled, sample, grad)
            except Exception:
                wide["graph"] = None
        return None if wide["graph"] is None else wide["graph"][1 if grads else 0]

    def refs(grads: bool) -> list:
        return [reference(grads), graph_reference(grads)]

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
            got, got_grads = _call(compiled, sample, grad)
        by_ref = _compare(got, want, lambda: refs(False), "output")
        if grad:
            by_ref += _compare(got_grads, want_grads, lambda: refs(True), "grad of input")
        ran, reasons = _fused(backend)
    except Exception as e:
        result.status = FAILED
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        result.detail = text[:2000]
    else:
        notes = [str(w.message) for w in caught if "fuser" in str(w.message)]
        if by_ref:
            notes.append(
                f"{by_ref} result(s) off eager but as accurate (float64 run) or equal to the "
                "captured graph run op by op in ATen"
            )
        result.status = PASSED if ran else FALLBACK
        result.detail = "; ".join(notes + reasons)[:2000]
    finally:
        torch._dynamo.reset()
    result.seconds = time.perf_counter() - t0
    return result


def aten_backend() -> Any:
    """A torch.compile backend that runs the graph fuser would get (AOTAutograd with
    fuser's decompositions) op by op in ATen."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def nop(gm: Any, _: Any) -> Any:
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=nop, bw_compiler=nop, decompositions=decompositions())


def spread(n: int, k: int | None) -> list[int]:
    """k indices out of range(n), evenly spaced, first and last included (op_db lists a
    plain sample first and its edge cases, such as empty and 0-d tensors, last)."""
    if k is None or k >= n:
        return list(range(n))
    if k <= 1:
        return [0][:k]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def run_target(
    target: Target,
    dtypes: list[torch.dtype],
    device: str = "cpu",
    max_samples: int | None = None,
    only: int | None = None,
) -> OpReport:
    """`target`'s samples in each dtype it supports among `dtypes`: all, or max_samples
    of them spread over the list, or only the sample of index `only`."""
    report = OpReport(target.name, target.claims)
    info = target.opinfo
    supported = info.supported_dtypes(device)
    for dtype in dtypes:
        if dtype not in supported:
            continue
        samples = list(info.sample_inputs(device, dtype, requires_grad=target.grad))
        chosen = [only] if only is not None else spread(len(samples), max_samples)
        for i in chosen:
            if 0 <= i < len(samples):
                report.samples.append(run_sample(target, samples[i], dtype, i, device))
    return report
