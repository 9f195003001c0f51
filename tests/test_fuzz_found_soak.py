"""Regression tests for the mismatches of the fuzzer's GPU soaks (seeds 11 to 17; the
result folders under benchmarks/results/ hold the runs)."""

from __future__ import annotations

import math

import pytest
import torch
from fuzz_helpers import BF16, DEVICE, F16, F32, assert_agrees, define, randn

from fuser import FusionDefinition
from fuser.fuzz.case import InputSpec, make_input
from fuser.fuzz.check import compare, compare_output, judge
from fuser.fuzz.reference import reference


# -- GPU soak of 2026-11-22 (seed 11, 8199 fusions): its two mismatches -----------------
@pytest.mark.nonfinite
def test_pow_near_the_float32_overflow_is_accurate() -> None:
    """pow with results near 2**128: the float32 exp2(b * log2 a) of the GPU was ~1e-5
    off and stayed finite where torch's powf overflows (batch seed 11800000)."""
    g = torch.Generator().manual_seed(11)
    a = torch.rand(2000, generator=g) * 50 + 1.5
    b = (127.99 / torch.log2(a)) * (1 + (torch.rand(2000, generator=g) - 0.5) * 2e-4)
    fd = define(
        lambda fd: fd.add_output(fd.ops.pow(fd.define_tensor([-1]), fd.define_tensor([-1])))
    )
    (got,) = fd.execute([a.to(DEVICE), b.to(DEVICE)])
    exact = torch.pow(a.double(), b.double())
    fmax = torch.finfo(torch.float32).max
    clear = (exact - fmax).abs() > 4 * fmax * torch.finfo(torch.float32).eps
    assert bool(clear.sum() > 1500) and bool((exact[clear] > fmax).any())
    want = exact.float()  # correctly rounded, inf past the largest float
    torch.testing.assert_close(got.cpu()[clear], want[clear], rtol=4e-7, atol=0.0)


def test_chaotic_elements_are_not_judged() -> None:
    """cos of a 1e9 argument, renormalized (batch seed 12500001): perturbing each op by a
    few eps moves the float64 answer across the output's whole range, so no float32 value
    is wrong there; an element that perturbations barely move still is."""
    ref64 = torch.tensor([0.0105, 0.5, -0.7], dtype=torch.float64)
    eager = torch.tensor([0.1325, 0.5, -0.7])
    moved = [ref64 + torch.tensor([1.26, 0.0, 0.0], dtype=torch.float64)]
    got = torch.tensor([-1.39, 0.5, -0.7])
    assert compare_output(0, got, eager, ref64, moved, 16) is None
    bad = torch.tensor([-1.39, 0.9, -0.7])
    assert "out of tolerance" in (compare_output(0, bad, eager, ref64, moved, 16) or "")
    # an output that is ~0 everywhere: chaotic or not, a value far outside its scale is wrong
    tiny = torch.full((4,), 1e-13, dtype=torch.float64)
    far = [tiny + 1e-3]
    way_off = torch.full((4,), 5.0)
    msg = compare_output(0, way_off, tiny.float(), tiny, far, 16) or ""
    assert "out of tolerance" in msg


# -- GPU soak, seed 12 (benchmarks/results/h100-2026-11-22-fuzz-seed12): FMA contraction --
def _product_minus_itself(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1], F16)
    doubled = fd.ops.add(x, x)
    mean = fd.ops.mean(doubled, dims=[0])
    product = fd.ops.mul(doubled, fd.ops.broadcast_in_dim(mean, [1, 1], [1]))
    fd.add_output(fd.ops.sub(product, product))


def _max_minus_product(fd: FusionDefinition) -> None:
    x = fd.define_tensor([5140], F32)
    var, _ = fd.ops.var_mean(x, dims=[0], correction=0)
    xv = fd.ops.mul(x, var)
    gap = fd.ops.sub(fd.ops.maximum(var, xv), xv)
    fd.add_output(gap)
    fd.add_output(fd.ops.softmax(fd.ops.minimum(gap, x), dim=-1))


