"""Regression tests for bugs the fuzzer found in the frontend and code generation: rank-0
and Python scalar operands, ops on two float dtypes, bf16 on the interpreter, a column
reduction's scalar values."""

from __future__ import annotations

import math

import pytest
import torch
from fuzz_helpers import BF16, DEVICE, F16, F32, INTERP, assert_agrees, define, randn, transposed

from fuser import FusionDefinition


# -- bugs the fuzzer found, fixed ---------------------------------------------------------------
def test_rank0_tensor_next_to_a_tensor() -> None:
    """A rank-0 tensor operand from outside the kernel had no kind (KeyError in the
    executor); found as mean(x[1]) broadcast back, and as a 0-d input."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        s = fd.define_tensor([])
        fd.add_output(fd.ops.mul(x, s))
        fd.add_output(fd.ops.sum(fd.ops.add(x, s), dims=[1]))

    assert_agrees(define(build_fn), [randn(3, 5), randn(seed=1)])

    def mean_sub(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.sub(x, fd.ops.mean(x, dims=[0])))

    fd = define(mean_sub)
    assert_agrees(fd, [randn(1)])
    assert_agrees(fd, [randn(40, seed=2)])


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_python_scalar_rounds_like_eager(dtype: torch.dtype) -> None:
    """Eager add/sub cast a Python scalar to the tensor's dtype first (bf16 + 0.01 adds
    0.010009765625); fuser added 0.01 in float32, one ulp off wherever that decides the
    rounding, and pow(|log(x + 0.01)|...) amplified it to 6 ulps. Bitwise equal now.
    (mul/div: CPU eager keeps the scalar, CUDA eager rounds it; one ulp either way.)"""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.add(x, 0.01))
        fd.add_output(0.3 - x)
        fd.add_output(x - 1e-3)
        fd.add_output(fd.ops.mul(0.1, x))
        fd.add_output(fd.ops.div(x, 3.3))

    x = (torch.arange(1, 4097, device=DEVICE) / 4096).to(dtype)
    fd = define(build_fn)
    got = fd.execute([x])
    eager = [x + 0.01, 0.3 - x, x - 1e-3, 0.1 * x, x / 3.3]
    # CUDA eager keeps every scalar in float32 (its opmath), add/sub included: there the
    # rounded scalar is one ulp off where it decides the rounding, as mul/div are on CPU
    exact = 3 if DEVICE == "cpu" else 0
    for i, (g, e) in enumerate(zip(got[:exact], eager[:exact])):
        assert torch.equal(g, e), (i, (g != e).sum().item())
    for g, e in zip(got[exact:], eager[exact:]):  # an ulp of operands up to 1.3 (0.3 - x)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(g, e, atol=eps, rtol=eps)


def test_softmax_over_a_middle_dim() -> None:
    """ATen segments handed kernels stride-0 broadcast views the kernels read as dense
    (garbage and inf); fixed in 0aba7dc (evaluate: broadcast/iota results dense)."""
    fd = define(lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([1, -1, -1]), dim=1)))
    assert_agrees(fd, [randn(1, 2, 2)])
    assert_agrees(fd, [randn(1, 9, 130, seed=1)])


# -- bugs the fuzzer found in code generation, fixed (fuser/codegen) -------------------------
def test_relu_propagates_nan() -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.relu(fd.define_tensor([-1, -1]))))
    x = randn(2, 33)
    x[1, 4] = math.nan
    assert_agrees(fd, [x])


def test_tanh_of_small_values() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1])
        t = fd.ops.tanh(x)
        fd.add_output(fd.ops.div(t, x))  # tanh(x) / x: 1 - x^2/3, exactly as accurate
        fd.add_output(fd.ops.gt(t, x))  # never true for x > 0

    x = torch.logspace(-6, -1, 400, device=DEVICE)
    fd = define(build_fn)
    ratio, above = fd.execute([x])
    torch.testing.assert_close(ratio, torch.tanh(x) / x, atol=0, rtol=1e-6)
    assert not above.any()


@pytest.mark.nonfinite
def test_pow_one_to_the_inf() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.pow(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])))

    base = torch.tensor([[1.0, 1.0, 2.0, 0.5, -1.0]], device=DEVICE)
    exponent = torch.tensor([[math.inf, -math.inf, 3.0, math.inf, math.inf]], device=DEVICE)
    assert_agrees(define(build_fn), [base, exponent])


def test_softmax_of_a_broadcast_column() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        col = fd.ops.mean(x, dims=[0])
        wide = fd.ops.broadcast_in_dim(col, shape=x.shape, broadcast_dims=[1])
        fd.add_output(fd.ops.softmax(wide, dim=-1))

    assert_agrees(define(build_fn), [randn(4, 9)])


@pytest.mark.nonfinite
def test_var_mean_of_a_row_holding_inf() -> None:
    """ATen's var_mean (Welford) gives a NaN mean for a row holding an inf; torch.mean and
    fuser's two-pass decomposition give the inf. The checker accepts fuser's (documented
    in check.compare_output); this pins fuser's answer."""

    def build_fn(fd: FusionDefinition) -> None:
        var, mean = fd.ops.var_mean(fd.define_tensor([-1, -1]), dims=[1])
        fd.add_output(mean)
        fd.add_output(var)

    x = randn(2, 5)
    x[0, 3] = -math.inf
    fd = define(build_fn)
    mean, var = fd.execute([x])
    assert mean[0].item() == -math.inf and torch.equal(mean[1:], x[1:].mean(dim=1))
    assert var[0].isnan() and not var[1].isnan()
    if DEVICE == "cpu":  # CUDA's var_mean gives the inf too
        assert fd.reference([x])[0][0].isnan()  # eager's NaN
    assert_agrees(fd, [x])


