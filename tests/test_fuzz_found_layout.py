"""Regression tests for bugs the fuzzer's layout pattern (slices, pads and cats along a
dim: fuser/fuzz/patterns.py `_layout`) found."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from fuzz_helpers import BF16, DEVICE, F16, F32, cuda_backend_or_skip, define, randn

from fuser import FusionDefinition
from fuser.fuzz.case import FuzzCase, InputSpec, Ref, Step, repro
from fuser.fuzz.runner import check_case
from fuser.ir.evaluate import evaluate
from fuser.runtime.specs import planned_alignment

DTYPES = [F32, F16, BF16]
IDS = ["f32", "f16", "bf16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_a_slice_of_only_padded_zeros(dtype: torch.dtype) -> None:
    """A slice that reads nothing but a pad's zeros becomes a broadcast of a constant
    (passes/views.py); its Triton alias was a Python float, and widening it as a 16-bit
    tile (bf16_wide on the interpreter, .to on a GPU) failed to compile ("Cannot bitcast
    data-type of size 32 to data-type of size 16"). Found as shift, shift again."""
    rows, cols = 5, 7

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([rows, cols], dtype)
        shifted = fd.ops.pad(fd.ops.slice(x, 1, 3, cols), 1, 0, 3)  # zeros in 4..6
        zeros = fd.ops.slice(shifted, 1, 4, cols)
        fd.add_output(fd.ops.pad(zeros, 1, 0, 4))
        fd.add_output(fd.ops.pad(fd.ops.exp(zeros), 1, 4, 0))  # exp(0) = 1, not 0

    x = randn(rows, cols, dtype=dtype, seed=3)
    moved, ones = define(build_fn).execute([x])
    shifted = F.pad(x[:, 3:], (0, 3))
    torch.testing.assert_close(moved, F.pad(shifted[:, 4:], (0, 4)), atol=0, rtol=0)
    torch.testing.assert_close(ones, F.pad(shifted[:, 4:].exp(), (4, 0)), atol=0, rtol=0)
    assert ones.dtype == dtype and ones[:, 4:].eq(1).all() and ones.device.type == DEVICE


# the flattening bug (fixed in c4aebb2: runtime/specs.py `_flat_pointwise`), as the layout
# pattern found it again with the fix reverted (shrunk; 404 cases into the campaign)
FLATTENED = [
    # a rotary's cos/sin [T, D] broadcast over [B, T, D], then shifted along D: the shift's
    # index map ends up in a kernel of its own over [T, D] (the broadcast stays ATen's)
    FuzzCase(
        (1, 16, 64),
        (InputSpec((1, 16, 64), "float32", static_last=True), InputSpec((16, 64), "float32")),
        (
            Step("input", (0,)),
            Step("input", (1,)),
            Step("broadcast_in_dim", (Ref(1),), (("shape", "domain"), ("broadcast_dims", (1, 2)))),
            Step("slice", (Ref(2), 2, 1, 64)),
            Step("pad", (Ref(3), 2, 0, 1)),
        ),
        (4,),
        data_seed=7,
    ),
    # shifted twice, then minus its column means: symbolic rows, a static last dim
    FuzzCase(
        (16, 64),
        (InputSpec((16, 64), "float32", static_last=True),),
        (
            Step("input", (0,)),
            Step("slice", (Ref(0), 1, 1, 64)),
            Step("pad", (Ref(1), 1, 0, 1)),
            Step("slice", (Ref(2), 1, 1, 64)),
            Step("pad", (Ref(3), 1, 0, 1)),
            Step("mean", (Ref(4),), (("dims", (0,)), ("keepdim", False))),
            Step("broadcast_in_dim", (Ref(5),), (("shape", "domain"), ("broadcast_dims", (1,)))),
            Step("sub", (Ref(4), Ref(6))),
        ),
        (7,),
        data_seed=7,
    ),
]


@pytest.mark.parametrize("case", FLATTENED, ids=["broadcast_then_shift", "shifts_minus_mean"])
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_index_maps_at_1024_elements_keep_their_layout(
    case: FuzzCase, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k * 1024 elements in rows of 64: a pointwise kernel that reads through a slice's
    index map ran flattened to [1, 1024] rows, and column j of the flat row was read as
    column j of the tensor (945 of 1024 elements wrong). Both backends."""
    if backend == "cuda":
        cuda_backend_or_skip(monkeypatch)
    case = dataclasses.replace(case, backend=backend)
    out = check_case(case, DEVICE)
    assert out.status == "ok", "\n".join(out.problems) + "\n" + repro(case, device=DEVICE)


@pytest.mark.parametrize(
    ("dtype", "cols", "start"),
    [(F16, 171, 1), (BF16, 37, 2), (F32, 45, 1), (F16, 100, 3)],
    ids=["f16_171_row1", "bf16_37_row2", "f32_45_row1", "f16_100_row3"],
)
def test_a_row_a_kernel_reads_from_a_row_slice_is_aligned(
    backend: str, dtype: torch.dtype, cols: int, start: int
) -> None:
    """A slice along dim 0 is ATen's (a kernel indexes only the last dim); of a contiguous
    tensor it was a view `start` rows in, `start * cols` elements past an aligned pointer
    (row 1 of [2, 171] fp16: 342 bytes, 2-byte aligned), while the planner takes an ATen
    result to be fresh 16-byte aligned storage. The kernel reading the one row ran 16-byte
    packs: CUDA_ERROR_MISALIGNED_ADDRESS on an H200 (the emulator counts those). Cols
    whose rows are not 16 bytes apart, a row in the middle; a kernel makes the rows."""
    rows = start + 2

    def build_fn(fd: FusionDefinition) -> None:
        x = fd.define_tensor([rows, cols], dtype)
        y = fd.ops.abs(x)  # a kernel makes [rows, cols]; ATen slices it
        tail = fd.ops.slice(y, dim=0, start=start, stop=start + 1, step=1)
        fd.add_output(fd.ops.exp(fd.ops.neg(tail)))
        fd.add_output(y)

    x = randn(rows, cols, dtype=dtype, seed=cols + start)
    out, y = define(build_fn).execute([x], backend=backend)
    torch.testing.assert_close(y, x.abs(), atol=0, rtol=0)
    ref = x.abs()[start : start + 1].float().neg().exp().to(dtype)
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("shape", "dim", "start", "stop"),
    [((2, 171), 0, 1, 2), ((3, 5, 7), 1, 2, 4), ((4, 9), -1, 3, 9), ((5, 3), 0, 1, 4)],
)
def test_an_aten_slice_is_storage_of_its_own(
    shape: tuple[int, ...], dim: int, start: int, stop: int
) -> None:
    """What build_specs plans an ATen result a kernel reads to be: fresh storage, dense and
    16-byte aligned. A slice that is contiguous (leading rows, inner blocks) was a view into
    its input, as aligned as its offset (an odd number of fp16 elements: 2 bytes)."""
    x = randn(*shape, dtype=F16, seed=len(shape) + start)

    def build_fn(fd: FusionDefinition) -> None:
        t = fd.define_tensor(list(shape), F16)
        fd.add_output(fd.ops.slice(t, dim=dim, start=start, stop=stop, step=1))

    (out,) = evaluate(define(build_fn).graph, [x])
    want = x.narrow(dim, start, stop - start)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    assert out.is_contiguous() and planned_alignment(out) == 16
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_aten_casts_and_broadcasts_are_storage_of_their_own() -> None:
    """A cast to its own dtype and a broadcast that broadcasts nothing are, with ATen,
    their input itself (or a view of it). An ATen segment's result a kernel reads is
    planned as fresh, dense, 16-byte aligned storage, so eval_node copies both: else a
    misaligned input would reach a kernel's packed accesses as the row slice did."""
    import torch

    from fuser import FusionDefinition
    from fuser.ir.evaluate import eval_node

    g = torch.Generator().manual_seed(5)
    base = torch.randn(1 + 3 * 37, generator=g).half()
    x = base[1:].view(3, 37)  # contiguous, its pointer 2 bytes off 16
    with FusionDefinition("noop_layouts") as fd:
        t = fd.define_tensor([3, 37], torch.float16)
        same = fd.ops.cast(t, torch.float16)
        wide = fd.ops.broadcast_in_dim(t, shape=[3, 37], broadcast_dims=[0, 1])
        fd.add_output(fd.ops.add(same, wide))
    nodes = [n for n in fd.graph.nodes if n.op.value in ("cast", "broadcast_in_dim")]
    assert len(nodes) == 2, [n.op for n in fd.graph.nodes]
    for node in nodes:
        (out,) = eval_node(node, [x], x.device)
        torch.testing.assert_close(out, x, atol=0, rtol=0)
        assert out.is_contiguous() and out.data_ptr() % 16 == 0
        assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