def _scaled_compare(fd: FusionDefinition) -> None:
    x = fd.define_tensor([1, -1, -1], F16)
    scaled = fd.ops.mul(0.001, fd.ops.add(x, x))
    wide = fd.ops.cast(scaled, F32)
    above = fd.ops.gt(wide, fd.ops.cast(fd.ops.gt(wide, 1.0), F32))
    fd.add_output(fd.ops.logical_and(fd.ops.eq(scaled, 0.1), above))


@pytest.mark.parametrize(
    "build_fn,shape,dtype,scale,seed",
    [
        (_product_minus_itself, (1, 1), "float16", 1.0, 0),
        (_max_minus_product, (5140,), "float32", 1000.0, 4036),
    ],
    ids=["product_minus_itself", "max_minus_product"],
)
def test_no_multiply_add_contraction(build_fn, shape, dtype: str, scale: float, seed: int) -> None:
    """On the GPU, LLVM contracted a multiply and a later subtract into one FMA (Triton's
    default): x*y - x*y gave the product's rounding error (-0.00108 in fp16, not 0) and
    max(v, x*v) - x*v gave +-60 at 1e9, which a softmax then picked out (0.993 where eager
    has 0.0004). Kernels are compiled without floating-point contraction now."""
    fd = define(build_fn)
    inputs = [make_input(InputSpec(shape, dtype, "contiguous"), seed, scale, device=DEVICE)]
    assert not compare(fd, inputs), compare(fd, inputs)
    gap = fd.execute(inputs)[0]
    assert torch.equal(gap == 0, fd.reference(inputs)[0] == 0)


def test_scalar_product_compared_at_a_tie() -> None:
    """Soak seed 12: 0.001 * (x + x) == 0.1 for fp16 x = 50 is True in the kernel and in
    eager (`0.001 * t`, the scalar unrounded); the reference evaluator made the scalar a
    0-d float32 tensor, which ATen rounds to fp16 first (False). It passes a constant to
    mul/div as the Python number now, the tensor first."""
    fd = define(_scaled_compare)
    spec = InputSpec((1, 64, 511), "float16", "contiguous")
    inputs = [make_input(spec, 4036, 30.0, device=DEVICE)]
    assert not compare(fd, inputs), compare(fd, inputs)


# -- GPU soak, seed 14 (benchmarks/results/h100-2026-11-22-fuzz-seed13-14) ------------------
def _exp_through_half(fd: FusionDefinition) -> None:
    x = fd.define_tensor([-1, -1], F32)
    half = fd.ops.cast(fd.ops.neg(fd.ops.exp(x)), F16)
    fd.add_output(fd.ops.cast(half, F32))


def test_value_at_a_half_rounding_boundary() -> None:
    """Soak seed 14: exp(3.0684164) is one float32 ulp above 21.5078125, the midpoint of
    two float16 neighbours, so a GPU's approximate exp (an ulp low) rounds -exp(x) to
    -21.5 where eager has -21.515625, and the float32 output is judged at float32's
    tolerance. The perturbed references missed it: the all-up run moved exp up and then
    neg up, which cancel. A narrowing cast now moves its operand in the run's direction,
    so one of the two signed runs lands on the other neighbour, and only there."""
    fd = define(_exp_through_half)
    x = randn(2, 16)
    x[1, 5] = 3.0684164
    graph = fd.bind([x])
    eager = fd.reference([x])[0]
    at = eager[1, 5].item()
    assert at in (-21.5, -21.515625)
    other = -21.5 if at == -21.515625 else -21.515625
    signed = {
        reference(graph, [x], seed=i, sign=s)[0][1, 5].item() for i, s in ((0, 1.0), (1, -1.0))
    }
    assert signed == {-21.5, -21.515625}
    got = eager.clone()
    got[1, 5] = other
    assert not judge(fd, [x], [got])
    # an element away from a boundary may not move to a neighbour
    got[0, 3] = float(torch.tensor(got[0, 3].item()).half().float() * (1 + 2**-10))
    assert "out of tolerance" in "".join(judge(fd, [x], [got]))


