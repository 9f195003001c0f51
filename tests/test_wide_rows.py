"""Rows of an odd width keep 16-byte accesses (fuser/schedulers/heuristics.py vector_width).

(a) aligned rows, odd width: a [R, 1001] slice of a [R, 1008] tensor (GPT-2's logits are
    a [16384, 50257] slice of a padded matmul output): full vectors, a masked last one;
(b) contiguous odd widths: every row starts at another alignment; the looped kernel walks
    each row from its 16-byte-aligned start;
(c) a misaligned base pointer (x[1:] of an odd width): narrower accesses, still right.

Softmax, log_softmax, cross-entropy forward + backward, layernorm and a pointwise op run
on both backends (Triton's interpreter, the g++ CUDA emulator) against ATen; the
schedules are checked for the vector they chose and the reason they give.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fuser import FusionDefinition
from fuser.bench.cases import cross_entropy_case
from fuser.ir.dtypes import dtype_of
from fuser.ir.evaluate import tolerance

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# -- fusions ----------------------------------------------------------------------------------
def _define(build: Callable[[FusionDefinition], None], name: str) -> FusionDefinition:
    with FusionDefinition(name) as fd:
        build(fd)
    return fd


def row_op(op: str, dtype: torch.dtype) -> FusionDefinition:
    def build(fd: FusionDefinition) -> None:
        fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], dtype)))

    return _define(build, op)


def layer_norm(dtype: torch.dtype) -> FusionDefinition:
    def build(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], dtype)
        w, b = fd.define_tensor([-1], dtype), fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.layer_norm(x, w, b))

    return _define(build, "layer_norm")


def pointwise(dtype: torch.dtype) -> FusionDefinition:
    def build(fd: FusionDefinition) -> None:
        o = fd.ops
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(o.cast(o.add(o.mul(o.gelu(o.cast(x, F32)), 2.0), 1.0), dtype))

    return _define(build, "pointwise")


FUSIONS = ["softmax", "log_softmax", "cross_entropy", "layer_norm", "pointwise"]


def fusion(name: str, rows: int, cols: int, dtype: torch.dtype) -> FusionDefinition:
    if name == "cross_entropy":
        return cross_entropy_case(rows, cols, dtype).fusions[0]
    if name == "layer_norm":
        return layer_norm(dtype)
    if name == "pointwise":
        return pointwise(dtype)
    return row_op(name, dtype)


# -- inputs -----------------------------------------------------------------------------------
def randn(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).to(DEVICE)


def rows_of(layout: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, cols]: `slice` of [rows, cols rounded up to 8], `contiguous`, or `offset`
    (x[1:] of a contiguous [rows + 1, cols]: the base pointer starts cols elements in)."""
    if layout == "slice":
        return randn((rows, -(-cols // 8) * 8), dtype)[:, :cols]
    if layout == "offset":
        return randn((rows + 1, cols), dtype)[1:]
    return randn((rows, cols), dtype)


def inputs_for(name: str, x: torch.Tensor) -> list[torch.Tensor]:
    rows, cols = x.shape
    if name == "cross_entropy":
        g = torch.Generator().manual_seed(1)
        # the first and last columns are targets too: the true column index must be used
        tgt = torch.randint(0, cols, (rows,), generator=g)
        tgt[0], tgt[-1] = 0, cols - 1
        return [x, tgt.to(DEVICE)]
    if name == "layer_norm":
        return [x, randn((cols,), x.dtype, 2), randn((cols,), x.dtype, 3)]
    return [x]


def check(fd: FusionDefinition, inputs: list[torch.Tensor]) -> None:
    """fd.execute against fd.reference (ATen op by op), at the outputs' precision."""
    out = fd.execute(inputs)
    ref = fd.reference(inputs)
    n = inputs[0].shape[-1]
    for i, (o, r) in enumerate(zip(out, ref)):
        assert o.dtype == r.dtype and o.shape == r.shape, (i, o.dtype, r.dtype)
        half = {F16: 1e-3, BF16: 8e-3}
        rtol = half.get(r.dtype) or tolerance(dtype_of(r.dtype), n)[1]
        # relative: a softmax row of 33001 holds probabilities near 3e-5; absolute: a
        # few rounding steps of the output's scale (a layernorm's w * x_hat + b lands
        # near 0 by cancellation, where an FMA on the GPU rounds once and ATen twice)
        fi = torch.finfo(r.dtype)
        scale = r.float().abs().nan_to_num(posinf=0.0).max().item() if r.numel() else 0.0
        torch.testing.assert_close(
            o.cpu(),
            r.cpu(),
            atol=max(2 * fi.smallest_normal * fi.eps, rtol * 1e-3, 8 * fi.eps * scale),
            rtol=rtol,
            equal_nan=True,
            msg=lambda m, i=i: f"output {i} of {fd.name}: {m}",
        )


def schedule_of(fd: FusionDefinition):  # noqa: ANN201 - the widest kernel's Schedule
    return max(fd.kernels, key=lambda k: k.spec.cols).schedule


# -- (a) aligned rows, odd width ------------------------------------------------------------
@pytest.mark.parametrize("name", FUSIONS)
def test_aligned_rows_odd_width(name: str, backend: str) -> None:
    """A [5, 1001] bf16 slice of [5, 1008]: 16-byte vectors, a masked last one."""
    fd = fusion(name, 5, 1001, BF16)
    check(fd, inputs_for(name, rows_of("slice", 5, 1001, BF16)))
    s = schedule_of(fd)
    assert s.vector == 8, s.explain()
    assert "rows aligned: vector 8 with a masked tail" in s.explain(), s.explain()


@pytest.mark.parametrize("name", ["softmax", "cross_entropy"])
def test_aligned_rows_looped(name: str, backend: str) -> None:
    """A [2, 70001] bf16 slice of [2, 70008]: too long for registers, looped at vector 8
    (the loop body unmasked, the tail masked)."""
    fd = fusion(name, 2, 70001, BF16)
    check(fd, inputs_for(name, rows_of("slice", 2, 70001, BF16)))
    s = schedule_of(fd)
    assert s.kind == "inner_looped" and s.vector == 8, s.explain()


def test_aligned_rows_schedules_at_gpt2_size() -> None:
    """GPT-2's logits, [16384, 50257] of a [16384, 50304] matmul output: looped at 16
    bytes on both backends (the dlogits output, contiguous, takes narrower stores)."""
    x = torch.empty(16384, 50304, dtype=BF16, device="meta")[:, :50257]
    tgt = torch.empty(16384, dtype=torch.int64, device="meta")
    for be in ("triton", "cuda"):
        fd = fusion("cross_entropy", 16384, 50257, BF16)
        (k,) = fd.compile([x, tgt], "h100", be)
        assert k.schedule.kind == "inner_looped" and k.schedule.vector == 8, k.schedule.explain()
        assert "narrower stores" in k.schedule.explain()


def test_cuda_straddling_slot_is_scalar() -> None:
    """The CUDA slot crossing the row end moves its elements one by one."""
    fd = fusion("softmax", 5, 1001, BF16)
    (k,) = fd.compile([rows_of("slice", 5, 1001, BF16)], "h100", "cuda")
    assert "if (col + 8 <= COLS)" in k.source and "if (col + k < COLS)" in k.source
    assert "load_pack<8>" in k.source


# -- (b) contiguous odd widths --------------------------------------------------------------
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("name", FUSIONS)
def test_contiguous_odd_width(name: str, dtype: torch.dtype, backend: str) -> None:
    """3 x 33001: each row starts at another alignment."""
    fd = fusion(name, 3, 33001, dtype)
    check(fd, inputs_for(name, rows_of("contiguous", 3, 33001, dtype)))


# -- (c) a misaligned base pointer ----------------------------------------------------------
@pytest.mark.parametrize("name", FUSIONS)
@pytest.mark.parametrize("cols", [1001, 33001])
def test_misaligned_base(name: str, cols: int, backend: str) -> None:
    fd = fusion(name, 2, cols, BF16)
    x = rows_of("offset", 2, cols, BF16)
    assert x.data_ptr() % 16
    check(fd, inputs_for(name, x))
