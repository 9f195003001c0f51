"""The one-pass cross-entropy's gradient with 16-byte aligned rows (fuser/dynamo/ce_op.py
`aligned`, chosen by ce_rewrite.py for logits made inside the graph).

- the op's eager implementation and its fake return the same strides: V rounded up to 16
  bytes when aligned, contiguous otherwise;
- under torch.compile the loss and the gradients match eager (F.cross_entropy of the
  logits upcast to float32, as the step writes it) for odd V, logits
  that are a slice of wider rows (pad_mm.py's padded lm head), an lm head in the graph and
  contiguous graph-input logits, bf16 and fp32, ignored rows, every reduction, label
  smoothing and an upstream gradient that is not 1 (the in-place scaling and, for 'none',
  the lowered fuser::cross_entropy_grad); the saved gradient has the aligned rows and the
  row kernel writes them in place (no copy to ATen's strides);
- on the H100 preset, planned from meta tensors at GPT-2's 16384 x 50257 (no execution),
  the row kernel moves 16-byte vectors of both the logits and the gradient (vector 8 for
  bf16, no narrower store) on both backends, and Triton's sm_90 machine code has the
  16-byte loads and stores (compiled without a GPU);
- float32 logits with a mean keep one row kernel (the count's kernel runs first);
- a small lm head padded by pad_mm.py: the backward's matmuls read the aligned gradient's
  own rows as padded ones (ce_pad.py), and the gradients are eager's.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from fuser.dynamo import FuserBackend
from fuser.dynamo.ce_op import grad_row_stride
from fuser.dynamo.ce_pad import padded_rows
from fuser.dynamo.ce_region import one_pass_fusion

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GRAD_TOL = {F32: 1e-5, BF16: 1.6e-2}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("v", [1, 7, 101, 1024, 50257])
def test_op_and_fake_strides(dtype: torch.dtype, v: int) -> None:
    per = 16 // dtype.itemsize
    want = -(-v // per) * per
    assert grad_row_stride(v, dtype) == want and want % per == 0 and 0 <= want - v < per
    x = torch.empty(3, v, dtype=dtype, device="meta")
    t = torch.empty(3, dtype=torch.int64, device="meta")
    for aligned, stride in ((True, want), (False, v)):
        for where in ("meta", "cpu") if v < 2000 else ("meta",):
            xs = torch.randn(3, v).to(dtype) if where == "cpu" else x
            ts = torch.randint(0, v, (3,)) if where == "cpu" else t
            _, grad = torch.ops.fuser.cross_entropy(xs, ts, 1, -100, 0.0, True, aligned)
            assert grad.shape == (3, v) and grad.stride() == (stride, 1), (where, aligned)
            scaled = torch.ops.fuser.cross_entropy_grad(grad, torch.tensor(2.0, device=where))
            assert scaled.stride() == grad.stride()


def test_eager_op_values_with_aligned_rows() -> None:
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 101, generator=g) * 2).to(BF16)
    t = torch.randint(0, 101, (5,), generator=g)
    t[1] = -100
    xr = x.float().requires_grad_(True)
    want = F.cross_entropy(xr, t, label_smoothing=0.1)
    want.backward()
    loss, grad = torch.ops.fuser.cross_entropy(x, t, 1, -100, 0.1, True, True)
    assert grad.stride() == (104, 1)
    torch.testing.assert_close(loss, want.detach())
    torch.testing.assert_close(grad.float(), xr.grad, atol=1e-3, rtol=1.6e-2)


def _data(rows: int, cols: int, dtype: torch.dtype, seed: int):  # noqa: ANN202
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, cols, generator=g) * 2).to(dtype)
    return x.to(DEVICE), g


# (layout, dtype, V, reduction, label smoothing, upstream gradient): "sliced" logits are
# the first V columns of wider rows (pad_mm.py's lm head), "lm_head" a matmul in the
# graph, "contiguous" a graph input (its gradient keeps eager's contiguous rows)
CASES = [
    ("sliced", BF16, 101, "mean", 0.0, 1.0),
    ("sliced", BF16, 1001, "sum", 0.1, 1.0),
    ("sliced", BF16, 1001, "none", 0.0, 2.5),
    ("sliced", F32, 1001, "mean", 0.2, 0.5),
    ("sliced", F32, 101, "none", 0.1, 1.0),
    ("lm_head", BF16, 1001, "mean", 0.0, 1.0),
    ("lm_head", F32, 101, "sum", 0.0, 3.0),
    ("contiguous", BF16, 1001, "mean", 0.1, 1.0),
    ("contiguous", F32, 101, "sum", 0.0, 0.25),
]


def _logits(layout: str, a: torch.Tensor, w: torch.Tensor | None, v: int) -> torch.Tensor:
    if layout == "sliced":
        return a[:, :v]
    if layout == "lm_head":
        return a @ w.t()
    return a


def _compiled_and_eager(layout, dtype, v, reduction, eps, upstream, rows=9):  # noqa: ANN001, ANN202
    """((loss, grads) compiled, (loss, grads) eager, the backend, the saved tensors)."""
    ignored = (2, 5)
    if layout == "sliced":
        # rows that start unaligned (fp32: v + 2) and aligned ones (bf16: V's rounding + 8)
        width = v + 2 if dtype == F32 else grad_row_stride(v, dtype) + 8
        a, g = _data(rows, width, dtype, 1)
        w = None
    elif layout == "lm_head":
        a, g = _data(rows, 24, dtype, 2)
        w = (torch.randn(v, 24, generator=g) * 0.3).to(dtype).to(DEVICE)
    else:
        a, g = _data(rows, v, dtype, 3)
        w = None
    t = torch.randint(0, v, (rows,), generator=g).to(DEVICE)
    t[list(ignored)] = -1

    def f(a, w, t):
        x = _logits(layout, a, w, v)
        return F.cross_entropy(x.float(), t, reduction=reduction, ignore_index=-1,
                               label_smoothing=eps)  # fmt: skip

    def run(fn, cast):  # noqa: ANN001, ANN202
        ac = a.detach().to(cast).requires_grad_(True)
        wc = w.detach().to(cast).requires_grad_(True) if w is not None else None
        loss = fn(ac, wc, t)
        (loss * upstream).sum().backward()
        grads = [ac.grad] + ([wc.grad] if wc is not None else [])
        return loss.detach(), grads

    b = FuserBackend(strict=True)
    saved: list[torch.Tensor] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        got = run(torch.compile(f, backend=b), dtype)
    want = run(f, dtype)  # eager: the loss in float32 from the same logits, as written
    return got, want, b, saved


@pytest.mark.parametrize(("layout", "dtype", "v", "reduction", "eps", "upstream"), CASES)
def test_compiled_matches_eager(layout, dtype, v, reduction, eps, upstream) -> None:  # noqa: ANN001
    (loss, grads), (want_loss, want_grads), b, saved = _compiled_and_eager(
        layout, dtype, v, reduction, eps, upstream
    )
    assert sum(c.cross_entropy for c in b.captures) == 1, "the call was not made one-pass"
    ltol = 1e-5 if dtype == F32 else 1e-4
    torch.testing.assert_close(loss, want_loss, atol=ltol, rtol=ltol)
    tol = GRAD_TOL[dtype]
    for got, want in zip(grads, want_grads):
        assert got.dtype == want.dtype == dtype
        scale = want.abs().max().item()
        torch.testing.assert_close(got.float(), want.float(), atol=tol * scale, rtol=tol)
    if layout == "sliced":  # the pad columns of the wider rows get no gradient
        assert not grads[0][:, v:].any()

    # the saved gradient: aligned rows for logits made in the graph, eager's otherwise
    rows = [s for s in saved if s.dim() == 2 and s.shape[-1] == v and s.dtype == dtype]
    stride = v if layout == "contiguous" else grad_row_stride(v, dtype)
    assert [r.stride() for r in rows] == [(stride, 1)], [(r.shape, r.stride()) for r in rows]
    assert rows[0].data_ptr() % 16 == 0
    # written in place by the row kernel: no output of the region is copied to its strides
    fw = b.captures[0].graphs[0]
    (region,) = [r for r in fw.fused if "fuser.cross_entropy" in r.ops]
    assert region.restrided == []
    (kernel,) = [k for k in region.kernels if k.spec.cols == v]
    outs = [a for a in kernel.spec.full_args() if a.is_output]
    assert [a.row_stride for a in outs] == [stride]


def _row_kernel(rows: int, v: int, stride: int, backend: str, dtype: torch.dtype = BF16):  # noqa: ANN202
    """The one-pass row kernel of a region holding fuser::cross_entropy of [rows, v]
    logits with row stride `stride`, planned for the H100 preset from meta tensors."""
    xm = torch.empty_strided((rows, v), (stride, 1), dtype=dtype, device="meta")
    tm = torch.empty(rows, dtype=torch.int64, device="meta")
    fd = one_pass_fusion(xm, tm)
    return max(fd.compile([xm, tm], "h100", backend), key=lambda k: k.spec.cols)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("stride", [50264, 50304])
def test_gpt2_row_kernel_moves_16_byte_vectors(backend: str, stride: int) -> None:
    """GPT-2's logits as pad_mm.py leaves them (a slice of 16-byte aligned rows) and the
    aligned gradient: both read and written 8 bf16 elements at a time."""
    k = _row_kernel(16384, 50257, stride, backend)
    s, plan = k.schedule, k.plan
    assert s.kind == "inner_looped" and s.vector == 8 and not s.align_walk, s.explain()
    assert "narrower stores" not in s.explain(), s.explain()
    fulls = {a.name: a for a in k.spec.full_args()}
    (out,) = [a for a in fulls.values() if a.is_output]
    assert out.row_stride == 50264 and out.align == 16
    narrow = {name for name, w, p in plan.packs if w == s.vector and p < w}
    assert not narrow & set(fulls), plan.text()
    if backend == "triton":  # the store's row offset is a multiple of 8 elements
        assert f"tl.store({out.name}_ptr + rows * 50264 + cols, " in k.source, k.source


def test_gpt2_row_kernel_contiguous_logits_aligned_gradient() -> None:
    """Odd contiguous logits limit Triton's loads to vector 1 (its aligned-start walk is
    off); the aligned gradient is still planned with its own aligned rows."""
    k = _row_kernel(16384, 50257, 50257, "triton")
    (out,) = [a for a in k.spec.full_args() if a.is_output]
    assert out.row_stride == 50264
    assert k.schedule.vector == 1, k.schedule.explain()


def test_gpt2_row_kernel_machine_code_has_16_byte_accesses() -> None:
    """Triton's alignment analysis proves what the plan says: compiled for sm_90 (no GPU
    needed), the row kernel over aligned logits loads and stores 16 bytes at a time in
    its unmasked loop (the masked tail stays 2 bytes wide: 50257 is odd)."""
    from fuser.backends.registry import get_backend

    k = _row_kernel(16384, 50257, 50264, "triton")
    code = get_backend("triton").sass(k)
    # the walk's loads carry L2 hints (plan.walk_evict): LDG.E.EL.128, LDG.E.EF.128
    assert re.search(r"LDG\.E(\.E[LF])?\.128", code) and "STG.E.128" in code, code[:2000]


@pytest.mark.parametrize("returns_logits", [False, True])
def test_padded_lm_head_backward(monkeypatch: pytest.MonkeyPatch, returns_logits: bool) -> None:
    """GPT-2's step in small: an lm head padded by pad_mm.py (N 45 -> 48), the one-pass
    cross-entropy over its sliced rows, and the backward's matmuls reading the aligned
    gradient rows as padded ones in place (ce_pad.py), whether or not the step also
    returns its logits: gradients as eager's."""
    from fuser.dynamo import pad_mm

    monkeypatch.setattr(pad_mm, "MIN_MACS", 0)
    monkeypatch.setattr(pad_mm, "MIN_PADDED_DIM", 1)
    g = torch.Generator().manual_seed(7)
    x0, w0 = torch.randn(2, 12, 32, generator=g), torch.randn(45, 32, generator=g) * 0.3
    target = torch.randint(0, 45, (24,), generator=g)

    def step(x, w):  # noqa: ANN001, ANN202
        logits = x.bfloat16() @ w.bfloat16().t()
        loss = F.cross_entropy(logits.view(-1, 45).float(), target)
        return (loss, logits) if returns_logits else loss

    results, b = [], FuserBackend(strict=True)
    for fn in (step, torch.compile(step, backend=b)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fn(x, w)
        (out[0] if returns_logits else out).backward()
        results.append((out[0] if returns_logits else out, x.grad, w.grad))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert any("N 45 -> 48" in n for c in b.captures for gr in c.graphs for n in gr.matmuls_padded)
    bw = b.captures[0].graphs[1]
    # no pad kernel: the matmuls read the gradient's own rows (ce_pad.py); the returned
    # logits get no gradient here (their tangent is absent, not zeros: tangents.py)
    views = [n for n in bw.module.graph.nodes if n.target is padded_rows]
    assert len(views) == 1, bw.module.code