def _broadcast_row_normalized(fd: FusionDefinition, cols: int) -> None:
    # the soak's shape: a per-row value broadcast over the row, rounded to fp16
    per_row = fd.define_tensor([1, 3], F32)
    wide = fd.ops.broadcast_in_dim(per_row, shape=[1, 3, cols], broadcast_dims=[0, 1])
    row = fd.ops.cast(wide, F16)
    y, mean, rstd = fd.ops.layer_norm(row, eps=1e-5, return_mean_rstd=True)
    for t in (y, mean, rstd):
        fd.add_output(t)
    as_float = fd.ops.cast(row, F32)
    fd.add_output(fd.ops.sum(as_float, dims=[2]))
    fd.add_output(fd.ops.max(as_float, dims=[2]))
    # pow amplifies any error in rstd (the soak's pow turned a 14x error into 4x)
    fd.add_output(fd.ops.pow(fd.ops.mul(rstd, 0.003), 40.0))  # 0.95^40, not inf


@pytest.mark.parametrize("cols", [20480, 1000, 3])
def test_sum_of_a_broadcast_row(cols: int) -> None:
    """Soak seed 14: a layer_norm over a per-row value broadcast across 20480 columns
    gave rstd 22 where eager has 316. Triton laid the [1, 1] value broadcast to
    [1, 4096] out with the whole row in every thread and summed it serially: 20480
    copies of 746.5 came to 15287396, not 15288320, and x - mean was 0.045, not 0. A
    reduction of a value that is the same across the row is now n * x (a sum) or x (a
    max or min), never a tl.sum of a broadcast."""
    fd = define(lambda fd: _broadcast_row_normalized(fd, cols))
    per_row = torch.tensor([[-118.7372, 211.0013, 746.2682]], device=DEVICE)
    y, mean, rstd, total, top, amplified = fd.execute([per_row])
    row = per_row.half().float()
    assert torch.equal(total, row * cols)  # exact: n * x fits float32 here
    assert torch.equal(top, row)
    assert torch.equal(mean.flatten(), row.flatten())
    assert torch.equal(y, torch.zeros_like(y))
    expected_rstd = torch.rsqrt(torch.tensor(1e-5)).item()
    assert torch.allclose(rstd, torch.full_like(rstd, expected_rstd), rtol=1e-6)
    assert amplified.min() > 0.1
    assert_agrees(fd, [per_row])
    # on any machine: the kernel for an H100 sums the broadcast row as a product
    (kernel,) = fd.compile([per_row.cpu()], device="h100")
    if kernel.backend == "triton" and kernel.schedule.kind == "inner_persistent":
        # every reduction here is of a row-constant value (the squares of x - mean too)
        source = kernel.source
        assert "tl.sum(" not in source and "tl.reduce(" not in source, source
        assert f"* {cols}" in source


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
def test_constant_rows_normalize(dtype: torch.dtype) -> None:
    """Materialized constant rows: a 16-bit value's float32 sums are exact (every partial
    sum k * x fits 24 bits), so a layer_norm gives the bias, mean x and variance 0 as
    eager's Welford does; a float32 row of 24-bit values has a two-pass variance within
    float32 rounding of 0, which the checker accepts."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        b = fd.define_tensor([-1], dtype)
        y, mean, _ = fd.ops.layer_norm(x, bias=b, eps=1e-5, return_mean_rstd=True)
        var, _ = fd.ops.var_mean(x, dims=[1], correction=1)
        for t in (y, mean, var):
            fd.add_output(t)

    fd = define(build_fn)
    cols = 20480
    values = (torch.randn(4, 1, generator=torch.Generator().manual_seed(0)) * 1000).to(dtype)
    values[0, 0] = 734.5
    x = values.expand(4, cols).contiguous().to(DEVICE)
    b = randn(cols, dtype=dtype, seed=3)
    assert_agrees(fd, [x, b])
    if dtype != F32:
        y, mean, var = fd.execute([x, b])
        assert torch.equal(y, b.expand(4, cols))
        assert torch.equal(mean[:, 0], x[:, 0].float())
        assert torch.equal(var, torch.zeros_like(var))


# -- GPU soak, seed 15 (benchmarks/results/h100-2026-11-22-fuzz-seed15) ---------------------
def test_input_copied_for_one_kernel_only() -> None:
    """Soak seed 15: a [2, 2] input sliced out of wider rows (strides (5, 1)) fed two
    kernels: one broadcasting it over [2, 2, 5140], where its two dims must collapse into
    one row index and cannot, so the runtime passes a contiguous copy; and one reading it
    as a [2, 2] tile with its own strides. The copy was planned per tensor, not per
    kernel, so the second kernel read the 4-element copy with row stride 5 (0 and 28544
    where eager has 0.224 and -0.069). Copies are planned per kernel now."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1, -1])
        small = fd.define_tensor([-1, -1])
        wide = fd.ops.broadcast_in_dim(small, shape=x.shape, broadcast_dims=[0, 1])
        fd.add_output(fd.ops.gt(fd.ops.add(x, wide), 0.0))
        fd.add_output(fd.ops.cast(small, BF16))

    fd = define(build_fn)
    x = randn(2, 2, 5140)
    small = randn(2, 5, seed=1)[:, 1:3]
    assert small.stride() == (5, 1)
    assert_agrees(fd, [x, small])
    assert len(fd.kernels) == 2
    assert torch.equal(fd.execute([x, small])[1], small.to(BF16))