# Triton chose its own dtype for an op on two float dtypes: tl.div_rn rejected float32 with
# float16 ("Expected dtype fp32 but got fp16"), float16 + bfloat16 ran in float16 (its
# rule 3) where torch promotes to float32. The renderer now converts every operand to the
# dtype the IR gives the op (float32 for a 16-bit one) first.
def test_div_of_float32_by_float16() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.div(fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1], F16)))

    y = randn(3, 5, dtype=F16, seed=1).abs() + 0.5
    assert_agrees(define(build_fn), [randn(3, 5), y])


def test_add_float16_bfloat16() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        fd.add_output(fd.ops.add(fd.define_tensor([-1], F16), fd.define_tensor([-1], BF16)))

    assert_agrees(define(build_fn), [randn(511, dtype=F16), randn(511, dtype=BF16, seed=1)])


MIXED = [(F32, F16), (F32, BF16), (F16, BF16), (torch.float64, BF16)]


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "_".join(str(t)[6:] for t in d))
def test_ops_on_two_float_dtypes(dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    """Every binary op family on [3, 37] operands of two float dtypes, one transposed;
    a third of the elements equal in both (comparisons at their ties)."""
    da, db = dtypes

    def build_fn(fd: FusionDefinition) -> None:
        a, b = fd.define_tensor([-1, -1], da), fd.define_tensor([-1, -1], db)
        for op in ("add", "sub", "mul", "div", "maximum", "minimum", "gt", "eq", "le"):
            fd.add_output(getattr(fd.ops, op)(a, b))
        fd.add_output(fd.ops.pow(fd.ops.add(fd.ops.abs(a), 0.5), b))
        fd.add_output(fd.ops.where(fd.ops.gt(a, 0.0), a, b))

    a = transposed(3, 37, BF16).to(da)  # values both dtypes hold exactly
    b = randn(3, 37, dtype=db, seed=1)
    b[:, ::3] = a[:, ::3].to(db)
    fd = define(build_fn)
    assert_agrees(fd, [a, b])
    for i, (g, e) in enumerate(zip(fd.execute([a, b]), fd.reference([a, b]))):
        assert g.dtype == e.dtype, (i, g.dtype, e.dtype)


@pytest.mark.parametrize("op", ["exp", "div", "gt"])
def test_int_operands_of_float_ops(op: str) -> None:
    """An int tensor in an op whose dtype is float (exp, true division, a comparison with
    a Python float): Triton's tl.exp and tl.div_rn rejected int32 operands."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], torch.int32)
        fd.add_output(
            fd.ops.div(x, 3) if op == "div" else fd.ops.gt(x, 0.5) if op == "gt" else fd.ops.exp(x)
        )

    x = torch.arange(-50, 61, dtype=torch.int32, device=DEVICE).view(37, 3).t()
    assert_agrees(define(build_fn), [x])


# kernels.outer_reduction emitted COL nodes before its row loop and FULL/ROW nodes in it,
# never SCALAR ones: with one row, broadcast_in_dim(var[1] -> [1, 1]) is SCALAR and was
# never defined (NameError); the prologue and the split finalize kernel emit them now
def test_column_sum_of_one_row_minus_its_variance() -> None:
    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([1, -1])
        var, _ = fd.ops.var_mean(x, dims=[1], correction=0, keepdim=True)
        wide = fd.ops.broadcast_in_dim(var, shape=x.shape, broadcast_dims=[0, 1])
        fd.add_output(fd.ops.sum(fd.ops.sub(x, wide), dims=[0]))

    assert_agrees(define(build_fn), [randn(1, 511)])


@pytest.mark.parametrize("rows", [1, 3])
def test_column_sum_with_scalar_values(rows: int) -> None:
    """A 0-d input and values computed from it alone, in the row loop and after the
    column sum, on a transposed [rows, 37]."""

    def build_fn(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        half = fd.ops.mul(s, 0.5)
        col = fd.ops.sum(fd.ops.mul(x, half), dims=[0])
        fd.add_output(fd.ops.sub(col, fd.ops.exp(s)))

    assert_agrees(define(build_fn), [transposed(rows, 37), randn(seed=2)])


# Triton's interpreter faults that fuser's generated source now avoids, with the same GPU
# code (SASS for sm_90 compared before and after)
def test_where_bf16_with_python_scalar() -> None:
    """where(cond, <Python float>, bf16 tile) made Triton's interpreter build a bf16
    constant (InterpreterBuilder has no get_bf16); a 16-bit where now selects in float32."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.where(fd.ops.gt(x, 0.0), -math.inf, x))

    assert_agrees(define(build_fn), [randn(2, 3, dtype=BF16)])


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_python_scalars_in_comparisons_and_where(dtype: torch.dtype) -> None:
    """Eager rounds a Python scalar to the tensor's dtype before it compares or selects
    (bf16(0.1) == 0.1 is true); the comparisons run in float32 with the rounded literal."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.eq(x, 0.1))
        fd.add_output(fd.ops.gt(x, 0.1))
        fd.add_output(fd.ops.where(fd.ops.lt(x, 0.1), 0.1, x))
        fd.add_output(fd.ops.where(fd.ops.gt(x, 1.0), -math.inf, x))
        fd.add_output(fd.ops.mul(fd.ops.maximum(x, 0.1), 3.0))

    x = transposed(3, 37, dtype)
    x[0, :4] = torch.tensor(0.1).to(dtype)
    fd = define(build_fn)
    got, eager = fd.execute([x]), fd.reference([x])
    for i in range(4):
        assert torch.equal(got[i], eager[i]), (i, got[i], eager[i])
    assert_agrees(fd, [x])


def test_pow_python_scalar_exponent() -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.pow(fd.define_tensor([-1, -1]), 2.0)))
    assert_agrees(fd, [randn(3, 5)])


@pytest.mark.parametrize(
    "exponent",
    [3.0, 0.5, -1.0, 0.0, pytest.param(math.inf, marks=pytest.mark.nonfinite), math.nan],
)
def test_pow_scalar_exponent_and_base(exponent: float) -> None:
    """pow with a Python float exponent or base, or a 0-d tensor one, on negative, zero
    and one bases: the pow_ helper broadcasts its operands before it `&`s comparisons."""

    def build_fn(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        fd.add_output(fd.ops.pow(x, exponent))
        fd.add_output(fd.ops.pow(exponent, fd.ops.floor(x)))
        fd.add_output(fd.ops.pow(x, s))
        fd.add_output(fd.ops.pow(s, fd.ops.floor(x)))

    x = transposed(3, 37) * 3
    x[0, :3] = torch.tensor([0.0, 1.0, -1.0])
    s = torch.tensor(exponent, device=DEVICE)
    assert_agrees(define(build_fn), [x, s])


def test_logical_and_with_a_scalar_comparison() -> None:
    def build_fn(fd: FusionDefinition) -> None:  # as the fuzzer shrank it
        x = fd.define_tensor([-1])
        p = fd.ops.softmax(fd.ops.neg(fd.ops.sum(x, dims=[0], keepdim=True)), dim=-1)
        big = fd.ops.broadcast_in_dim(fd.ops.gt(p, 1.0), shape=x.shape, broadcast_dims=[0])
        fd.add_output(fd.ops.logical_and(fd.ops.gt(x, 1.0), big))

    assert_agrees(define(build_fn), [randn(2)])


def test_logical_ops_with_a_scalar_operand() -> None:
    """logical_and/or of a tile and a 0-d comparison, both ways round, and of a float
    tensor (nonzero is true); rendered as tl.where, not `&`/`|`."""

    def build_fn(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        tile, flat = fd.ops.gt(x, 0.0), fd.ops.gt(s, 0.0)
        fd.add_output(fd.ops.logical_and(tile, flat))
        fd.add_output(fd.ops.logical_or(flat, tile))
        fd.add_output(fd.ops.logical_and(flat, tile))
        fd.add_output(fd.ops.logical_or(tile, fd.ops.floor(x)))

    for sign in (1.0, -1.0):
        assert_agrees(define(build_fn), [transposed(3, 37), torch.tensor(sign, device=DEVICE)])


@INTERP
def test_bf16_comparisons_on_the_interpreter() -> None:
    """Triton's interpreter keeps bf16 as uint16 bit patterns and compares those as
    unsigned ints (-1.5 > 1.5): bf16 operands are compared after .to(tl.float32) (exact;
    a GPU makes the same code)."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.gt(fd.ops.neg(x), x))
        fd.add_output(fd.ops.le(x, 0.5))

    fd = define(build_fn)
    x = torch.tensor([[-1.5, 2.0, -3.0, 0.25]], dtype=BF16)
    got = fd.execute([x])
    assert [g.tolist() for g in got] == [r.tolist() for r in fd.reference([x])]


@INTERP
def test_bf16_ops_on_the_interpreter() -> None:
    """Comparisons, maximum, isnan and logical_not of bf16 on random [3, 37] data with
    zeros of both signs and a NaN, as users' CPU runs get them."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        y = fd.ops.neg(x)
        fd.add_output(fd.ops.lt(x, y))
        fd.add_output(fd.ops.ge(x, 0.0))
        fd.add_output(fd.ops.ne(x, y))
        fd.add_output(fd.ops.maximum(x, y))
        fd.add_output(fd.ops.isnan(x))
        fd.add_output(fd.ops.logical_not(x))

    x = transposed(3, 37, BF16)
    x[0, :3] = torch.tensor([0.0, -0.0, math.nan])
    fd = define(build_fn)
    got = fd.execute([x])
    for g, e in zip(got, fd.reference([x])):
        assert (
            torch.equal(g, e)
            or torch.equal(g.isnan(), e.isnan())
            and torch.equal(g.nan_to_num(), e.nan_to_num())
        ), (g, e)


@INTERP
def test_cast_bool_to_bf16_on_the_interpreter() -> None:
    """cast(bool, bf16) copied the integer into the bit pattern in Triton's interpreter;
    casts to a 16-bit float now go through float32 (exact for bool)."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], BF16)
        fd.add_output(fd.ops.cast(fd.ops.gt(x, 0.0), BF16))

    fd = define(build_fn)
    x = randn(2, 4, dtype=BF16)
    got = fd.execute([x])
    assert torch.equal(got[0], fd.reference([x])[0])


@pytest.mark.parametrize("src", [torch.bool, torch.int32, F16, torch.float64])
def test_casts_to_bf16_go_through_float32(src: torch.dtype) -> None:
    """Casts to bf16 from bool, int32, float16 and float64 (values bf16 holds)."""
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1, -1], src), BF16)))
    x = transposed(3, 37, BF16) * 64
    x = (x > 0) if src == torch.bool else x.to(src)
    got = fd.execute([x])
    assert torch.equal(got[0], fd.reference([x])[0])


