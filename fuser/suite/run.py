"""One suite model trained by one implementation, judged against eager.

Each implementation (eager, inductor, fuser) starts from the same weights and trains on
the same batches with AdamW (fused on a GPU, with bf16 autocast there). Parity: the loss
of every step within the dtype's tolerance of eager's, and the gradients after the first
step within it too (relative error of each parameter's gradient, by its norm). fuser's
coverage is read from what it compiled: the ATen ops it fused against the compute ops it
left to ATen (matmuls, attention and free views apart), with the reasons.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch._dynamo.utils import counters

from fuser.dynamo import FuserBackend
from fuser.suite.models import FAMILIES, batch, build, shape

IMPLS = ("eager", "inductor", "fuser")

# ATen ops that are not memory-bound work fuser could take: GEMMs and attention stay
# with their libraries; views, aliases and metadata cost nothing
GEMM = ("mm", "addmm", "bmm", "baddbmm", "convolution", "matmul", "linear")
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
FREE = (
    "view",
    "alias",
    "t.",
    "transpose",
    "permute",
    "expand",
    "as_strided",
    "slice",
    "select",
    "squeeze",
    "unsqueeze",
    "split",
    "detach",
    "getitem",
    "lift_fresh",
    "empty",
    "sym_size",
)


@dataclass
class Result:
    model: str
    size: str
    impl: str
    device: str
    params_m: float = 0.0
    batch: int = 0  # the step's batch (the suite's own unless --batch gave another)
    losses: list[float] = field(default_factory=list)
    ms_per_step: float = float("nan")
    peak_mem_gib: float = float("nan")
    first_step_s: float = float("nan")
    graphs: int = 0  # graphs Dynamo compiled (any implementation but eager)
    graph_breaks: int = 0  # and the graph breaks it reported: a backend causes none
    max_loss_diff: float = 0.0
    max_grad_err: float = 0.0
    grad_err_param: str = ""
    parity: bool | None = None
    fused_ops: int = 0
    unfused_ops: int = 0
    unfused_top: list[str] = field(default_factory=list)
    fell_back: list[str] = field(default_factory=list)  # regions that ran as ATen, and why
    # from a profiled step (--profile, a GPU): ms per step by category, and the fused-op
    # coverage by GPU time (StepProfile.coverage)
    gpu_ms: dict[str, float | None] = field(default_factory=dict)
    gpu_coverage: float = float("nan")
    # the same time's share in the compiler's own kernels, its copy and cast kernels too
    own_coverage: float = float("nan")
    # memory-bound ms a step that ran outside every compiled graph (eager code between
    # graphs), and the own kernels' share of the time inside the graphs
    outside_graphs_ms: float = float("nan")
    own_coverage_in_graphs: float = float("nan")
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.parity is not False

    @property
    def coverage(self) -> float:
        total = self.fused_ops + self.unfused_ops
        return self.fused_ops / total if total else float("nan")


def tolerances(device: str) -> tuple[float, float]:
    """(loss tolerance, gradient relative error) for a step on `device`: fp32 on a CPU,
    bf16 autocast on a GPU."""
    return (1e-4, 1e-3) if device == "cpu" else (5e-2, 8e-2)


def _kind(op: str) -> str:
    name = op.removeprefix("aten.")
    if any(name.startswith(g) for g in GEMM):
        return "gemm"
    if any(a in name for a in ATTENTION):
        return "attention"
    if any(name.startswith(f) for f in FREE):
        return "free"
    return "compute"


def coverage(backend: object, res: Result) -> None:
    """Fill `res`'s fused/unfused op counts from a FuserBackend's captures."""
    reasons: Counter = Counter()
    for capture in backend.captures:  # type: ignore[attr-defined]
        for graph in capture.graphs:
            res.fused_ops += sum(len(r.nodes) for r in graph.fused)
            res.fell_back += [f"{r.name}: {r.fallback}" for r in graph.regions if r.fallback]
            for f in graph.fallbacks:
                if _kind(f.op) == "compute":
                    res.unfused_ops += 1
                    reasons[f"{f.op}: {f.reason}"] += 1
    res.unfused_top = [f"{n} x {why}" for why, n in reasons.most_common(6)]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.detach().float().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def compiled(model: torch.nn.Module, impl: str) -> tuple[torch.nn.Module, object | None]:
    """`model` as `impl` runs it ("eager", "inductor", "fuser", or "aot_eager": Dynamo's
    and AOTAutograd's graphs run by ATen) and, for fuser, the
    FuserBackend whose captures explain and coverage read."""
    if impl == "eager":
        return model, None
    if impl in ("inductor", "aot_eager"):  # aot_eager: Dynamo's graphs, no kernels
        return torch.compile(model, backend=impl), None
    if impl == "fuser":
        backend = FuserBackend()
        return torch.compile(model, backend=backend), backend
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS} or aot_eager")


def train(
    name: str,
    size: str,
    impl: str,
    device: str,
    steps: int,
    warmup: int,
    amp: bool = True,
    profile: Callable[[Callable[[], None], Result], None] | None = None,
    batch_size: int | None = None,
) -> tuple[Result, dict[str, torch.Tensor]]:
    """Train `name` with `impl` for `steps` steps: the result and the first step's
    gradients (`judge` compares both with eager's). On a GPU the forward runs under bf16
    autocast unless `amp` is False (the fp32 reference). `profile` (a GPU): called after
    the timed steps with a closure running one more step, and the result to fill
    (fuser/suite/profiled.py). `batch_size`: the batch in place of the suite's own (the
    sequence length or image side stays the suite's)."""
    res = Result(name, size, impl, device)
    family = FAMILIES.get(name)  # an unknown name: build's error, in res.error below
    b, n = shape(family, size, device) if family is not None else (0, 0)
    dims = (batch_size or b, n)
    res.batch = dims[0]
    torch._dynamo.reset()
    counters.clear()  # Dynamo's: graphs and graph breaks of this run only
    gc.collect()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    grads: dict[str, torch.Tensor] = {}
    try:
        model = build(name, size, device)
        res.params_m = sum(p.numel() for p in model.parameters()) / 1e6
        step_model, backend = compiled(model, impl)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        times = []
        for i in range(steps):
            kwargs = batch(name, size, model, device, seed=1 + i, dims=dims)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and amp):
                loss = step_model(**kwargs).loss
            loss.backward()
            if i == 0:
                grads = _grads(model)
            opt.step()
            opt.zero_grad(set_to_none=True)
            res.losses.append(loss.item())
            if cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        res.first_step_s = times[0] / 1e3
        res.ms_per_step = statistics.median(times[warmup:] or times[-1:])
        if cuda:
            res.peak_mem_gib = torch.cuda.max_memory_allocated() / 2**30
        if impl != "eager":
            res.graphs = counters["stats"]["unique_graphs"]
            res.graph_breaks = sum(counters["graph_break"].values())
        if backend is not None:
            coverage(backend, res)
        if profile is not None and cuda:
            kwargs = batch(name, size, model, device, seed=1 + steps, dims=dims)

            def step() -> None:
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    loss = step_model(**kwargs).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            profile(step, res)
    except Exception:
        res.error = traceback.format_exc()[-3000:]
    return res, grads


def _grad_errors(grads: dict, want: dict) -> dict[str, float]:
    """Each parameter's gradient error relative to `want`'s: by its norm, or by 1e-4 of
    the largest one's where that is more (a gradient that is zero in exact arithmetic, an
    attention key's bias, is rounding noise in both); inf where a gradient is missing."""
    floor = 1e-4 * max((w.norm().item() for w in want.values()), default=0.0)
    out = {}
    for n, w in want.items():
        got = grads.get(n)
        if got is None:
            out[n] = float("inf")
        else:
            out[n] = ((got - w).norm() / max(w.norm().item(), floor, 1e-30)).item()
    return out


def judge(
    res: Result,
    grads: dict,
    eager: Result,
    eager_grads: dict,
    reference: Result | None = None,
    reference_grads: dict | None = None,
) -> None:
    """Parity of `res` (and its first step's `grads`) with eager's.

    Without a reference (a CPU, all fp32): within the tolerances of eager's own. With an
    fp32 `reference` (a GPU, where eager itself runs under bf16 autocast): the error
    against the reference may be at most twice eager's own plus a tenth of the tolerance,
    per gradient and per loss (torch.compile's accuracy check judges the same way), since
    some gradients of a bf16 step are rounding noise for every implementation alike."""
    if res.error or eager.error:
        return
    loss_tol, grad_tol = tolerances(res.device)
    diffs = [abs(a - b) for a, b in zip(res.losses, eager.losses)]
    res.max_loss_diff = max(diffs) if diffs else 0.0
    errs = _grad_errors(grads, eager_grads)
    where = max(errs, key=errs.get) if errs else ""
    res.max_grad_err, res.grad_err_param = errs.get(where, 0.0), where
    if reference is None or reference.error or not reference_grads:
        res.parity = res.max_loss_diff <= loss_tol and res.max_grad_err <= grad_tol
        return
    mine, theirs = _grad_errors(grads, reference_grads), _grad_errors(eager_grads, reference_grads)
    grads_ok = all(mine[n] <= 2 * theirs[n] + grad_tol / 10 for n in reference_grads)
    # eager's loss error over the whole run: one step where bf16 happens to land on the
    # fp32 loss must not make that step's bound tighter than bf16's own noise
    eager_off = max((abs(e - r) for e, r in zip(eager.losses, reference.losses)), default=0.0)
    losses_ok = all(
        abs(a - r) <= 2 * eager_off + loss_tol / 10 for a, r in zip(res.losses, reference.losses)
    )
    res.parity = grads_ok and losses_ok