@pytest.mark.nonfinite
def test_rms_norm_of_a_row_holding_inf() -> None:
    """Soak seed 15 (four cases): CUDA ATen's fused rms_norm of a float16 row holding an
    infinity is NaN across the row; by its definition x * rsqrt(mean(x^2) + eps), which
    CPU ATen and fuser compute, the row's finite elements are 0 and its infinities NaN.
    The checker judges by the definition; this pins fuser's answer."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        w = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.rms_norm(fd.ops.neg(x), weight=w, eps=1e-6))

    fd = define(build_fn)
    x = randn(3, 511, dtype=F16)
    x[1, 7] = math.inf
    x[1, 300] = -math.inf
    w = randn(511, dtype=F16, seed=1)
    assert_agrees(fd, [x, w])
    (y,) = fd.execute([x, w])
    assert y[1, [7, 300]].isnan().all()
    finite = torch.ones(511, dtype=torch.bool, device=y.device)
    finite[[7, 300]] = False
    assert (y[1, finite] == 0).all() and y[[0, 2]].isfinite().all()


# -- GPU soak, seed 16 (benchmarks/results/h100-2026-11-22-fuzz-seed15-16) ------------------
def _sin_of_exp(fd: FusionDefinition) -> None:
    fd.add_output(fd.ops.sin(fd.ops.exp(fd.define_tensor([-1, -1], F32))))


def test_sin_of_an_approximate_exp() -> None:
    """Soak seed 16: the GPU's exp(5.7796) is 3 ulps below torch's 323.63718, and sin
    there moves 3e-5 an ulp: -0.053017 against eager's -0.053108. The perturbed runs
    moved exp up and then sin's result up by as much as its argument's move, which
    cancel where sin decreases; sin and cos now take their argument moved instead."""
    fd = define(_sin_of_exp)
    x = randn(4, 9)
    x[2, 5] = 5.779623031616211
    eager = fd.reference([x])[0]
    assert abs(eager[2, 5].item() - -0.053108197) < 1e-6
    got = eager.clone()
    got[2, 5] = -0.053016774  # sin of the float32 three below exp's
    assert not judge(fd, [x], [got])
    got[2, 5] = -0.055  # 60 ulps of the argument: not an approximate exp
    assert "out of tolerance" in "".join(judge(fd, [x], [got]))


def test_inf_where_float64_overflows_the_output() -> None:
    """Soak seed 16: a float32 pow at 3.409e38 in float64, past float32's largest value:
    fuser's more accurate row sum gave inf, eager's 3.08e38. The float64 evaluation is
    judged as the output dtype holds it (inf), so fuser's inf is right; an inf where
    float64 stays inside float32's range is still wrong."""
    eager = torch.tensor([3.0776e38, 1.0])
    ref64 = torch.tensor([3.4091e38, 1.0], dtype=torch.float64)
    got = torch.tensor([math.inf, 1.0])
    assert compare_output(0, got, eager, ref64, [ref64], 1) is None
    inside = torch.tensor([3.30e38, 1.0], dtype=torch.float64)
    assert "inf differs" in (compare_output(0, got, eager, inside, [inside], 1) or "")


