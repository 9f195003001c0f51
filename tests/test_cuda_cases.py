"""Correctness cases for the CUDA backend, shared by test_cuda_gpu.py (on a GPU), the
emulated tier of test_cuda_backend.py (g++ on the CPU) and benchmarks/gpu_cuda_check.py.

Each case is a fusion, a way to make its inputs (random data, odd sizes, misaligned and
non-contiguous views), the scheduler kinds it must get and how to compare it with
fd.reference. The fusions and tolerances are those of tests/test_kernels.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fuser import FusionDefinition
from fuser.examples import seed_inputs, seed_layernorm_fusion

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
HALF_TOL = {F16: (1e-5, 1e-3), BF16: (1e-5, 8e-3)}


def randn(*shape: int, dtype: torch.dtype = F32, seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def misaligned(rows: int, cols: int, dtype: torch.dtype, device: str, seed: int = 0):
    """[rows, cols] starting one element into its storage (2- or 4-byte aligned)."""
    t = randn(rows * cols + 1, dtype=dtype, seed=seed, device=device)[1:].view(rows, cols)
    assert t.storage_offset() == 1
    return t


def transposed(rows: int, cols: int, dtype: torch.dtype, device: str, seed: int = 0):
    """[rows, cols] stored column-major."""
    return randn(cols, rows, dtype=dtype, seed=seed, device=device).t()


def tolerance(dtype: torch.dtype, n: int, relative: bool) -> tuple[float, float]:
    """(atol, rtol): 16-bit outputs at about one ulp; fp32 growing with the reduction
    length; `relative` outputs (probabilities) with a tiny atol only."""
    from fuser.ir.dtypes import dtype_of
    from fuser.ir.evaluate import tolerance as ir_tolerance

    atol, rtol = HALF_TOL[dtype] if dtype in HALF_TOL else ir_tolerance(dtype_of(dtype), n)
    if relative and dtype.is_floating_point:
        fi = torch.finfo(dtype)
        atol = 2 * fi.smallest_normal * fi.eps
    return atol, rtol


@dataclass
class Case:
    name: str
    build: Callable[[FusionDefinition], None]
    inputs: Callable[[str], list[torch.Tensor]]
    kinds: set[str]
    n: int = 1  # reduction length the tolerance grows with
    relative: tuple[int, ...] = ()
    equal_nan: bool = False
    # outputs that cancel (y + x after a normalization): an absolute tolerance of one
    # 16-bit ulp of the operands' magnitude, since a one-ulp flip of y survives the sum
    cancel_atol: dict[int, float] = field(default_factory=dict)
    emulate: bool = True  # small enough for the g++ emulator
    make: Callable[[], FusionDefinition] | None = None  # a prebuilt fusion instead

    def fusion(self) -> FusionDefinition:
        if self.make is not None:
            return self.make()
        with FusionDefinition(self.name) as fd:
            self.build(fd)
        return fd


def compare(fd: FusionDefinition, case: Case, inputs: list[torch.Tensor], out: list) -> str:
    """'' when every output matches fd.reference, else what differs (with a repro hint)."""
    ref = fd.reference(inputs)
    kinds = {k.schedule.kind for k in fd.kernels}
    if not kinds or not kinds <= case.kinds:
        return f"scheduler kinds {sorted(kinds)}, expected within {sorted(case.kinds)}"
    for i, (o, r) in enumerate(zip(out, ref)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"output {i}: {o.dtype}{list(o.shape)} != {r.dtype}{list(r.shape)}"
        atol, rtol = tolerance(r.dtype, case.n, i in case.relative)
        atol = max(atol, case.cancel_atol.get(i, 0.0))
        try:
            torch.testing.assert_close(
                o.cpu(), r.cpu(), atol=atol, rtol=rtol, equal_nan=case.equal_nan
            )
        except AssertionError as e:
            sched = "; ".join(k.schedule.short() for k in fd.kernels)
            return f"output {i} ({sched}): {str(e).strip()}"
    return ""


def run_case(case: Case, device: str, backend: str = "cuda") -> tuple[str, FusionDefinition]:
    """Execute `case` with `backend` on `device`; ('' or the mismatch, the fusion)."""
    fd = case.fusion()
    inputs = case.inputs(device)
    out = fd.execute(inputs, backend=backend)
    return compare(fd, case, inputs, out), fd


# -- fusions -------------------------------------------------------------------------------
def _layer_norm(dtype: torch.dtype) -> Callable[[FusionDefinition], None]:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.layer_norm(x, w, b, eps=1e-5))

    return build


def _softmax(dtype: torch.dtype, op: str = "softmax") -> Callable[[FusionDefinition], None]:
    return lambda fd: fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], dtype)))


def _pointwise(dtype: torch.dtype) -> Callable[[FusionDefinition], None]:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.gelu(fd.ops.add(x, b), approximate="tanh"))
        fd.add_output(fd.ops.sigmoid(x))

    return build


def _column_sum(dtype: torch.dtype, to_f32: bool = True) -> Callable[[FusionDefinition], None]:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, F32) if to_f32 else x, dims=[0]))

    return build


def _bias_grad_pair(fd: FusionDefinition) -> None:
    """Two column reductions sharing an input: db = sum(dy), dw = sum(dy * xhat)."""
    dy = fd.define_tensor([-1, -1], F16)
    xhat = fd.define_tensor([-1, -1], F16)
    dyf = fd.ops.cast(dy, F32)
    fd.add_output(fd.ops.sum(dyf, dims=[0]))
    fd.add_output(fd.ops.sum(fd.ops.mul(dyf, fd.ops.cast(xhat, F32)), dims=[0]))


def _cross_entropy(fd: FusionDefinition) -> None:
    logits = fd.define_tensor([-1, -1], F32)
    target = fd.define_tensor([-1], torch.int64)
    fd.add_output(fd.ops.cross_entropy(logits, target))


def _rms_residual(dtype: torch.dtype) -> Callable[[FusionDefinition], None]:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        y = fd.ops.rms_norm(x, w)
        fd.add_output(y)
        fd.add_output(fd.ops.add(y, x))

    return build


def _row_max_min(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1])
    fd.add_output(fd.ops.max(fd.ops.sub(x, 10.0), dims=[1]))
    fd.add_output(fd.ops.min(fd.ops.add(x, 10.0), dims=[1]))


def _with_nan(x: torch.Tensor, row: int, col: int) -> torch.Tensor:
    x = x.clone()
    x[row, col] = float("nan")
    return x


def _seed(rows: int, hidden: int) -> Case:
    return Case(
        f"seed_{rows}x{hidden}",
        lambda fd: None,
        lambda dev: seed_inputs(rows, hidden, device=dev),
        {"inner_persistent"},
        n=hidden,
        emulate=rows * hidden <= 3 * 20480,
        make=seed_layernorm_fusion,
    )


def _kinds(cols: int) -> set[str]:
    if cols >= 50000:
        return {"inner_looped", "inner_persistent"}
    return {"inner_persistent", "inner_looped"} if cols < 32 else {"inner_persistent"}


PERSISTENT = {"inner_persistent"}
CASES: list[Case] = [
    # pointwise
    Case(
        "pointwise_f16_odd",
        _pointwise(F16),
        lambda d: [randn(5, 127, dtype=F16, device=d), randn(127, dtype=F16, seed=1, device=d)],
        {"pointwise"},
    ),
    Case(
        "pointwise_bf16_5142",
        _pointwise(BF16),
        lambda d: [randn(3, 5142, dtype=BF16, device=d), randn(5142, dtype=BF16, seed=1, device=d)],
        {"pointwise"},
    ),
    Case(
        "pointwise_f32_1col",
        _pointwise(F32),
        lambda d: [randn(9, 1, device=d), randn(1, seed=1, device=d)],
        {"pointwise"},
    ),
    Case(
        "pointwise_f16_misaligned",
        _pointwise(F16),
        lambda d: [misaligned(7, 96, F16, d), randn(97, dtype=F16, seed=1, device=d)[1:]],
        {"pointwise"},
    ),
    Case(
        "pointwise_f32_transposed",
        _pointwise(F32),
        lambda d: [transposed(20, 48, F32, d), randn(48, seed=1, device=d)],
        {"pointwise"},
    ),
    Case(
        "pointwise_f16_large",
        _pointwise(F16),
        lambda d: [randn(4096, 3072, dtype=F16, device=d), randn(3072, dtype=F16, device=d)],
        {"pointwise"},
        emulate=False,
    ),
    # inner persistent
    Case(
        "layer_norm_f16_1000",
        _layer_norm(F16),
        lambda d: (
            [randn(6, 1000, dtype=F16, device=d)]
            + [randn(1000, dtype=F16, seed=i, device=d) for i in (1, 2)]
        ),
        PERSISTENT,
        n=1000,
    ),
    Case(
        "layer_norm_bf16_5140",
        _layer_norm(BF16),
        lambda d: (
            [randn(3, 5140, dtype=BF16, device=d)]
            + [randn(5140, dtype=BF16, seed=i, device=d) for i in (1, 2)]
        ),
        PERSISTENT,
        n=5140,
    ),
    Case(
        "layer_norm_f32_odd_rows",
        _layer_norm(F32),
        lambda d: (
            [randn(333, 768, device=d) * 2 + 0.5] + [randn(768, seed=i, device=d) for i in (1, 2)]
        ),
        PERSISTENT,
        n=768,
        emulate=False,
    ),
    Case(
        "layer_norm_f32_7cols",
        _layer_norm(F32),
        lambda d: [randn(64, 7, device=d)] + [randn(7, seed=i, device=d) for i in (1, 2)],
        _kinds(7),
        n=7,
    ),
    Case(
        "layer_norm_f32_transposed",
        _layer_norm(F32),
        lambda d: [transposed(20, 48, F32, d)] + [randn(48, seed=i, device=d) for i in (1, 2)],
        PERSISTENT,
        n=48,
    ),
    Case(
        "softmax_f16_1000",
        _softmax(F16),
        lambda d: [randn(6, 1000, dtype=F16, device=d) * 3],
        PERSISTENT,
        n=1000,
        relative=(0,),
    ),
    Case(
        "log_softmax_f32_row_slice",
        _softmax(F32, "log_softmax"),
        lambda d: [randn(4, 100, device=d)[:, 10:80]],
        PERSISTENT,
        n=70,
    ),
    Case(
        "softmax_f32_nan_row",
        _softmax(F32),
        lambda d: [_with_nan(randn(3, 1000, device=d), 1, 333)],
        PERSISTENT,
        n=1000,
        relative=(0,),
        equal_nan=True,
    ),
    Case(
        "rms_norm_residual_f16_misaligned",
        _rms_residual(F16),
        lambda d: [misaligned(3, 5140, F16, d), randn(5141, dtype=F16, seed=1, device=d)[1:]],
        PERSISTENT,
        n=5140,
        cancel_atol={1: 2.0**-10 * 4},
    ),
    Case(
        "row_max_min_f32_5140",
        _row_max_min,
        lambda d: [randn(2, 5140, device=d)],
        PERSISTENT,
    ),
    # inner looped
    Case(
        "softmax_f16_50257",
        _softmax(F16),
        lambda d: [randn(2, 50257, dtype=F16, device=d) * 4],
        {"inner_looped"},
        n=50257,
        relative=(0,),
    ),
    Case(
        "softmax_f32_50257_nan",
        _softmax(F32),
        lambda d: [_with_nan(randn(3, 50257, device=d), 1, 777)],
        {"inner_looped"},
        n=50257,
        relative=(0,),
        equal_nan=True,
    ),
    Case(
        "cross_entropy_50257",
        _cross_entropy,
        lambda d: [
            randn(3, 50257, device=d) * 2,
            torch.tensor([5, -100, 50256], device=d),
        ],
        {"inner_looped", "inner_persistent"},
        n=50257,
    ),
    Case(
        "row_max_min_f32_50257",
        _row_max_min,
        lambda d: [randn(2, 50257, device=d)],
        {"inner_looped"},
    ),
    # outer (column) reductions
    Case(
        "column_sum_f32_split",
        _column_sum(F32),
        lambda d: [randn(300, 77, device=d)],
        {"outer_reduction"},
        n=300,
    ),
    Case(
        "column_sum_bf16_out_bf16",
        _column_sum(BF16, to_f32=False),
        lambda d: [randn(64, 128, dtype=BF16, device=d)],
        {"outer_reduction"},
        n=64,
    ),
    Case(
        "column_sum_f16_misaligned",
        _column_sum(F16),
        lambda d: [misaligned(33, 5140, F16, d)],
        {"outer_reduction"},
        n=33,
    ),
    Case(
        "column_sum_f32_transposed",
        _column_sum(F32),
        lambda d: [transposed(40, 48, F32, d)],
        {"outer_reduction"},
        n=40,
    ),
    Case(
        "bias_grad_pair_f16",
        _bias_grad_pair,
        lambda d: [
            randn(8192, 768, dtype=F16, device=d),
            randn(8192, 768, dtype=F16, seed=1, device=d),
        ],
        {"outer_reduction"},
        n=8192,
        emulate=False,
    ),
    Case(
        "column_max_f32_nan",
        lambda fd: fd.add_output(fd.ops.max(fd.define_tensor([-1, -1]), dims=[0])),
        lambda d: [_with_nan(randn(300, 77, device=d), 123, 4)],
        {"outer_reduction"},
        equal_nan=True,
    ),
    Case(
        "column_mean_3d",
        lambda fd: fd.add_output(fd.ops.mean(fd.define_tensor([-1, -1, -1]), dims=[0, 1])),
        lambda d: [randn(2, 3, 257, device=d)],
        {"outer_reduction"},
        n=6,
    ),
    _seed(3, 5140),
    _seed(2, 768),
]
SEED_SWEEP = [768, 1024, 1280, 1536, 1600, 2048, 2560, 4096, 5140, 12288, 16384, 20480]
# the whole sweep at a GPU-sized row count (not emulated)
GPU_CASES = CASES + [_seed(1000, h) for h in SEED_SWEEP]


def run_replaced(fd: FusionDefinition, inputs: list[torch.Tensor], **changes: object) -> str:
    """Run `fd`'s single kernel with its schedule changed (dataclasses.replace), for
    schedule features the heuristics pick only at sizes too large to test everywhere;
    '' when the output matches fd.reference."""
    from dataclasses import replace

    from fuser.codegen.cuda.source import render_cuda
    from fuser.plan.build import make_plan
    from fuser.runtime.kernel import Kernel

    (k,) = fd.compile(inputs, "h100", "cuda")
    s = replace(k.schedule, **changes).validate()
    kernel = Kernel(k.spec, s, render_cuda(make_plan(k.spec, s)), "cuda")
    graph_inputs = fd._runtime().last.graph.inputs
    env = {v.id: t for v, t in zip(graph_inputs, inputs)}
    args, outs = [], []
    for a, shape in zip(kernel.spec.args, kernel.shapes):
        if a.is_output:
            outs.append(torch.empty(shape, dtype=a.dtype.torch, device=inputs[0].device))
            args.append(outs[-1])
        else:
            args.append(env[a.value.id])
    kernel.launch(args)
    case = Case(fd.name, lambda fd: None, lambda d: inputs, {s.kind})
    fd.compile(inputs, "h100", "cuda")  # fd.kernels: the kinds compare() checks
    return compare(fd, case, inputs, outs)
