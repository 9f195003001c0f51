"""Cats of views with other strides, through torch.compile.

A fused cat reads each piece through its own strides (a transposed head, a column slice,
a permutation) and writes the contiguous result: no contiguous copy of a piece first. A
cat with one piece that holds something (a KV cache's first step: cat([empty, k],
dim=-2), 24 of them in a GPT-2 step) is a copy kernel along any dim. A cat of several
pieces along another dim stays ATen, with the reason in explain. Forward and backward
against eager, float32 and bfloat16.
"""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import FuserBackend
from fuser.dynamo.explain import explain

F32, BF16 = torch.float32, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def leaf(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE).requires_grad_()


def run_both(fn, args: list[torch.Tensor], dtype: torch.dtype) -> FuserBackend:  # noqa: ANN001
    """fn compiled with fuser (strict, each region checked against its ATen ops) against
    eager: the outputs, and the gradients of the inputs for a random cotangent."""
    fb = FuserBackend(strict=True, check=True)
    compiled = torch.compile(fn, backend=fb, dynamic=False)
    results = []
    for f in (fn, compiled):
        xs = [a.detach().requires_grad_(a.requires_grad) for a in args]
        y = f(*xs)
        cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(9)).to(y)
        y.backward(cot)
        results.append((y, [x.grad for x in xs if x.requires_grad]))
    (want, want_grads), (got, grads) = results
    assert got.is_contiguous() and got.stride() == want.stride()
    tol = {} if dtype == F32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got, want, **tol)
    for i, (a, b) in enumerate(zip(grads, want_grads)):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, i=i: f"grad {i}: {m}")
    return fb


def regions(fb: FuserBackend) -> list:
    return [r for c in fb.captures for g in c.graphs for r in g.fused]


def fused_with(fb: FuserBackend, op: str) -> list:
    """The fused regions holding `op`; each reads every input in place (no contiguous
    copies made before its kernels run)."""
    found = [r for r in regions(fb) if op in r.ops.split(", ") or f"{op} x" in r.ops]
    for r in found:
        assert not r.fd._runtime().last.copied, f"{r.name} copies an input first"
    return found


def aten_calls(fb: FuserBackend) -> str:
    return "\n".join(
        f"{f.op}: {f.reason}" for c in fb.captures for g in c.graphs for f in g.fallbacks
    )