# the soak's case (batch seed 17500013); `make_input` draws its data, infinities and NaNs
def _cancelled_gelu_compared(fd: FusionDefinition) -> None:
    t0 = fd.define_tensor(shape=[-1, -1], dtype=F32)
    t1 = fd.ops.gelu(t0, approximate="none")
    t2 = fd.ops.le(t1, t0)
    t3 = fd.ops.where(t2, t0, t1)
    t4 = fd.ops.cast(t3, dtype=BF16)
    t5 = fd.define_tensor(shape=[1, 31], dtype=F32)
    t6 = fd.ops.abs(t1)
    t7 = fd.define_scalar(0.01, dtype=F32)
    t8 = fd.ops.add(t6, t7)
    t9 = fd.ops.broadcast_in_dim(t5, shape=[t0.shape[0], 31], broadcast_dims=[0, 1])
    t10 = fd.ops.broadcast_in_dim(t8, shape=[t0.shape[0], 31], broadcast_dims=[0, 1])
    t11 = fd.ops.div(t9, t10)
    t12 = fd.define_tensor(shape=[1, -1], dtype=BF16)
    t13 = fd.ops.abs(t4)
    t14 = fd.define_scalar(1.0, dtype=F32)
    t15 = fd.ops.add(t13, t14)
    t16 = fd.ops.broadcast_in_dim(t12, shape=[t0.shape[0], t12.shape[1]], broadcast_dims=[0, 1])
    t17 = fd.ops.broadcast_in_dim(t15, shape=[t0.shape[0], t12.shape[1]], broadcast_dims=[0, 1])
    t18 = fd.ops.div(t16, t17)
    t19 = fd.ops.rms_norm(t4, eps=1e-06)
    t20 = fd.define_scalar(0.0, dtype=F32)
    fd.ops.minimum(t20, t13)  # unused, as in the soak's case
    t22 = fd.ops.ge(t6, t19)
    t23 = fd.ops.where(t22, t0, t4)
    t24 = fd.ops.broadcast_in_dim(t23, shape=[t0.shape[0], 31], broadcast_dims=[0, 1])
    t25 = fd.ops.add(t24, t11)
    t26 = fd.ops.max(t3, dims=[1], keepdim=False)
    t27 = fd.ops.broadcast_in_dim(t26, shape=[t0.shape[0], t0.shape[1]], broadcast_dims=[0])
    t28 = fd.ops.abs(t27)
    t29 = fd.define_scalar(1.0, dtype=F32)
    t30 = fd.ops.add(t28, t29)
    t31 = fd.ops.rsqrt(t30)
    t32 = fd.ops.mul(t3, t31)
    t33 = fd.ops.lt(t1, t23)
    t34 = fd.ops.where(t33, t32, t8)
    t35 = fd.ops.broadcast_in_dim(t18, shape=[t0.shape[0], t0.shape[1]], broadcast_dims=[0, 1])
    t36 = fd.ops.sub(t34, t35)
    fd.add_output(t1)
    fd.add_output(t4)
    fd.add_output(t8)
    fd.add_output(t15)
    fd.add_output(t25)
    fd.add_output(t26)
    fd.add_output(t34)
    fd.add_output(t36)


