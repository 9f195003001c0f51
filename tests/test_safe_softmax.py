"""aten._safe_softmax: softmax, except that a slice of only -inf gives zeros, not NaN (what
SDPA's math path and transformers' eager attention reach in current PyTorch).

fd.ops.safe_softmax against ATen's on both backends (rows of only -inf, scattered -inf,
NaN, odd sizes, non-contiguous inputs, float32 and 16-bit, the persistent and the looped
schedule), and torch.compile through SDPA's math path, forward and backward: the op joins
the mask's add in one kernel and its gradient (_softmax_backward_data) is fused too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fuser import FusionDefinition
from fuser.dynamo import FuserBackend
from fuser.dynamo.explain import explain
from fuser.schedulers.online import looped_plan

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
INF, NAN = float("inf"), float("nan")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
aten = torch.ops.aten

pytestmark = pytest.mark.nonfinite  # the data holds -inf (and NaN) on purpose


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def safe_softmax(dtype: torch.dtype, rank: int, dim: int) -> FusionDefinition:
    fd = FusionDefinition("safe_softmax")
    with fd:
        x = fd.define_tensor([-1] * rank, dtype)
        fd.add_output(fd.ops.safe_softmax(x, dim=dim))
    return fd


def masked(shape: tuple, dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random values, a third of them -inf, and two slices along `dim` of only -inf (the
    first and the last, so a tail block holds one)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    x[torch.rand(shape, generator=g) < 0.3] = -INF
    along = x.movedim(dim, -1)  # a view: slices along dim are its rows
    lead = along.shape[:-1]
    along[(0,) * len(lead)] = -INF
    along[tuple(n - 1 for n in lead)] = -INF
    return x.to(dtype)


def only_neg_inf(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Where x's slice along `dim` is all -inf, broadcast over x."""
    return (x == -INF).all(dim, keepdim=True).expand_as(x)


def check(y: torch.Tensor, x: torch.Tensor, dim: int) -> None:
    want = aten._safe_softmax(x.cpu(), dim)
    torch.testing.assert_close(y.cpu(), want, equal_nan=True)
    dead = only_neg_inf(x.cpu(), dim)
    assert dead.any() and (y.cpu()[dead] == 0).all()
    assert not y.cpu()[~x.cpu().isnan().any(dim, keepdim=True).expand_as(x)].isnan().any()


# -- fd.ops.safe_softmax --------------------------------------------------------------------
CASES = {
    "rows_7x37": ((7, 37), -1),
    "cols_7x37": ((7, 37), 0),
    "one_row": ((1, 5), -1),
    "one_col": ((9, 1), -1),  # a row of one element: 1, or 0 where it is -inf
    "mid_dim_3x4x9": ((3, 4, 9), 1),
    "rows_3x1031": ((3, 1031), -1),
}


# every case and dtype in Triton's interpreter; in the CUDA emulator (a g++ build a
# kernel, ~10 s) a row and a column reduction, a 16-bit and a float32 one
MATRIX = [("triton", c, d) for c in CASES for d in (F32, BF16, F16)]
MATRIX += [("cuda", "rows_7x37", BF16), ("cuda", "cols_7x37", F32)]


@pytest.mark.parametrize("backend,case,dtype", MATRIX, indirect=["backend"], ids=str)
def test_matches_aten(backend: str, case: str, dtype: torch.dtype) -> None:
    shape, dim = CASES[case]
    x = masked(shape, dim, dtype).to(DEVICE)
    (y,) = safe_softmax(dtype, len(shape), dim).execute([x])
    assert y.dtype == dtype and y.shape == x.shape
    check(y, x, dim)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_non_contiguous_input(backend: str, dtype: torch.dtype) -> None:
    """A transposed [37, 7] read in place, and a column slice of a wider tensor."""
    xs = [
        masked((37, 7), 0, dtype).to(DEVICE).t(),
        masked((6, 50), -1, dtype, seed=1).to(DEVICE)[:, 3:44],
    ]
    for x in xs:
        assert not x.is_contiguous()
        (y,) = safe_softmax(dtype, 2, -1).execute([x])
        check(y, x, -1)


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_nan_and_inf_rows_are_as_aten(backend: str) -> None:
    """Only a row of nothing but -inf becomes zeros: a NaN or a +inf in a row still makes
    it NaN (ATen's softmax, which _safe_softmax keeps there)."""
    x = torch.randn(4, 13)
    x[0].fill_(-INF)
    x[1, 4] = NAN
    x[1, 5:] = -INF
    x[2, 3] = INF
    (y,) = safe_softmax(F32, 2, -1).execute([x.to(DEVICE)])
    y = y.cpu()
    assert (y[0] == 0).all() and y[1].isnan().all() and y[2].isnan().any()
    torch.testing.assert_close(y, aten._safe_softmax(x, -1), equal_nan=True)


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_scalar(backend: str) -> None:
    """A 0-d tensor is its own slice: 1, or 0 where it is -inf."""
    fd = safe_softmax(F32, 0, 0)
    for v in (0.7, -INF):
        (y,) = fd.execute([torch.tensor(v, device=DEVICE)])
        assert y.item() == aten._safe_softmax(torch.tensor(v), 0).item()


