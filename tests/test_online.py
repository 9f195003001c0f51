"""Online max-and-sum: softmax, log_softmax and cross-entropy over rows too long for
registers read the row once for the max and the sum (fuser/schedulers/online.py).

The plan is checked on the spec (which sums pair with which max, how many passes), the
generated source on both backends (one reduction loop, then the output loop), the numbers
against eager on both backends (Triton's interpreter, the g++ CUDA emulator; a GPU when
there is one), NaN and infinities exactly where eager puts them, and the kernels compiled
for sm_90: no spills, registers as estimated.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable

import pytest
import torch

from fuser import FusionDefinition
from fuser.bench.cases import cross_entropy_case
from fuser.fuzz.check import compare
from fuser.ir.dtypes import dtype_of
from fuser.ir.evaluate import tolerance
from fuser.ir.ops import Op
from fuser.schedulers.online import looped_plan

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAN, INF = math.nan, math.inf
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HAVE_NVRTC = importlib.util.find_spec("cuda") is not None and (
    importlib.util.find_spec("cuda.bindings") is not None
)


# -- fusions ----------------------------------------------------------------------------------
def define(build: Callable[[FusionDefinition], None], name: str = "online") -> FusionDefinition:
    with FusionDefinition(name) as fd:
        build(fd)
    return fd


def row_op(op: str, dtype: torch.dtype = F32) -> FusionDefinition:
    return define(lambda fd: fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], dtype))))


def scaled_softmax(dtype: torch.dtype, scale: float, exp: str = "exp") -> FusionDefinition:
    """exp(scale * (x - max(x))) / sum, written out with a bf16/fp16 max and casts (the
    shape torch's decompositions give when the max stays in the input dtype)."""

    def build(fd: FusionDefinition) -> None:
        o = fd.ops
        x = fd.define_tensor([-1, -1], dtype)
        m = o.cast(o.max(x, dims=[1]), F32)
        xf = o.cast(x, F32)
        shifted = o.sub(xf, o.broadcast_in_dim(m, shape=x.shape, broadcast_dims=[0]))
        e = getattr(o, exp)(o.mul(shifted, scale))
        total = o.sum(e, dims=[1])
        y = o.div(e, o.broadcast_in_dim(total, shape=x.shape, broadcast_dims=[0]))
        fd.add_output(o.cast(y, dtype))

    return define(build, "scaled_softmax")


def ce_fwd_bwd(rows: int, cols: int, dtype: torch.dtype) -> FusionDefinition:
    """The benchmark's cross-entropy forward + backward (per-row loss, dlogits)."""
    return cross_entropy_case(rows, cols, dtype).fusions[0]


def ce_composite(dtype: torch.dtype = F32) -> FusionDefinition:
    def build(fd: FusionDefinition) -> None:
        logits = fd.define_tensor([-1, -1], dtype)
        target = fd.define_tensor([-1], torch.int64)
        fd.add_output(fd.ops.cross_entropy(logits, target))

    return define(build, "cross_entropy")


def randn(*shape: int, dtype: torch.dtype = F32, seed: int = 0, scale: float = 4.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(DEVICE)


def targets(rows: int, cols: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cols, (rows,), generator=g).to(DEVICE)


def meta(*shape: int, dtype: torch.dtype = F16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def looped(fd: FusionDefinition):  # noqa: ANN201 - the looped kernel
    ks = [k for k in fd.kernels if k.schedule.kind == "inner_looped"]
    assert len(ks) == 1, [k.schedule.short() for k in fd.kernels]
    return ks[0]


def tol(dtype: torch.dtype, n: int) -> tuple[float, float]:
    """(atol, rtol): 16-bit outputs at about an ulp, float32 growing with the row."""
    half = {F16: (1e-5, 1e-3), BF16: (1e-5, 8e-3)}
    return half[dtype] if dtype in half else tolerance(dtype_of(dtype), n)


def run(fd: FusionDefinition, inputs: list[torch.Tensor], eager: bool = False) -> list:
    """fd.execute once, against fd.reference (ATen op by op: NaN and inf where eager puts
    them, compared exactly); `eager`: against the fuzzer's full comparison instead
    (eager, float64 and perturbed runs: slower)."""
    if eager:
        problems = compare(fd, inputs)
        assert not problems, "\n".join(problems) + "\n" + repr(fd)
        return fd.execute(inputs)
    out = fd.execute(inputs)
    ref = fd.reference(inputs)
    n = max(x.shape[-1] for x in inputs)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.dtype == r.dtype and o.shape == r.shape, (i, o.dtype, r.dtype)
        # relative only: a softmax row of 50257 holds probabilities near 2e-5, under
        # any useful absolute tolerance
        _, rtol = tol(r.dtype, n)
        fi = torch.finfo(r.dtype)
        atol = 2 * fi.smallest_normal * fi.eps
        torch.testing.assert_close(
            o.cpu(), r.cpu(), atol=atol, rtol=rtol, equal_nan=True, msg=lambda m, i=i: f"{i}: {m}"
        )
    return out


# -- the plan -------------------------------------------------------------------------------
def _plan(fd: FusionDefinition, inputs: list[torch.Tensor]):  # noqa: ANN202
    kernels = fd.compile(inputs, "h100")
    k = next(k for k in kernels if k.schedule.kind == "inner_looped")
    return k.spec, looped_plan(k.spec), k


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_softmax_pairs_max_and_sum(op: str, dtype: torch.dtype) -> None:
    spec, plan, k = _plan(row_op(op, dtype), [meta(4096, 50257, dtype=dtype)])
    assert plan.passes == ((1, 2),) and plan.output_pass and plan.count == 2
    (p,) = plan.pairs
    assert p.max.op == Op.MAX and p.sum.op == Op.SUM and p.exp == Op.EXP and p.scale == 1.0
    text = "\n".join(k.schedule.reasons)
    assert "online max-and-sum: 2 passes over the row instead of 3" in text, text


def test_cross_entropy_fwd_bwd_is_two_passes() -> None:
    """max and the picked logit (round 1) and the sum of exp (round 2): one pass."""
    fd = ce_fwd_bwd(8192, 50257, BF16)
    spec, plan, k = _plan(fd, [meta(8192, 50257, dtype=BF16), meta(8192, dtype=torch.int64)])
    assert plan.passes == ((1, 2),) and len(plan.pairs) == 1 and plan.count == 2
    assert [n.op for n in plan.reductions((1, 2), spec)] == [Op.SUM]  # the picked logit
    assert "2 passes over the row instead of 3" in fd.explain()


def test_composite_cross_entropy_is_one_pass() -> None:
    """The loss alone (no dlogits): no output pass, one pass over the row instead of 2."""
    fd = ce_composite(BF16)
    spec, plan, k = _plan(fd, [meta(64, 50257, dtype=BF16), meta(64, dtype=torch.int64)])
    assert plan.passes == ((1, 2),) and not plan.output_pass and plan.count == 1
    assert "1 passes over the row instead of 2" in "\n".join(k.schedule.reasons)


@pytest.mark.parametrize("exp,scale", [("exp", 0.125), ("exp2", 1.4426950408889634)])
def test_scaled_exp_with_casts_pairs(exp: str, scale: float) -> None:
    """A bf16 max cast to float32, x cast to float32, exp or exp2 of a scaled difference."""
    spec, plan, _ = _plan(scaled_softmax(BF16, scale, exp), [meta(64, 50257, dtype=BF16)])
    (p,) = plan.pairs
    assert p.exp == (Op.EXP if exp == "exp" else Op.EXP2) and p.scale == scale


@pytest.mark.parametrize("case", ["negative_scale", "other_operand", "half_exp", "layer_norm"])
def test_what_does_not_pair(case: str) -> None:
    """A negative scale (the exponents would grow), exp of another tensor minus the max,
    exp computed in bfloat16, a mean and a variance: the plain passes."""

    def build(fd: FusionDefinition) -> None:
        o = fd.ops
        x = fd.define_tensor([-1, -1], BF16 if case == "half_exp" else F32)
        if case == "layer_norm":
            fd.add_output(o.layer_norm(x, None, None))
            return
        y = fd.define_tensor([-1, -1]) if case == "other_operand" else x
        m = o.max(x, dims=[1])
        d = o.sub(y, o.broadcast_in_dim(m, shape=x.shape, broadcast_dims=[0]))
        e = o.exp(o.mul(d, -0.5 if case == "negative_scale" else 0.5))
        fd.add_output(o.sum(e, dims=[1]))

    fd = define(build)
    ins = [meta(64, 50257, dtype=BF16 if case == "half_exp" else F32)]
    ins += [meta(64, 50257, dtype=F32)] if case == "other_operand" else []
    spec, plan, k = _plan(fd, ins)
    assert not plan.pairs and len(plan.passes) == spec.rounds == 2
    assert "online" not in "\n".join(k.schedule.reasons)


# -- the generated source ---------------------------------------------------------------------
@pytest.mark.parametrize("be", ["triton", "cuda"])
def test_source_reads_the_row_twice(be: str) -> None:
    fd = ce_fwd_bwd(8192, 50257, BF16)
    (k,) = fd.compile([meta(8192, 50257, dtype=BF16), meta(8192, dtype=torch.int64)], "h100", be)
    # the aligned-start walk's body starts after its head (rows of 50257 start unaligned)
    loop = "for off in range(" if be == "triton" else "for (int off = WIDTH;"
    assert k.source.count(loop) == 2, k.source  # the online pass, the output pass
    assert "online" in k.source and "rescaled when" in k.source
    assert "not once per round" in k.source


# -- numbers, against eager -------------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(
    "dtype,shape",
    [(F32, (3, 50257)), (F16, (2, 50257)), (BF16, (5, 33001))],
    ids=["f32_3x50257", "f16_2x50257", "bf16_5x33001"],
)
def test_softmax_against_eager(backend: str, op: str, dtype: torch.dtype, shape) -> None:  # noqa: ANN001
    fd = row_op(op, dtype)
    run(fd, [randn(*shape, dtype=dtype)])
    assert looped_plan(looped(fd).spec).count == 2


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_cross_entropy_fwd_bwd_against_eager(backend: str, dtype: torch.dtype) -> None:
    rows, cols = (3, 50257) if dtype != BF16 else (2, 33001)
    fd = ce_fwd_bwd(rows, cols, dtype)
    x, t = randn(rows, cols, dtype=dtype, scale=2.0), targets(rows, cols)
    run(fd, [x, t])
    assert looped_plan(looped(fd).spec).count == 2


def test_composite_cross_entropy_against_eager(backend: str) -> None:
    x, t = randn(3, 33001, scale=2.0), targets(3, 33001)
    t[1] = -100  # ignored
    run(ce_composite(), [x, t])


@pytest.mark.parametrize("view", ["column_slice", "transposed"])
def test_non_contiguous_input(backend: str, view: str) -> None:
    """Rows 33010 apart holding 33001 columns; a column-major [2, 33001] (strided loads)."""
    if view == "column_slice":
        x = randn(3, 33010, dtype=BF16)[:, 5:33006]
    else:
        x = randn(33001, 2, dtype=BF16).t()
    assert not x.is_contiguous()
    fd = row_op("log_softmax", BF16)
    run(fd, [x])
    assert looped_plan(looped(fd).spec).count == 2


@pytest.mark.parametrize("cols", [50256, 49152], ids=["tail", "loop_ends_at_row_end"])
def test_aligned_walk_of_whole_vector_rows(backend: str, cols: int) -> None:
    """Rows of a multiple of 8 columns starting 1, 2, 3 elements past an aligned address
    (a slice of rows one element longer). The CUDA aligned-start walk's tail slots then
    straddle the row end by the shift: they were stored as whole vectors past it (into
    the next row, past the last), and where the loop ended on the row's last column
    (49152: 12 iterations of 4096) the tail, the last `shift` columns, was not walked."""
    x = randn(4, cols + 1, dtype=BF16)[:, :cols]
    fd = row_op("log_softmax", BF16)
    run(fd, [x])
    p = looped(fd).plan
    if backend == "cuda":
        assert p.walk_align == 8 and p.walk_tail >= 7, p.text()
        assert (p.walk_end == cols) == (cols == 49152), p.text()


@pytest.mark.parametrize("scale,exp", [(0.125, "exp"), (1.4426950408889634, "exp2")])
def test_scaled_softmax_against_eager(backend: str, scale: float, exp: str) -> None:
    fd = scaled_softmax(BF16, scale, exp)
    run(fd, [randn(2, 33001, dtype=BF16, scale=8.0)])
    assert looped_plan(looped(fd).spec).pairs


# -- NaN and infinities -----------------------------------------------------------------------
def special_rows(cols: int, dtype: torch.dtype = F32) -> torch.Tensor:
    """Row 0 all -inf, row 1 a NaN, row 2 a +inf, row 3 some -inf, row 4 plain; the
    specials sit in the loop body, the masked tail and the first column."""
    x = randn(5, cols, dtype=dtype)
    x[0].fill_(-INF)
    x[1, cols - 2] = NAN
    x[2, 0] = INF
    x[3, 1] = -INF
    x[3, cols // 2] = -INF
    x[3, cols - 1] = -INF
    return x


@pytest.mark.nonfinite
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_specials(backend: str, op: str) -> None:
    """As eager: rows 0-2 all NaN (-inf - -inf, NaN, inf - inf); row 3 probability 0
    (log -inf) at its -inf entries, the rest finite; row 4 finite."""
    x = special_rows(33001)
    fd = row_op(op)
    (y,) = run(fd, [x], eager=op == "softmax")
    assert y[:3].isnan().all()
    zero = 0.0 if op == "softmax" else -INF
    assert (y[3, [1, 16500, 33000]] == zero).all()
    assert not y[3].isnan().any() and not y[4].isnan().any()
    if op == "softmax":
        total = y[3].double().sum().item()
        assert abs(total - 1.0) < 1e-4, total


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_masked_logits_compute_no_inf_minus_inf(backend: str, op: str) -> None:
    """Logits masked to -inf (attention-style): eager's x - max is -inf there, never
    -inf - -inf, and so are the kernel's running sums. A lane whose max is still -inf when
    it meets a -inf computed -inf - -inf = NaN and discarded it: numpy's invalid-value
    warning in the interpreter, an error under the test suite's config.fp_warnings."""
    x = randn(3, 33001)
    x[0, 700:] = -INF  # a finite head, -inf to the end (the masked tail included)
    x[1, :30000] = -INF  # -inf first: every lane's max is -inf when it meets them
    x[2, ::2] = -INF
    (y,) = run(row_op(op), [x])
    masked = x == -INF
    assert (y[masked] == (0.0 if op == "softmax" else -INF)).all()
    assert y[~masked].isfinite().all()


@pytest.mark.nonfinite
def test_cross_entropy_specials(backend: str) -> None:
    """Loss and dlogits of rows with -inf, NaN and +inf logits, as eager's."""
    x = special_rows(33001)
    t = targets(5, 33001)
    t[3] = 5  # a finite logit
    loss, dlogits = run(ce_fwd_bwd(5, 33001, F32), [x, t])
    assert loss[:3].isnan().all() and dlogits[:3].isnan().all()
    assert loss[3:].isfinite().all() and dlogits[3:].isfinite().all()


@pytest.mark.nonfinite
def test_all_equal_and_huge_rows(backend: str) -> None:
    """A constant row (every element grows nothing), a row of huge values (no overflow:
    every exponent is <= 0) and a row where the max arrives last."""
    x = randn(3, 33001)
    x[0].fill_(3.0)
    x[1] = x[1] * 1e37
    x[2] = torch.arange(33001, dtype=F32, device=DEVICE) * 1e-3
    (y,) = run(row_op("softmax"), [x])
    assert y.isfinite().all()


# -- compiled for sm_90: no spills, the estimate holds -------------------------------------------
def _gpu_source(k):  # noqa: ANN001, ANN202
    """A copy of Triton kernel `k` holding the source rendered for a GPU, not the
    interpreter (whose aligned-start walk masks its head and tail loads exactly)."""
    import copy

    from fuser.codegen.triton.source import render_triton
    from tests.golden.cases import gpu_variant

    with gpu_variant():
        source = render_triton(k.plan)
    gpu = copy.copy(k)
    gpu.source = source
    return gpu


def within(est: int, real: int) -> bool:
    return abs(est - real) <= max(0.15 * real, 8)


def _resource_cases() -> list[tuple[str, FusionDefinition, list[torch.Tensor]]]:
    cases = [
        ("softmax_bf16_50257", row_op("softmax", BF16), [meta(4096, 50257, dtype=BF16)]),
        ("softmax_bf16_128256", row_op("softmax", BF16), [meta(4096, 128256, dtype=BF16)]),
        ("log_softmax_f32_128256", row_op("log_softmax"), [meta(4096, 128256, dtype=F32)]),
    ]
    for name, dt in (("bf16", BF16), ("f32", F32)):
        for cols in (50257, 128256):
            ins = [meta(8192, cols, dtype=dt), meta(8192, dtype=torch.int64)]
            cases.append((f"ce_{name}_{cols}", ce_fwd_bwd(8192, cols, dt), ins))
    return cases


@pytest.mark.skipif(not HAVE_NVRTC, reason="NVRTC through cuda-python is not installed")
@pytest.mark.parametrize("be", ["triton", "cuda"])
def test_online_kernels_compile_without_spills(be: str) -> None:
    """The chosen looped schedules of softmax, log_softmax and cross-entropy (50257 and
    128256 columns, bf16 and fp32) compile for sm_90 without spills, and use the
    registers the backend's estimate says (15% or 8)."""
    from fuser.backends.registry import get_backend
    from fuser.runtime.resources import many_resources

    kernels = []
    for name, fd, inputs in _resource_cases():
        (k,) = fd.compile(inputs, "h100", be)
        assert k.schedule.kind == "inner_looped" and looped_plan(k.spec).pairs, name
        kernels.append((name, k))
    ks = [k for _, k in kernels]
    if be == "triton":  # the source a GPU compiles (the interpreter's masks its edges exactly)
        ks = [_gpu_source(k) for k in ks]
    resources = many_resources(ks) if be == "triton" else [k.resources("sm_90") for k in ks]
    bad = []
    for (name, k), r in zip(kernels, resources):
        est = get_backend(be).estimate(k.plan)
        assert k.schedule.estimate.registers == est, name  # chosen with this model
        if r["spill_bytes"] or not within(est, r["registers"]):
            bad.append(f"{name} {k.schedule.short()}: est {est}, {r}")
    assert not bad, "\n".join(bad)