def test_float32_to_bf16_rounds_to_nearest_even() -> None:
    """Bit for bit as torch: ties to even both ways, values just off a tie, overflow to
    inf past bf16's largest, subnormals, signed zeros, inf and NaN. Triton's interpreter
    truncates this conversion; interpreted kernels round with the bf16_rne helper."""
    base = 1.0 + 2.0**-7  # bf16's last mantissa bit set: a tie above rounds up
    ties = [1.0 + 2.0**-8, base + 2.0**-8, -(1.0 + 2.0**-8), -(base + 2.0**-8)]
    near = [1.0 + 2.0**-8 + 2.0**-20, 1.0 + 2.0**-8 - 2.0**-20, 3.0e38, 3.4e38, -3.4e38]
    small = [1e-40, -1e-40, 2.0**-133 * 3, 0.0, -0.0, math.inf, -math.inf, math.nan]
    special = torch.tensor(ties + near + small, dtype=F32)
    x = torch.cat([special, torch.randn(200, generator=torch.Generator().manual_seed(3)) * 7])
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1], F32), BF16)))
    got = fd.execute([x.to(DEVICE)])[0].cpu()
    want = x.to(BF16)
    assert torch.equal(got.view(torch.int16)[: -1 - 200], want.view(torch.int16)[: -1 - 200])
    assert got[-201].isnan()
    assert torch.equal(got[-200:], want[-200:])