@pytest.mark.parametrize(
    "backend,dtype",
    [("triton", F32), ("triton", BF16), ("cuda", BF16)],
    indirect=["backend"],
    ids=str,
)
def test_looped_rows(backend: str, dtype: torch.dtype) -> None:
    """Rows too long for registers: the looped kernel still takes max and sum in one
    online pass, and its NaN for a row of only -inf is selected away."""
    cols = 33001
    x = masked((4, cols), -1, dtype).to(DEVICE)
    x[1, : cols - 3] = -INF  # the last columns (the masked tail) hold the only values
    fd = safe_softmax(dtype, 2, -1)
    (y,) = fd.execute([x])
    check(y, x, -1)
    (k,) = [k for k in fd.kernels if k.schedule.kind == "inner_looped"]
    assert looped_plan(k.spec).count == 2  # online: 2 passes over the row, not 3


# -- torch.compile: SDPA's math path --------------------------------------------------------
def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    """q (non-contiguous: heads transposed out of [B, T, H, D]), k, v and a bool mask with
    query rows that see no key (their softmax row is all -inf)."""
    g = torch.Generator().manual_seed(3)
    b, h, t, d = 2, 3, 7, 8
    q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)
    k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(2))
    mask = torch.rand(b, 1, t, t, generator=g) > 0.3
    mask[0, 0, 2] = False
    mask[1, 0, t - 1] = False
    qkv = [x.to(dtype).to(DEVICE).requires_grad_() for x in (q, k, v)]
    return [*qkv, mask.to(DEVICE)]


def run(fn, args: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:  # noqa: ANN001
    args = [a.detach().requires_grad_(a.requires_grad) for a in args]
    y = fn(*args)
    cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y)
    y.backward(cot)
    return y, [a.grad for a in args if a.requires_grad]


@pytest.mark.parametrize(
    "backend,dtype",
    [("triton", F32), ("triton", BF16), ("cuda", BF16)],
    indirect=["backend"],
    ids=str,
)
def test_sdpa_math_path_fused(backend: str, dtype: torch.dtype) -> None:
    args = attention_inputs(dtype)
    fb = FuserBackend(strict=True, check=True)
    with sdpa_kernel([SDPBackend.MATH]):
        want, want_grads = run(attention, args)
        got, grads = run(torch.compile(attention, backend=fb, dynamic=False), args)
    tol = {} if dtype == F32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, want, **tol)
    for i, (a, b) in enumerate(zip(grads, want_grads)):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, i=i: f"grad {i}: {m}")
    # the query rows that see no key: zeros out, zero gradients, no NaN anywhere
    assert (got[0, :, 2] == 0).all() and (got[1, :, -1] == 0).all()
    assert (grads[0][0, :, 2] == 0).all() and not any(g.isnan().any() for g in grads)
    regions = [r for c in fb.captures for g in c.graphs for r in g.fused]
    forward = next(r for r in regions if "_safe_softmax" in r.ops)
    # the mask's add and the softmax: one kernel (the bool mask's where(mask, 0, -inf)
    # before it has one of its own: it is broadcast over the heads)
    (row,) = [k for k in forward.kernels if k.schedule.kind == "inner_persistent"]
    assert {"add", "max", "sum", "where"} <= {n.op.value for n in row.spec.segment.nodes}
    assert any("_softmax_backward_data" in r.ops for r in regions)
    text = str(explain(fb, brief=True))
    assert "aten._safe_softmax" not in text and "aten._softmax_backward_data" not in text, text


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_dtype_argument(backend: str) -> None:
    """_safe_softmax(x, dim, dtype): bf16 in, float32 out, computed as ATen does."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return aten._safe_softmax(x, -1, dtype=F32)

    x = masked((5, 11), -1, BF16).to(DEVICE)
    fb = FuserBackend(strict=True, check=True)
    y = torch.compile(fn, backend=fb, dynamic=False)(x)
    assert y.dtype == F32
    check(y, x.float(), -1)
    assert any("_safe_softmax" in r.ops for c in fb.captures for g in c.graphs for r in g.fused)
