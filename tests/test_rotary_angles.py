"""The rotary embedding as `transformers` computes it each forward, through torch.compile:
the angles' outer product `inv_freq @ positions` is a product that fuses (outer_product.py),
sibling kernels that read one input are one kernel (segment.py's sibling merge), and a
gradient in its output's layout reaches the backward without a copy (backend.py)."""

from __future__ import annotations

import pytest
import torch

import fuser
from fuser.dynamo import FuserBackend

B, HQ, HK, T, D = 2, 3, 2, 7, 12
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _rotate_half(x):  # noqa: ANN001, ANN202
    return torch.cat((-x[..., D // 2 :], x[..., : D // 2]), dim=-1)


def _from_positions(q, k, inv_freq, pos):  # noqa: ANN001, ANN202
    """transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb, as written there."""
    inv = inv_freq[None, :, None].float().expand(pos.shape[0], -1, 1)
    freqs = (inv @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(q.dtype).unsqueeze(1), emb.sin().to(q.dtype).unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _inputs(dtype: torch.dtype, transposed: bool):  # noqa: ANN202
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, T, HQ, D, generator=g).to(DEV, dtype).transpose(1, 2)
    k = torch.randn(B, T, HK, D, generator=g).to(DEV, dtype).transpose(1, 2)
    if not transposed:
        q, k = q.contiguous(), k.contiguous()
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.randint(0, 4096, (B, T), generator=g).to(DEV)  # large angles, any order
    return q, k, inv, pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_angles_outer_product_fuses(_fresh_dynamo, dtype):
    """The forward has no matmul left and computes the same values as eager (float32: the
    product is the matmul's to the bit, so the rotation matches to rounding); the
    backward's cos and sin of the saved angles are one kernel beside q's and k's."""
    q, k, inv, pos = _inputs(dtype, transposed=False)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    backend = FuserBackend(strict=True)
    compiled = torch.compile(_from_positions, backend=backend)
    outs, grads = [], []
    for fn in (_from_positions, compiled):
        qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
        o = fn(qq, kk, inv, pos)
        outs.append(o)
        grads.append(torch.autograd.grad(o, (qq, kk), (gq, gk)))
    tol = {"rtol": 2**-7, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    for got, want in zip(outs[1] + grads[1], outs[0] + grads[0]):
        torch.testing.assert_close(got, want, **tol)

    fw, bw = backend.captures[0].graphs
    assert fw.outer_products == 1
    called = [f.op for f in fw.fallbacks]
    assert not any("mm" in op for op in called), called
    assert "made products" in str(fuser.explain(compiled))
    kernels = [kk.spec.segment.ops_summary() for r in bw.fused for kk in r.kernels]
    # one kernel of sin and cos (was one per shifted sin, and one for cos), q's and k's
    assert len(kernels) == 3, kernels
    assert sum("sin" in s or "cos" in s for s in kernels) == 1, kernels


def test_matmul_of_one_element_is_a_product(_fresh_dynamo):
    """mm [M, 1] x [1, N] and bmm [B, M, 1] x [B, 1, N] become products, which match eager
    (to the exp and sin after them, fused kernels of their own rounding); a matmul
    contracting two elements stays one."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, 1, generator=g).to(DEV), torch.randn(1, 9, generator=g).to(DEV)
    ba, bb = torch.randn(3, 4, 1, generator=g).to(DEV), torch.randn(3, 1, 6, generator=g).to(DEV)
    wa, wb = torch.randn(5, 2, generator=g).to(DEV), torch.randn(2, 9, generator=g).to(DEV)

    def f(a, b, ba, bb, wa, wb):  # noqa: ANN001, ANN202
        return (a @ b).exp(), torch.bmm(ba, bb).sin(), (wa @ wb).exp()

    backend = FuserBackend(strict=True)
    args = (a, b, ba, bb, wa, wb)
    for got, want in zip(torch.compile(f, backend=backend)(*args), f(*args)):
        assert torch.equal(got, want) or torch.allclose(got, want, rtol=1e-6, atol=0)
    (fw,) = backend.captures[0].graphs
    assert fw.outer_products == 2
    assert sum("mm" in fb.op for fb in fw.fallbacks) == 1  # the K = 2 matmul


def test_tf32_keeps_the_matmul():
    """Where float32 matmuls may run in TF32 on a GPU, eager's angles are not the exact
    product: the matmul stays."""
    from fuser.dynamo.outer_product import _tf32

    was = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert _tf32(torch.float32, torch.device("cuda"))
        assert not _tf32(torch.bfloat16, torch.device("cuda"))
        assert not _tf32(torch.float32, torch.device("cpu"))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was


def test_gradient_in_the_outputs_layout_is_not_copied(_fresh_dynamo, monkeypatch):
    """q and k transposed as transformers makes them: their gradients, in the same layout,
    reach the compiled backward as they are, even where AOTAutograd's own default guesses
    contiguous tangents (torch 2.11), which copies them first."""
    import torch._functorch.config as fc
    from torch._functorch._aot_autograd import runtime_wrappers as rw

    if not hasattr(fc, "guess_tangent_strides_as_outputs"):
        pytest.skip("this torch has no guess_tangent_strides_as_outputs")
    coerce, copied = rw.coerce_to_expected_memory_format, []

    def watched(x, memory_format):  # noqa: ANN001, ANN202
        y = coerce(x, memory_format)
        copied.append(y is not x)
        return y

    monkeypatch.setattr(rw, "coerce_to_expected_memory_format", watched)
    q, k, inv, pos = _inputs(torch.float32, transposed=True)
    qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
    # (the config's own patch: monkeypatch would delete the key on undo)
    with fc.patch(guess_tangent_strides_as_outputs=False):
        compiled = torch.compile(_from_positions, backend=FuserBackend(strict=True))
        out = compiled(qq, kk, inv, pos)
    assert out[0].stride() == q.stride()  # written in q's layout
    gq, gk = torch.randn_like(q), torch.randn_like(k)  # randn_like keeps the layout
    got = torch.autograd.grad(out, (qq, kk), (gq, gk))
    assert copied and not any(copied), copied
    want = torch.autograd.grad(_from_positions(qq, kk, inv, pos), (qq, kk), (gq, gk))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(6, 40), (3, 5, 33)])
def test_sibling_kernels_that_read_one_input_are_one(backend, shape):
    """sin(x) * 2 and cos(x) + x, no edge between them: one kernel that reads x once (two
    before), on both backends, odd and misaligned sizes, x a non-contiguous view."""
    with fuser.FusionDefinition("siblings") as fd:
        x = fd.define_tensor(list(shape), torch.float32)
        two = fd.ops.add(x, x)
        fd.add_output(fd.ops.mul(fd.ops.sin(x), two))
        fd.add_output(fd.ops.add(fd.ops.cos(x), x))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(*shape[:-1], shape[-1] + 3, generator=g).to(DEV)[..., 1:-2]
    a, b = fd.execute([x])
    torch.testing.assert_close(a, x.sin() * (x + x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b, x.cos() + x, rtol=1e-5, atol=1e-5)
    assert len(fd._runtime().last.kernels) == 1


def test_expanded_output_keeps_torchs_tangent_guess(_fresh_dynamo):
    """An output whose elements share memory (an expand) cannot take its gradient in its
    own strides (torch 2.11 failed copying into them): such a graph keeps AOTAutograd's
    guess, and its backward runs and matches eager; a graph of dense outputs does not."""
    from fuser.dynamo.backend import _overlapping_output

    graphs = []

    def record(gm, example_inputs):  # noqa: ANN001, ANN202
        graphs.append(gm)
        return gm.forward

    def expanded(x):  # noqa: ANN001, ANN202
        return x.sin().unsqueeze(1).expand(4, 3, 6), x * 2

    def dense(x):  # noqa: ANN001, ANN202
        return x.sin().t(), x * 2

    x = torch.randn(4, 6, device=DEV)
    for fn in (expanded, dense):
        torch.compile(fn, backend=record)(x)
    assert _overlapping_output(graphs[0]) and not _overlapping_output(graphs[1])

    torch._dynamo.reset()
    xx = x.clone().requires_grad_()
    out = torch.compile(expanded, backend=FuserBackend(strict=True))(xx)
    g = [torch.randn(o.shape, device=DEV) for o in out]
    got = torch.autograd.grad(out, xx, g)[0]
    want = torch.autograd.grad(expanded(xx), xx, g)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