@pytest.mark.nonfinite
def test_comparison_of_a_cancelled_gelu() -> None:
    """Soak seed 16: where(lt(gelu(x), bf16(gelu(x))), NaN path, ...) at x = -4.555:
    fuser's gelu is below its bf16 rounding, float64's and the perturbed runs' above it
    (1 + erf(x / sqrt2) cancels: eager's float32 gelu is 1.5% off float64, fuser's
    0.35%). A checker limit: the perturbed runs move gelu and its rounding together. The
    checker now also runs the graph with every comparison whose operands lie within their
    own spread of each other turned the other way (`flip_uncertain`)."""
    fd = define(_cancelled_gelu_compared)
    specs = [
        InputSpec((1000, 31), "float32", "contiguous", symbolic=True),
        InputSpec((1, 31), "float32", "contiguous"),
        InputSpec((1, 31), "bfloat16", "offset", symbolic=True),
    ]
    seeds = (1386366, 1386367, 1386368)
    inputs = [make_input(s, i, 3.0, "nan_inf", device=DEVICE) for s, i in zip(specs, seeds)]
    assert_agrees(fd, inputs)


# -- GPU soak of 2026-11-27 (seed 23, 2384 fusions): 4 mismatches and 1 error -------------
@pytest.mark.parametrize("rows, cols", [(100, 511), (256, 77)])
def test_split_column_sum_with_a_masked_column_tile(backend: str, rows: int, cols: int) -> None:
    """A split-M column sum whose finalize tile reaches past the last column: Triton's
    `part_ok = (p + parts) < split & col_ok` parsed as `(p + parts) < (split & col_ok)`
    (in Python `&` binds tighter than `<`), so only the first partial row was added
    (batch seeds 23200000, 23600000, 23800002, 24000004). 100 x 511 is the soak's shape;
    both pick the split plan with a multi-row finalize step on the h100 preset."""
    x = randn(rows, cols, seed=3) * 0.1
    fd = define(lambda fd: fd.add_output(fd.ops.sum(fd.define_tensor([-1, -1]), dims=[0])))
    (got,) = fd.execute([x])
    assert "split" in str(fd.explain())
    torch.testing.assert_close(got, x.sum(0), atol=1e-5 * rows**0.5, rtol=1e-5)


def test_column_epilogue_reads_a_broadcast_parameter(backend: str) -> None:
    """An inner-outer kernel whose column epilogue subtracts a broadcast 1-D input: the
    broadcast was computed in the row kernel only and the finalize named a value it never
    defined (NameError t14 on Triton; batch seed 24100001). The finalize now recomputes
    what its epilogue reads from the parameters."""

    def build(fd: FusionDefinition) -> None:
        o = fd.ops
        x = fd.define_tensor([-1, -1], BF16)
        b = fd.define_tensor([-1], BF16)
        rmax = o.broadcast_in_dim(o.max(x, dims=[1], keepdim=True), shape=x.shape,
                                  broadcast_dims=[0, 1])  # fmt: skip
        centred = o.sub(x, rmax)
        colmax = o.max(o.mul(centred, rmax), dims=[0])
        bb = o.broadcast_in_dim(b, shape=[x.shape[1]], broadcast_dims=[0])
        fd.add_output(centred)
        fd.add_output(o.sub(colmax, bb))

    fd = define(build)
    assert_agrees(fd, [randn(6, 65, dtype=BF16, seed=7), randn(65, dtype=BF16, seed=8)])
    assert "inner_outer" in str(fd.explain())


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=["bf16", "f16", "f32"])
def test_column_op_after_a_masked_column_reduction(backend: str, dtype: torch.dtype) -> None:
    """A column sum whose tile reaches past the last column, feeding a column op: the
    lanes past the end are set to 1 before the op (no log(0) there). Done after the cast
    to bf16, Triton's interpreter had no bf16 scalar constant (found by test_fuzz in CI:
    `sum(dims=[0])` then `neg` of a [1, 1] bf16 input)."""

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.neg(fd.ops.sum(x, dims=[0])))
        fd.add_output(fd.ops.log(fd.ops.sum(fd.ops.abs(x), dims=[0])))

    for shape in ((1, 1), (5, 37)):
        assert_agrees(define(build), [randn(*shape, dtype=dtype, seed=shape[1])])