# -- a cat along the last dim of strided pieces ------------------------------------------
def three_views(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """[2, 5, 3, 4 + 5 + 7]: heads transposed out of [B, H, T, D], a column slice of a
    wider tensor, a permutation; scaled, so the cat joins the multiply's kernel."""
    pieces = [a.transpose(1, 2), b[..., 2:7], c.permute(1, 2, 0, 3)]
    return torch.cat(pieces, dim=-1) * 1.5


def three_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    return [
        leaf(2, 3, 5, 4, dtype=dtype, seed=1),
        leaf(2, 5, 3, 9, dtype=dtype, seed=2),
        leaf(3, 2, 5, 7, dtype=dtype, seed=3),
    ]


@pytest.mark.parametrize(
    "backend,dtype",
    [("triton", F32), ("triton", BF16), ("cuda", BF16)],
    indirect=["backend"],
    ids=str,
)
def test_last_dim_cat_reads_pieces_through_their_strides(backend: str, dtype: torch.dtype):
    fb = run_both(three_views, three_inputs(dtype), dtype)
    (r,) = [r for r in fused_with(fb, "cat") if "mul.Tensor" in r.ops]
    assert len(r.kernels) == 1
    assert "aten.cat" not in aten_calls(fb)


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_strided_graph_inputs(backend: str):
    """Pieces that come in strided (Dynamo's inputs themselves views) and a piece of no
    columns, which the cat skips."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(7, 6, 3, generator=g).to(DEVICE).permute(2, 1, 0)  # [3, 6, 7]
    b = torch.randn(3, 6, 12, generator=g).to(DEVICE)[:, :, 1:12:2]  # [3, 6, 6], a step of 2

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a, b[..., :0], b], dim=2)

    args = [t.requires_grad_() for t in (a, b)]
    fb = run_both(fn, args, F32)
    assert fused_with(fb, "cat")


# -- a cat of one piece: a copy kernel, along any dim ------------------------------------
def kv_cache_first_step(k: torch.Tensor) -> torch.Tensor:
    """transformers' DynamicCache on its first step: cat([past, k], dim=-2), the past a
    legacy empty [0] tensor, k the heads transposed out of the projection's output."""
    return torch.cat([torch.tensor([], device=k.device, dtype=k.dtype), k.transpose(1, 2)], -2)


@pytest.mark.parametrize(
    "backend,dtype",
    [("triton", F32), ("triton", BF16), ("cuda", F32)],
    indirect=["backend"],
    ids=str,
)
def test_cat_with_an_empty_past_is_a_copy_kernel(backend: str, dtype: torch.dtype):
    fb = run_both(kv_cache_first_step, [leaf(2, 7, 3, 5, dtype=dtype, seed=5)], dtype)
    (r,) = fused_with(fb, "cat")
    (k,) = r.kernels
    assert {n.op.value for n in k.spec.segment.nodes} == {"view"}  # a read, then the store
    calls = aten_calls(fb)
    assert "aten.cat" not in calls and "lift_fresh_copy" not in calls, calls
    text = str(explain(fb, brief=True))
    assert "cat  (1 inputs, 1 outputs" in text, text  # the empty constant is no input


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_an_empty_past_that_widens_the_dtype(backend: str):
    """transformers' cache under autocast: the rotary embedding's keys come out in fp32, so
    the cache's empty past is fp32, and the bf16 values' cat with it is fp32 (ATen promotes
    over empty pieces too). The values are cast instead: the cat, the repeat over the
    query heads (repeat_kv) and the cast back to bf16 are fused kernels, not ATen ops."""

    def fn(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        past = torch.tensor([], device=v.device, dtype=torch.float32)
        cache = torch.cat([past, v.transpose(1, 2)], -2)  # [2, 2, 5, 8] fp32
        b, g, t, d = cache.shape
        rep = cache[:, :, None].expand(b, g, 3, t, d).reshape(b, g * 3, t, d)
        return cache, rep.to(torch.bfloat16) * 2

    v = leaf(2, 5, 2, 8, dtype=BF16, seed=7)
    fb = FuserBackend(strict=True, check=True)
    compiled = torch.compile(fn, backend=fb, dynamic=False)
    got, want = compiled(v), fn(v)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)
    text = str(explain(fb))
    assert "empty tensors" not in text and "aten.cat" not in text, text
    assert "ATen fallback" not in text and fb.captures[0].graphs[0].kernels, text


@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_cat_of_one_piece_along_a_middle_dim(backend: str):
    """Pieces of no extent along the dim are skipped: a copy of the one left."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        v = x.transpose(0, 2)  # [4, 3, 5]
        return torch.cat([v[:, :0], v, v[:, 3:]], dim=1)

    fb = run_both(fn, [leaf(5, 3, 4, dtype=F32, seed=6)], F32)
    assert fused_with(fb, "cat")


# -- several pieces along another dim: ATen, and why -------------------------------------
@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_cat_of_pieces_along_a_row_dim_stays_aten(backend: str):
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cat([a.transpose(1, 2), b.transpose(1, 2)], dim=-2) * 2

    args = [leaf(2, 5, 3, 4, dtype=F32, seed=8), leaf(2, 6, 3, 4, dtype=F32, seed=9)]
    fb = run_both(fn, args, F32)
    calls = aten_calls(fb)
    assert "cat of 2 tensors along dim 2 of a rank-4 tensor: only the last dim" in calls, calls


@pytest.mark.parametrize("check", [False, True], ids=["program", "module"])
def test_output_that_is_a_permuted_input_gets_atens_strides(check: bool):
    """A cast to fp32 and back simplifies to the region's input, here a permuted view; the
    cat between made ATen's strides the contiguous ones, which the view after it needs
    (transformers' CodeGen under autocast failed there: "view size is not compatible").
    The output is a contiguous copy, in the call program and in the region module."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = x.permute(0, 2, 1, 3)  # [2, 3, 5, 8], not contiguous
        wide = torch.cat([p.float()], dim=-2)  # a kernel's output: the cache
        return wide, torch.matmul(wide.to(torch.bfloat16), w)  # expand, view, bmm

    x = torch.randn(2, 5, 3, 8).to(BF16).to(DEVICE)
    w = torch.randn(2, 3, 8, 4).to(BF16).to(DEVICE)
    fb = FuserBackend(strict=True, check=check)
    got = torch.compile(fn, backend=fb, dynamic=False)(x, w)
    for a, b in zip(got, fn(x, w)):
        torch.testing.assert_close(a, b)