def test_bf16_subnormals_widen_exactly() -> None:
    """bf16 subnormals (below 2^-126) widen to the same float32 values as torch's, through
    a cast and as operands of arithmetic and comparisons."""

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1], BF16)
        fd.add_output(fd.ops.cast(x, F32))
        fd.add_output(fd.ops.mul(x, 2.0**100))
        fd.add_output(fd.ops.gt(x, 0.0))

    bits = torch.tensor([1, 3, 0x7F, 0x8001, 0x807F, 0, 0x8000, 0x3F80], dtype=torch.int32)
    x = bits.to(torch.uint16).view(BF16)
    fd = define(build_fn)
    got = fd.execute([x.to(DEVICE)])
    for g, e in zip(got, fd.reference([x])):
        assert torch.equal(g.cpu(), e), (g, e)


def test_float64_to_bf16_rounds_through_float32() -> None:
    """torch converts a double to bf16 through float (c10): 1 + 2^-8 + 2^-30 is a tie in
    float32 and rounds to 1.0, where one rounding gives 1.0078125."""
    fd = define(lambda fd: fd.add_output(fd.ops.cast(fd.define_tensor([-1], torch.float64), BF16)))
    x = torch.tensor([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 3.0], dtype=torch.float64)
    x = x.to(DEVICE)
    assert torch.equal(fd.execute([x])[0], fd.reference([x])[0])
    assert fd.reference([x])[0][0].item() == 1.0
