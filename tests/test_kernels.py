"""Generated kernels, run with fd.execute, against fd.reference (ATen op by op).

Without a GPU fuser runs the Triton kernels in Triton's interpreter, so the shapes are
small in rows (2-3 rows at the long row lengths) while the row lengths are the real ones.
Every scheduler kind is covered, and each test asserts the kind that was chosen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest
import torch

from fuser import FusionDefinition
from fuser.examples import seed_inputs, seed_layernorm_fusion
from fuser.ir.dtypes import dtype_of
from fuser.ir.evaluate import tolerance

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
SEED_SWEEP = [768, 1024, 1280, 1536, 1600, 2048, 2560, 4096, 5140, 12288, 16384, 20480]
ODD_COLS = [1, 7, 127, 5140, 5142, 50257]
# 16-bit outputs are compared at their own precision: about one ulp relative (fp16 has
# 10 mantissa bits, 2**-10 < 1e-3; bf16 has 7, 2**-7 < 8e-3), plus a small atol for
# values near zero that carry the fp32 rounding error of the computation.
HALF_TOL = {F16: (1e-5, 1e-3), BF16: (1e-5, 8e-3)}


# -- helpers ------------------------------------------------------------------------------
def randn(*shape: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def misaligned(rows: int, cols: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    """Random [rows, cols] whose data starts one element into its storage."""
    t = randn(rows * cols + 1, dtype=dtype, seed=seed)[1:].view(rows, cols)
    assert t.storage_offset() == 1
    return t


def transposed(rows: int, cols: int, dtype: torch.dtype = F32, seed: int = 0) -> torch.Tensor:
    """Random [rows, cols] stored column-major (a transposed view)."""
    t = randn(cols, rows, dtype=dtype, seed=seed).t()
    assert not t.is_contiguous() or min(rows, cols) == 1
    return t


def define(build: Callable[[FusionDefinition], None], name: str = "t") -> FusionDefinition:
    with FusionDefinition(name) as fd:
        build(fd)
    return fd


def tol(dtype: torch.dtype, n: int, relative: bool = False) -> tuple[float, float]:
    """(atol, rtol) for an output of `dtype` after a reduction over `n` elements.

    `relative`: for outputs such as probabilities, whose error is relative to each
    value (a softmax row of 50257 holds values near 2e-5, far under any absolute
    tolerance): atol is then two ulps of the smallest subnormal, only.
    """
    atol, rtol = HALF_TOL[dtype] if dtype in HALF_TOL else tolerance(dtype_of(dtype), n)
    if relative and dtype.is_floating_point:
        fi = torch.finfo(dtype)
        atol = 2 * fi.smallest_normal * fi.eps
    return atol, rtol


def kinds(fd: FusionDefinition) -> list[str]:
    return [k.schedule.kind for k in fd.kernels]


def check(
    fd: FusionDefinition,
    inputs: Sequence[torch.Tensor],
    kind: str | list[str] | set[str],
    n: int = 1,
    equal_nan: bool = False,
    relative: Sequence[int] = (),
) -> list[torch.Tensor]:
    """Execute, assert the schedule kind(s), compare every output with the reference.

    `kind` is the kind of every kernel (a string), the kinds in order (a list) or the
    kinds allowed (a set); `n` is the reduction length the tolerance grows with;
    `relative` lists the outputs compared with a relative tolerance only (see tol()).
    """
    out = fd.execute(list(inputs))
    got_kinds = kinds(fd)
    if isinstance(kind, str):
        assert got_kinds and all(k == kind for k in got_kinds), got_kinds
    elif isinstance(kind, set):
        assert got_kinds and set(got_kinds) <= kind, got_kinds
    else:
        assert got_kinds == kind, got_kinds
    ref = fd.reference(list(inputs))
    assert len(out) == len(ref)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.shape == r.shape, f"output {i}: shape {list(o.shape)} != {list(r.shape)}"
        assert o.dtype == r.dtype, f"output {i}: dtype {o.dtype} != {r.dtype}"
        atol, rtol = tol(r.dtype, n, relative=i in relative)
        torch.testing.assert_close(
            o,
            r,
            atol=atol,
            rtol=rtol,
            equal_nan=equal_nan,
            msg=lambda m, i=i: (
                f"output {i} of {fd.name} ({fd.kernels and fd.kernels[0].schedule.short()}): {m}"
            ),
        )
    return out


# -- pointwise ----------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_bias_gelu(dtype: torch.dtype, approximate: str) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.gelu(fd.ops.add(x, b), approximate=approximate))

    fd = define(build, "bias_gelu")
    check(fd, [randn(9, 130, dtype=dtype), randn(130, dtype=dtype, seed=1)], "pointwise")


def test_bias_gelu_fp32_compute_fp16_io() -> None:
    """The usual mixed precision form: upcast, bias add, gelu, downcast."""

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        b = fd.define_tensor([-1], F16)
        y = fd.ops.add(fd.ops.cast(x, F32), fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(fd.ops.gelu(y, approximate="tanh"), F16))

    fd = define(build, "bias_gelu_mixed")
    check(fd, [randn(4, 1024, dtype=F16), randn(1024, dtype=F16, seed=1)], "pointwise")


def test_where_comparisons_broadcast() -> None:
    """where() over comparisons of a [rows, cols] tensor with a [cols] and a [rows, 1] one."""

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        c = fd.define_tensor([-1])
        r = fd.define_tensor([-1, 1])
        ops = fd.ops
        gt = ops.gt(x, c)
        inside = ops.logical_and(ops.ge(x, -0.5), ops.le(x, r))
        fd.add_output(ops.where(gt, x, ops.mul(c, 2.0)))
        fd.add_output(ops.where(inside, ops.sub(x, r), 0.0))
        fd.add_output(ops.logical_or(ops.lt(x, c), ops.eq(x, 0.0)))
        fd.add_output(ops.where(ops.ne(x, r), 1.0, -1.0))

    fd = define(build, "where_cmp")
    check(fd, [randn(5, 33), randn(33, seed=1), randn(5, 1, seed=2)], "pointwise")


def test_where_small_condition() -> None:
    """torch.where broadcasts all three operands: a [cols] condition selects columns."""

    def build(fd: FusionDefinition) -> None:
        c = fd.define_tensor([-1])
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.where(fd.ops.gt(c, 0.0), x, 0.0))
        fd.add_output(fd.ops.where(fd.ops.gt(c, 0.0), 1.0, x))

    fd = define(build, "where_small_cond")
    check(fd, [randn(33), randn(4, 33, seed=1)], "pointwise")


def test_row_broadcast() -> None:
    """A [rows] vector broadcast along the columns with broadcast_in_dim."""

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        s = fd.define_tensor([-1])
        sb = fd.ops.broadcast_in_dim(s, shape=x.shape, broadcast_dims=[0])
        fd.add_output(fd.ops.mul(fd.ops.exp(x), sb))

    fd = define(build, "row_bcast")
    check(fd, [randn(6, 70), randn(6, seed=1)], "pointwise")


CASTS = [(F32, F16), (F32, BF16), (F16, F32), (BF16, F32), (F16, BF16), (BF16, F16)]


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{a}-{b}".replace("torch.", "") for a, b in CASTS])
def test_casts(src: torch.dtype, dst: torch.dtype) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], src)
        y = fd.ops.cast(x, dst)
        fd.add_output(y)
        fd.add_output(fd.ops.add(y, fd.ops.cast(x, dst)))

    fd = define(build, "casts")
    # scaled so that some values round differently in the two 16-bit formats
    x = (randn(7, 45) * 300).to(src)
    check(fd, [x], "pointwise")


def test_pointwise_3d() -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1, -1], F16)
        b = fd.define_tensor([-1], F16)
        y = fd.ops.add(fd.ops.cast(x, F32), fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(fd.ops.relu(y), F16))

    fd = define(build, "pw3d")
    check(fd, [randn(2, 3, 1600, dtype=F16), randn(1600, dtype=F16, seed=1)], "pointwise")


# -- inner persistent: normalizations ---------------------------------------------------
@pytest.mark.parametrize("params", ["none", "w", "w_b"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_layer_norm(dtype: torch.dtype, params: str) -> None:
    cols = 1000

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype) if params != "none" else None
        b = fd.define_tensor([-1], dtype) if params == "w_b" else None
        fd.add_output(fd.ops.layer_norm(x, w, b, eps=1e-5))

    fd = define(build, "layer_norm")
    inputs = [randn(6, cols, dtype=dtype)]
    inputs += [
        randn(cols, dtype=dtype, seed=i + 1) for i in range({"none": 0, "w": 1, "w_b": 2}[params])
    ]
    check(fd, inputs, "inner_persistent", n=cols)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
def test_layer_norm_mean_rstd(dtype: torch.dtype) -> None:
    cols = 127

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        b = fd.define_tensor([-1], dtype)
        y, mean, rstd = fd.ops.layer_norm(x, w, b, return_mean_rstd=True)
        fd.add_output(y)
        fd.add_output(mean)
        fd.add_output(rstd)

    fd = define(build, "ln_stats")
    x = randn(7, cols, dtype=dtype) * 2 + 0.5
    out = check(
        fd,
        [x, randn(cols, dtype=dtype, seed=1), randn(cols, dtype=dtype, seed=2)],
        "inner_persistent",
        n=cols,
    )
    # mean and rstd keep the normalized dim, as torch.native_layer_norm
    assert [list(o.shape) for o in out] == [[7, cols], [7, 1], [7, 1]]


@pytest.mark.parametrize("weight", [False, True], ids=["no_w", "w"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_rms_norm(dtype: torch.dtype, weight: bool) -> None:
    cols = 768

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype) if weight else None
        fd.add_output(fd.ops.rms_norm(x, w))

    fd = define(build, "rms_norm")
    inputs = [randn(5, cols, dtype=dtype)] + ([randn(cols, dtype=dtype, seed=1)] if weight else [])
    check(fd, inputs, "inner_persistent", n=cols)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_softmax(op: str, dtype: torch.dtype) -> None:
    cols = 1000
    fd = define(lambda fd: fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], dtype))))
    relative = [0] if op == "softmax" else []
    check(fd, [randn(6, cols, dtype=dtype) * 3], "inner_persistent", n=cols, relative=relative)


@pytest.mark.parametrize("correction", [0, 1])
def test_var_mean(correction: int) -> None:
    def build(fd: FusionDefinition) -> None:
        var, mean = fd.ops.var_mean(fd.define_tensor([-1, -1]), dims=[1], correction=correction)
        fd.add_output(var)
        fd.add_output(mean)

    fd = define(build, "var_mean")
    check(fd, [randn(4, 300) * 3 + 10], "inner_persistent", n=300)


def test_var_mean_3d() -> None:
    def build(fd: FusionDefinition) -> None:
        var, mean = fd.ops.var_mean(fd.define_tensor([-1, -1, -1]), dims=[2], keepdim=True)
        fd.add_output(var)
        fd.add_output(mean)

    fd = define(build, "var_mean3d")
    out = check(fd, [randn(2, 3, 50)], "inner_persistent", n=50)
    assert [list(o.shape) for o in out] == [[2, 3, 1], [2, 3, 1]]


# -- the seed fusion ----------------------------------------------------------------------
@pytest.mark.parametrize("hidden", SEED_SWEEP)
def test_seed_layernorm_sweep(hidden: int) -> None:
    fd = seed_layernorm_fusion()
    inputs = seed_inputs(2, hidden)
    check(fd, inputs, ["inner_persistent"], n=hidden)
    s = fd.kernels[0].schedule
    assert s.persistent_batch * s.chunk + s.tail >= hidden


def test_seed_source_5140_not_padded() -> None:
    fd = seed_layernorm_fusion()
    fd.execute(seed_inputs(2, 5140))
    (k,) = fd.kernels
    src, s = k.source, k.schedule
    assert s.kind == "inner_persistent"
    assert "@triton.jit" in src
    assert "fuser kernel" in src.splitlines()[0]
    # no padding of the row to the next power of two
    assert "tl.arange(0, 8192)" not in src
    assert s.tail, s.short()  # 5140 is not a multiple of any chunk: there is a tail
    assert s.persistent_batch * s.chunk + s.tail < 8192
    # full chunks are unmasked, the tail chunk is the only one with a column mask
    last = len(s.chunks()) - 1
    masked = {int(m) for m in re.findall(r"col_ok_(\d+)", src)}
    assert masked == {last}, masked
    for i, (off, size) in enumerate(s.chunks()):
        assert re.search(rf"cols_{i} = (?:{off} \+ )?tl\.arange\(0, {size}\)", src), (i, off, size)


def test_seed_compile_meta_8192_rows() -> None:
    """fd.compile on meta tensors for rows=8192: a schedule for every H of the sweep."""
    fd = seed_layernorm_fusion()
    for hidden in SEED_SWEEP:
        small = fd.compile(seed_inputs(2, hidden), device="h100")
        meta = [torch.empty(hidden, dtype=F16, device="meta") for _ in range(5)]
        meta[1] = torch.empty(8192, hidden, dtype=F16, device="meta")
        big = fd.compile(meta, device="h100")
        assert len(big) == len(small) == 1, hidden
        s = big[0].schedule
        assert s.kind == small[0].schedule.kind == "inner_persistent", (hidden, s.short())
        assert (s.rows, s.cols) == (8192, hidden)
        assert s.persistent_batch * s.chunk + s.tail >= hidden
        s.validate()
        assert "@triton.jit" in big[0].source


def test_one_definition_many_shapes() -> None:
    """One FusionDefinition, several input shapes: a plan per shape, each one correct."""
    fd = seed_layernorm_fusion()
    for rows, hidden in [(2, 768), (3, 768), (2, 1600), (2, 768)]:
        check(fd, seed_inputs(rows, hidden), ["inner_persistent"], n=hidden)
        s = fd.kernels[0].schedule
        assert (s.rows, s.cols) == (rows, hidden)


@pytest.mark.parametrize(
    "op,shape,kind",
    [
        ("softmax", (50000, 50257), "inner_looped"),
        ("colsum", (300000, 8192), "outer_reduction"),
        ("exp", (300000, 8192), "pointwise"),
    ],
)
def test_compile_meta_64bit_index(op: str, shape: tuple[int, int], kind: str) -> None:
    """Over 2**31 elements (meta tensors, compile only): 64-bit row offsets."""

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        fd.add_output(fd.ops.sum(x, dims=[0]) if op == "colsum" else getattr(fd.ops, op)(x))

    fd = define(build, "big_" + op)
    (k,) = fd.compile([torch.empty(*shape, dtype=F16, device="meta")], device="h100")
    assert k.schedule.kind == kind and k.schedule.index_bits == 64, k.schedule.short()
    assert "tl.int64" in k.source


# -- inner looped ---------------------------------------------------------------------------
def test_softmax_looped_50257() -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], F16))))
    check(fd, [randn(2, 50257, dtype=F16) * 4], "inner_looped", n=50257, relative=[0])


def test_log_softmax_looped_50257() -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.log_softmax(fd.define_tensor([-1, -1]))))
    check(fd, [randn(2, 50257) * 4], "inner_looped", n=50257)


def _cross_entropy(dtype: torch.dtype = F32, ignore_index: int = -100) -> FusionDefinition:
    def build(fd: FusionDefinition) -> None:
        logits = fd.define_tensor([-1, -1], dtype)
        target = fd.define_tensor([-1], torch.int64)
        fd.add_output(fd.ops.cross_entropy(logits, target, ignore_index=ignore_index))

    return define(build, "cross_entropy")


def test_cross_entropy_looped_50257() -> None:
    fd = _cross_entropy()
    target = torch.randint(0, 50257, (3,), generator=torch.Generator().manual_seed(3))
    check(fd, [randn(3, 50257) * 2, target], "inner_looped", n=50257)


def test_cross_entropy_ignore_index() -> None:
    fd = _cross_entropy()
    target = torch.randint(0, 50257, (3,), generator=torch.Generator().manual_seed(4))
    target[1] = -100
    check(fd, [randn(3, 50257) * 2, target], "inner_looped", n=50257)


def test_cross_entropy_custom_ignore_index_small() -> None:
    fd = _cross_entropy(ignore_index=2)
    target = torch.tensor([2, 0, 6, 2, 3])
    # the per-row losses are persistent; their mean over the rows is a second kernel
    out = check(fd, [randn(5, 7), target], {"inner_persistent", "inner_looped"}, n=7)
    assert out[0].dim() == 0


# -- outer reductions ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype,out_f32", [(F32, True), (BF16, True), (BF16, False)], ids=["f32", "bf16_to_f32", "bf16"]
)
@pytest.mark.parametrize("shape", [(64, 128), (300, 77)], ids=["64x128", "300x77"])
def test_column_sum(shape: tuple[int, int], dtype: torch.dtype, out_f32: bool) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, F32) if out_f32 else x, dims=[0]))

    fd = define(build, "bias_grad")
    check(fd, [randn(*shape, dtype=dtype)], "outer_reduction", n=shape[0])


def test_column_sum_split() -> None:
    """300 x 77: the rows are split over several blocks and the partials summed after."""
    fd = define(lambda fd: fd.add_output(fd.ops.sum(fd.define_tensor([-1, -1]), dims=[0])))
    x = randn(300, 77)
    (first,) = check(fd, [x], "outer_reduction", n=300)
    assert fd.kernels[0].schedule.split_rows > 1, fd.kernels[0].schedule.short()
    # the partials are added in a fixed order: run to run, bit for bit the same
    assert torch.equal(fd.execute([x])[0], first)


@pytest.mark.parametrize("shape", [(1, 37), (3, 37), (300, 77)], ids=["1x37", "3x37", "300x77"])
def test_column_sum_with_scalar_nodes(shape: tuple[int, int]) -> None:
    """Values computed from a 0-d input alone (SCALAR nodes) in the row loop and after
    the column sum; 300 x 77 splits the rows, and its finalize kernel computes them again.
    The outer-reduction kernel emitted no SCALAR node (NameError), a fuzzer find."""

    def build(fd: FusionDefinition) -> None:
        x, s = fd.define_tensor([-1, -1]), fd.define_tensor([])
        col = fd.ops.sum(fd.ops.mul(x, fd.ops.mul(s, 0.5)), dims=[0])
        fd.add_output(fd.ops.sub(col, fd.ops.exp(s)))

    fd = define(build, "scalar_nodes")
    x = transposed(*shape)
    check(fd, [x, torch.tensor(1.5)], "outer_reduction", n=shape[0])
    assert (fd.kernels[0].schedule.split_rows > 1) == (shape[0] == 300)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_column_max(dtype: torch.dtype) -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.max(fd.define_tensor([-1, -1], dtype), dims=[0])))
    check(fd, [randn(300, 77, dtype=dtype)], "outer_reduction")


@pytest.mark.parametrize("cols", [77, 5140, 50257])
def test_row_max_min(cols: int) -> None:
    """Row max of negative and min of positive values: the masked lanes of a partial
    chunk must hold the identity (-inf / +inf), not 0."""

    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.max(fd.ops.sub(x, 10.0), dims=[1]))
        fd.add_output(fd.ops.min(fd.ops.add(x, 10.0), dims=[1]))

    fd = define(build, "row_max_min")
    check(fd, [randn(2, cols)], _inner_kind(2, cols))


def test_column_mean_3d() -> None:
    """Sum over the two leading dims of [2, 3, H]: an outer reduction over 6 rows."""
    fd = define(lambda fd: fd.add_output(fd.ops.mean(fd.define_tensor([-1, -1, -1]), dims=[0, 1])))
    check(fd, [randn(2, 3, 257)], "outer_reduction", n=6)


# -- odd row lengths ----------------------------------------------------------------------
def _inner_kind(rows: int, cols: int) -> str | set[str]:
    """The kind(s) the inner scheduler may pick for [rows, cols] (fp32/fp16 rows).

    50257 columns do not fit in registers: looped. Rows shorter than a warp may go
    either way (a persistent block is at least one warp of threads_per_row x
    rows_per_block, both capped by the sizes), so both kinds are accepted there.
    """
    if cols >= 50000:
        return "inner_looped"
    if cols < 32:
        return {"inner_persistent", "inner_looped"}
    return "inner_persistent"


@pytest.mark.parametrize("cols", ODD_COLS)
def test_softmax_odd_cols(cols: int) -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], F16))))
    check(fd, [randn(3, cols, dtype=F16)], _inner_kind(3, cols), n=cols, relative=[0])


@pytest.mark.parametrize("rows,cols", [(2, c) for c in ODD_COLS] + [(64, 1), (64, 7)])
def test_layer_norm_odd_cols(rows: int, cols: int) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1])
        b = fd.define_tensor([-1])
        fd.add_output(fd.ops.layer_norm(x, w, b))

    fd = define(build, "ln_odd")
    inputs = [randn(rows, cols), randn(cols, seed=1), randn(cols, seed=2)]
    check(fd, inputs, _inner_kind(rows, cols), n=cols)


@pytest.mark.parametrize("cols", [1, 7, 127, 5142])
def test_pointwise_odd_cols(cols: int) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        b = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.sigmoid(fd.ops.add(x, b)))

    fd = define(build, "pw_odd")
    check(fd, [randn(3, cols, dtype=F16), randn(cols, dtype=F16, seed=1)], "pointwise")


@pytest.mark.parametrize("cols", [1, 7, 5140])
def test_column_sum_odd_cols(cols: int) -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.sum(fd.define_tensor([-1, -1]), dims=[0])))
    check(fd, [randn(33, cols)], "outer_reduction", n=33)


# -- layouts ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("cols", [33, 5140])
def test_misaligned_inputs(dtype: torch.dtype, cols: int) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        y = fd.ops.rms_norm(x, w)
        fd.add_output(y)
        fd.add_output(fd.ops.add(y, x))  # a residual: fused into the same kernel

    fd = define(build, "misaligned")
    x = misaligned(3, cols, dtype)
    w = randn(cols + 1, dtype=dtype, seed=1)[1:]
    check(fd, [x, w], "inner_persistent", n=cols)


@pytest.mark.parametrize(
    "op,kind",
    [("softmax", "inner_persistent"), ("exp", "pointwise"), ("colsum", "outer_reduction")],
)
def test_misaligned_single_op(op: str, kind: str) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        if op == "colsum":
            fd.add_output(fd.ops.sum(fd.ops.cast(x, F32), dims=[0]))
        else:
            fd.add_output(getattr(fd.ops, op)(x))

    fd = define(build, "misaligned_" + op)
    check(fd, [misaligned(5, 96, F16)], kind, n=96)


@pytest.mark.parametrize(
    "op,kind",
    [
        ("softmax", "inner_persistent"),
        ("layer_norm", "inner_persistent"),
        ("gelu", "pointwise"),
        ("colsum", "outer_reduction"),
    ],
)
def test_transposed_inputs(op: str, kind: str) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1])
        y = fd.define_tensor([-1, -1])
        z = fd.ops.add(x, y)
        if op == "colsum":
            fd.add_output(fd.ops.sum(z, dims=[0]))
        else:
            fd.add_output(getattr(fd.ops, op)(z))

    fd = define(build, "transposed_" + op)
    # one transposed input and one contiguous one
    check(fd, [transposed(20, 48), randn(20, 48, seed=1)], kind, n=48)


def test_row_sliced_view() -> None:
    """Rows of a wider tensor: row stride 100, 70 columns."""
    fd = define(lambda fd: fd.add_output(fd.ops.log_softmax(fd.define_tensor([-1, -1]))))
    x = randn(4, 100)[:, 10:80]
    check(fd, [x], "inner_persistent", n=70)


@pytest.mark.parametrize("hidden", [768, 5140])
def test_3d_inputs(hidden: int) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1, -1], F16)
        w = fd.define_tensor([-1], F16)
        b = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.layer_norm(x, w, b))
        fd.add_output(fd.ops.softmax(x))

    fd = define(build, "ln3d")
    x = randn(2, 3, hidden, dtype=F16)
    out = check(
        fd,
        [x, randn(hidden, dtype=F16, seed=1), randn(hidden, dtype=F16, seed=2)],
        "inner_persistent",
        n=hidden,
        relative=[1],
    )
    assert all(list(o.shape) == [2, 3, hidden] for o in out)


# -- empty inputs and NaN -----------------------------------------------------------------
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "layer_norm_stats"])
def test_zero_rows(op: str) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        if op == "softmax":
            fd.add_output(fd.ops.softmax(x))
        else:
            w = fd.define_tensor([-1], F16)
            outs = fd.ops.layer_norm(x, w, None, return_mean_rstd=op == "layer_norm_stats")
            for o in outs if isinstance(outs, tuple) else [outs]:
                fd.add_output(o)

    fd = define(build, "empty_" + op)
    inputs = [torch.empty(0, 64, dtype=F16)] + ([] if op == "softmax" else [randn(64, dtype=F16)])
    out = fd.execute(inputs)
    ref = fd.reference(inputs)
    assert [o.shape for o in out] == [r.shape for r in ref]
    assert list(out[0].shape) == [0, 64]
    if op == "layer_norm_stats":
        assert [list(o.shape) for o in out[1:]] == [[0, 1], [0, 1]]


@pytest.mark.parametrize("cols", [1000, 50257])
def test_softmax_nan_row(cols: int) -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1]))))
    x = randn(3, cols)
    x[1, cols // 3] = float("nan")
    out = check(fd, [x], _inner_kind(3, cols), n=cols, equal_nan=True, relative=[0])
    assert out[0][1].isnan().all() and not out[0][[0, 2]].isnan().any()


@pytest.mark.parametrize("cols", [1000, 5140])
def test_layer_norm_nan_row(cols: int) -> None:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], F16)
        w = fd.define_tensor([-1], F16)
        b = fd.define_tensor([-1], F16)
        fd.add_output(fd.ops.layer_norm(x, w, b))

    fd = define(build, "ln_nan")
    x = randn(3, cols, dtype=F16)
    x[2, 5] = float("nan")
    inputs = [x, randn(cols, dtype=F16, seed=1), randn(cols, dtype=F16, seed=2)]
    out = check(fd, inputs, "inner_persistent", n=cols, equal_nan=True)
    assert out[0][2].isnan().all() and not out[0][:2].isnan().any()


# max/min reductions propagate NaN like torch.amax (Triton's tl.max alone drops it)
@pytest.mark.parametrize("op", ["max", "min"])
def test_column_max_nan(op: str) -> None:
    fd = define(lambda fd: fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1]), dims=[0])))
    x = randn(300, 77)
    x[123, 4] = float("nan")
    out = check(fd, [x], "outer_reduction", equal_nan=True)
    assert out[0][4].isnan() and out[0].isnan().sum() == 1


@pytest.mark.parametrize("cols", [77, 50257])
def test_row_max_nan(cols: int) -> None:
    fd = define(lambda fd: fd.add_output(fd.ops.max(fd.define_tensor([-1, -1]), dims=[1])))
    x = randn(2, cols)
    x[1, 4] = float("nan")
    out = check(fd, [x], _inner_kind(2, cols), equal_nan=True)
    assert out[0][1].isnan() and not out[0][0].isnan()


# -- explain and source -------------------------------------------------------------------
EXPLAINED = [
    pytest.param(
        "pointwise",
        lambda fd: fd.add_output(fd.ops.exp(fd.define_tensor([-1, -1]))),
        lambda: [randn(4, 64)],
        id="pointwise",
    ),
    pytest.param(
        "inner_persistent",
        lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1]))),
        lambda: [randn(4, 64)],
        id="inner_persistent",
    ),
    pytest.param(
        "inner_looped",
        lambda fd: fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1]))),
        lambda: [randn(2, 50257)],
        id="inner_looped",
    ),
    pytest.param(
        "outer_reduction",
        lambda fd: fd.add_output(fd.ops.sum(fd.define_tensor([-1, -1]), dims=[0])),
        lambda: [randn(64, 32)],
        id="outer_reduction",
    ),
]


@pytest.mark.parametrize("kind,build,inputs", EXPLAINED)
def test_explain_and_source(kind: str, build: Callable, inputs: Callable) -> None:
    fd = define(build, "explained")
    assert "nothing compiled" in fd.explain()
    fd.execute(inputs())
    text = fd.explain()
    assert kind in text and "regs" in text, text
    (k,) = fd.kernels
    assert k.schedule.kind == kind
    assert "@triton.jit" in k.source
    assert k.source.splitlines()[0].startswith("# fuser kernel"), k.source.splitlines()[0]
    assert kind in k.source  # the header carries the schedule


# -- the prefetching row loop (Schedule.programs) -------------------------------------
@pytest.mark.parametrize("programs", [1, 3, 7, 64])
@pytest.mark.parametrize("cols", [300, 1000])
def test_prefetching_row_loop(programs: int, cols: int) -> None:
    """Resident programs walk rows `programs` apart, loading the next row early: every row
    must be written once, the last sweep's extra rows not at all (odd row count)."""
    from dataclasses import replace

    from fuser.runtime.executor import render_kernel

    fd = seed_layernorm_fusion()
    inputs = seed_inputs(37, cols)
    fd.execute(inputs)
    plan = fd._runtime().last
    k = plan.kernels[0]
    s = replace(
        k.schedule,
        programs=programs,
        rows_per_block=1,
        num_warps=max(k.schedule.threads_per_row // 32, 1),
    ).validate()
    plan.kernels[0] = render_kernel(k.spec, s, "triton")
    assert "next_rows" in plan.kernels[0].source
    # the rows are masked only where the last step runs past them (64: a grid of 37)
    exact = 37 % min(programs, 37) == 0
    assert ("row_ok" in plan.kernels[0].source) != exact, plan.kernels[0].plan.text()
    (out,) = plan.run(inputs)
    (ref,) = fd.reference(inputs)
    atol, rtol = tol(torch.float16, cols)
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def test_nan_constant_is_not_a_global() -> None:
    """Triton re-checks global constexprs with != before each JIT launch and NaN != NaN:
    a NAN global failed every second compile of such a kernel on the GPU (fuzz soak)."""
    fd = define(
        lambda fd: fd.add_output(
            fd.ops.where(fd.ops.gt(x := fd.define_tensor([-1, -1]), 0.0), float("nan"), x)
        )
    )
    x = randn(3, 37)
    for _ in range(2):
        (out,) = fd.execute([x])
        torch.testing.assert_close(out, torch.where(x > 0, float("nan"), x), equal_nan=True)
    src = fd.kernels[0].source
    assert "NAN = " not in src and "nan_()" in src
