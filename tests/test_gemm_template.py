"""The GEMM template (issue 22) against PyTorch through Triton's interpreter at tiny odd
shapes: each epilogue (bias, GELU erf/tanh with the saved pre-activation, residual, cast),
the GELU-backward epilogue, the bias-gradient sums, the cast/scale prologue, transposed
and non-contiguous operands, M=1 and K below a tile, fp16/bf16; the plan, the roofline
choice and its modes; then torch.compile(backend="fuser") with FUSER_GEMM=template on a
Linear -> GELU -> Linear + residual block, forward and backward, against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.codegen.triton.gemm import render_gemm
from fuser.config import config
from fuser.errors import FuserError
from fuser.runtime.gemm import aten_gemm, gemm, plan_for, shape_of
from fuser.runtime.gemm_resources import plan_resources
from fuser.runtime.gemm_tune import decide
from fuser.schedulers.device import PRESETS
from fuser.schedulers.gemm import Epilogue, GemmShape, plan_gemm, unsupported
from fuser.schedulers.gemm_choice import choose, estimate

H100 = PRESETS["h100"]


def _operand(rows: int, cols: int, kind: str) -> torch.Tensor:
    """n: contiguous; t: a transpose (column-major); s: every other column of a wider
    buffer (neither of the last two is contiguous)."""
    if kind == "t":
        return torch.randn(cols, rows).t()
    if kind == "s":
        return torch.randn(rows, 2 * cols)[:, ::2]
    return torch.randn(rows, cols)


def _operands(m, n, k, dtype=torch.float32, layout="nn"):
    a, b = _operand(m, k, layout[0]), _operand(k, n, layout[1]) / k**0.5
    return a.to(dtype), b.to(dtype)


# (M, N, K, layout): none a multiple of the 32-wide CPU tiles; one row; K below a tile
SHAPES = [(37, 45, 29, "nn"), (37, 45, 29, "tt"), (1, 45, 29, "ns"), (37, 19, 5, "st")]

EPILOGUES = {
    "plain": Epilogue(),
    "bias": Epilogue(bias=True),
    "bias_gelu_aux": Epilogue(bias=True, activation="gelu", aux=True),
    "bias_gelu_tanh_res": Epilogue(bias=True, activation="gelu_tanh", residual=True),
    "dgelu": Epilogue(gelu_grad="gelu"),
    "dgelu_tanh_res": Epilogue(gelu_grad="gelu_tanh", residual=True),
    "rowsum": Epilogue(reduce="a_rows"),
    "colsum_bias": Epilogue(bias=True, reduce="b_cols"),
}


def _extras(e: Epilogue, m: int, n: int, dtype=torch.float32) -> dict:
    kw = {}
    if e.bias:
        kw["bias"] = torch.randn(n, dtype=dtype)
    if e.residual:
        kw["residual"] = torch.randn(m, n, dtype=dtype)
    if e.gelu_grad != "none":
        kw["pre"] = torch.randn(2 * m, n, dtype=dtype)[::2]  # strided: read in place
    if e.a_scale:
        kw["scale"] = 0.37
    return kw


def _check(got, want, atol, rtol):
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("case", SHAPES, ids=lambda c: "{}x{}x{}_{}".format(*c))
def test_epilogue_matches_aten_fp32(case, name):
    m, n, k, layout = case
    torch.manual_seed(m * n + k)
    e = EPILOGUES[name]
    a, b = _operands(m, n, k, layout=layout)
    kw = _extras(e, m, n)
    _check(gemm(a, b, e, **kw), aten_gemm(a, b, e, **kw), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_inputs_fp32_accumulation(dtype):
    """fp16 and bf16 operands (bf16's dot in fp32 in the interpreter: exact products), the
    pre-activation stored at the input dtype, the output cast to fp32 in the epilogue."""
    torch.manual_seed(5)
    m, n, k = 37, 45, 29
    a, b = _operands(m, n, k, dtype, "tn")
    e = Epilogue(bias=True, activation="gelu_tanh", aux=True)
    kw = {"bias": torch.randn(n, dtype=dtype)}
    out, aux, _ = gemm(a, b, e, out_dtype=torch.float32, **kw)
    want_out, want_aux, _ = aten_gemm(a.float(), b.float(), e, bias=kw["bias"].float())
    assert out.dtype == torch.float32 and aux.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(aux.float(), want_aux, atol=tol, rtol=tol)


def test_bf16_results_round_to_nearest_even():
    """Found by the GEMM fuzzer: Triton 3.6's interpreter truncates float32 -> bf16 (half
    the elements an ulp low); the CPU plans convert through the bits, so the bf16
    results are the fp32 tile rounded as torch rounds it (an fp32 summation order that
    differs from torch's may flip an element at a rounding boundary)."""
    torch.manual_seed(11)
    a, b = _operands(37, 45, 29, torch.bfloat16)
    bias = torch.randn(45, dtype=torch.bfloat16)
    e = Epilogue(a_scale=True, bias=True, activation="gelu", aux=True)
    out, aux, _ = gemm(a, b, e, bias=bias, scale=0.37)
    a_scaled = (a.float() * 0.37).to(torch.bfloat16).float()
    pre = a_scaled @ b.float() + bias.float()
    for got, want in ((aux, pre.to(torch.bfloat16)), (out, F.gelu(pre).to(torch.bfloat16))):
        assert (got != want).float().mean() < 0.01, (got != want).float().mean()


def test_prologue_cast_and_scale():
    """A stored as fp16, cast to fp32 and scaled in the prologue; its row sums are of A
    as stored (the operand the bias gradient sums)."""
    torch.manual_seed(6)
    a16 = torch.randn(29, 37, dtype=torch.float16).t()
    b = torch.randn(29, 45)
    e = Epilogue(a_cast="fp32", a_scale=True, bias=True)
    kw = {"bias": torch.randn(45), "scale": 0.37}
    _check(gemm(a16, b, e, **kw), aten_gemm(a16, b, e, **kw), atol=2e-5, rtol=1e-5)
    e = Epilogue(a_scale=True, reduce="a_rows")
    a = torch.randn(37, 29)
    _check(gemm(a, b, e, scale=2.5), aten_gemm(a, b, e, scale=2.5), atol=5e-5, rtol=1e-5)


def test_bias_gradient_sums_are_deterministic():
    """dW = dYᵀ X with db = colsum(dY) from the same tiles: equal bits run to run."""
    torch.manual_seed(7)
    dy, x = torch.randn(53, 19), torch.randn(53, 23)
    e = Epilogue(reduce="a_rows")
    dw1, _, db1 = gemm(dy.t(), x, e)
    dw2, _, db2 = gemm(dy.t(), x, e)
    assert torch.equal(db1, db2) and torch.equal(dw1, dw2)
    torch.testing.assert_close(db1, dy.sum(0), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(dw1, dy.t() @ x, atol=2e-5, rtol=1e-5)


def test_bad_inputs_are_clear_errors():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with pytest.raises(FuserError, match=r"A \[5, 7\] @ B \[6, 3\]"):
        gemm(a, torch.randn(6, 3))
    with pytest.raises(FuserError, match="bias must have N=3"):
        gemm(a, b, Epilogue(bias=True), bias=torch.randn(4))
    with pytest.raises(FuserError, match="the residual"):
        gemm(a, b, Epilogue(residual=True))
    with pytest.raises(FuserError, match="tl.dot takes one dtype"):
        gemm(a.half(), b)
    with pytest.raises(ValueError, match="aux stores the pre-activation"):
        Epilogue(aux=True)


def test_source_header_and_masks():
    """The header says what is fused, the tiles and why; exact tiles print no masks."""
    e = Epilogue(bias=True, activation="gelu_tanh", aux=True)
    src = render_gemm(plan_gemm(GemmShape(64, 32, 96, "fp32", "fp32", "fp32", "cpu"), e))
    assert "fused: + bias[n], store pre-activation, gelu(tanh)" in src
    assert "tiles: BLOCK_M=32 BLOCK_N=32 BLOCK_K=32" in src and "why: CPU interpreter" in src
    assert "mask" not in src.split('"""')[2]  # 64 x 32 x 96 divide the tiles
    odd = render_gemm(plan_gemm(GemmShape(33, 32, 48, "bf16", "bf16", "bf16", "cpu", True), e))
    assert "rows[:, None] < M" in odd and "cols[None, :] < N" not in odd
    assert "rows64 = rows.to(tl.int64)" in odd and "tl.dot(_f32(a), _f32(b)" in odd
    assert "_cvt(x, C.dtype.element_ty)" in odd  # bf16 rounded to nearest even


GPT2 = {  # M = B*T = 16384 rows of GPT-2 124M
    "fc": (GemmShape(16384, 3072, 768, "bf16", "bf16", "bf16", "cuda"),
           Epilogue(bias=True, activation="gelu_tanh", aux=True)),
    "proj": (GemmShape(16384, 768, 3072, "bf16", "bf16", "bf16", "cuda"),
             Epilogue(bias=True, residual=True)),
    "dx": (GemmShape(16384, 3072, 768, "bf16", "bf16", "bf16", "cuda"),
           Epilogue(gelu_grad="gelu_tanh")),
    "dw": (GemmShape(768, 3072, 16384, "bf16", "bf16", "bf16", "cuda"), Epilogue(reduce="a_rows")),
}  # fmt: skip


def test_gpu_tiles_for_gpt2_shapes():
    for name, (shape, e) in GPT2.items():
        plan = plan_gemm(shape, e, H100.sms)
        t = plan.tiles
        assert t.smem(2) <= 200 * 1024 and plan.even_m and plan.even_n and plan.even_k, name
        assert any("waves" in r for r in plan.reasons), plan.reasons
        if e.activation != "none" or e.gelu_grad != "none":
            assert t.block_m * t.block_n <= 128 * 128, f"{name}: a GELU epilogue spills at 128x256"
    assert plan_gemm(*GPT2["proj"], H100.sms).tiles.block_n == 256  # 3 waves, not 6


def test_estimate_and_choice_modes():
    shape, e = GPT2["fc"]
    est = estimate(shape, e, H100)
    # the separate GELU kernel re-reads and re-writes the [16384, 3072] activation
    assert est.aten_bytes > est.template_bytes and est.template_us < est.aten_us
    default = choose(shape, e, None, "aten", H100)
    assert not default.template and "FUSER_GEMM=aten (the default)" in default.line()
    forced = choose(shape, e, None, "template", H100)
    assert forced.template and forced.plan is not None and "estimate:" in forced.line()
    auto = choose(shape, e, None, "auto", H100)
    assert auto.template and "no measurement: the estimate says template" in auto.line()
    measured = {"template_ms": 0.30, "aten_ms": 0.25, "device": "H100", "tiles": None}
    slow = choose(shape, e, None, "auto", H100, measured=measured)
    assert not slow.template and "0.300 ms vs cuBLAS + separate kernel 0.250 ms" in slow.line()
    cuda = choose(shape, e, None, "template", H100, template_backend=False)
    assert not cuda.template and "the CUDA backend has no GEMM template" in cuda.line()
    plain = choose(shape, Epilogue(), None, "template", H100)
    assert not plain.template and "nothing to fuse" in plain.line()
    cpu = decide(shape_of(torch.randn(3, 4), torch.randn(4, 5), e), e, "auto")
    assert not cpu.template and "FUSER_GEMM=auto on CPU" in cpu.line()
    fp32 = GemmShape(64, 64, 64, "fp32", "fp32", "fp32", "cuda")
    assert "fp32 on the GPU" in unsupported(fp32, e)
    assert "an empty output" in unsupported(GemmShape(0, 4, 4, "fp32", "fp32", "fp32", "cpu"), e)
    assert plan_for(shape, e) is plan_for(shape, e)  # planned once per shape


class Block(torch.nn.Module):
    """Linear -> GELU -> Linear + residual, GPT-2's MLP at toy size."""

    def __init__(self, c: int = 29, hidden: int = 45):
        super().__init__()
        self.fc = torch.nn.Linear(c, hidden)
        self.proj = torch.nn.Linear(hidden, c)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(x), approximate="tanh"))


def _compiled_vs_eager(monkeypatch, mode: str, dtype=torch.float32, tol=1e-4) -> str:
    monkeypatch.setattr(config, "gemm", mode)
    torch._dynamo.reset()  # the choice is made when a graph is compiled: compile anew
    torch.manual_seed(0)
    m = Block().to(dtype)
    x = torch.randn(3, 13, 29, dtype=dtype, requires_grad=True)
    m(x).square().sum().backward()
    want = [x.grad] + [p.grad for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    cm = torch.compile(m, backend="fuser")
    for _ in range(2):  # the first call runs the graph, the second the call program
        x.grad = None
        m.zero_grad()
        out = cm(x)
        out.square().sum().backward()
        out_tol = tol / 10 if dtype == torch.float32 else tol  # bf16: one ulp at 2 is 0.016
        torch.testing.assert_close(out, m(x), atol=out_tol, rtol=out_tol)
        for got, w in zip([x.grad] + [p.grad for p in m.parameters()], want, strict=True):
            torch.testing.assert_close(got, w, atol=tol, rtol=tol)
    return str(fuser.explain(cm))


def test_compiled_mlp_with_template_matches_eager(monkeypatch):
    text = _compiled_vs_eager(monkeypatch, "template")
    for fused in (
        "template gemm_bias_gelu_tanh_aux_fp32",  # fc: bias + GELU, pre-activation saved
        "template gemm_bias_res_fp32",  # proj: bias + residual
        "template gemm_dgelu_tanh_fp32",  # dX of proj with the GELU backward
        "template gemm_rowsum_fp32",  # dW with the bias gradient (twice)
    ):
        assert fused in text, fused
    assert "FUSER_GEMM=template forces it" in text and "aten.gelu" not in text


def test_compiled_mlp_default_is_unchanged(monkeypatch):
    text = _compiled_vs_eager(monkeypatch, "aten")
    assert "fuser_gemm" not in text and "GEMM template" not in text


def _grads(m, x):
    x = x.detach().requires_grad_()
    m.zero_grad()
    out = m(x)
    out.float().square().sum().backward()
    return [out, x.grad] + [p.grad for p in m.parameters()]


def test_compiled_mlp_bf16(monkeypatch):
    """bf16 weights and activations. The template keeps the fp32 tile where eager rounds
    each op to bf16, so both are compared with an fp64 run: the compiled error at most
    twice eager's (plus a bf16 ulp), output and every gradient."""
    monkeypatch.setattr(config, "gemm", "template")
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = Block().to(torch.bfloat16)
    x = torch.randn(3, 13, 29, dtype=torch.bfloat16)
    ref = _grads(_copy_to(m, torch.float64), x.double())
    eager = _grads(m, x)
    cm = torch.compile(m, backend="fuser")
    _grads(cm, x)  # the first call runs the graph, the second the call program
    got = _grads(cm, x)
    for g, e, r in zip(got, eager, ref, strict=True):
        err, eager_err = (g.double() - r).abs().max(), (e.double() - r).abs().max()
        assert err <= 2 * eager_err + 8e-3 * r.abs().max(), (err, eager_err)
    assert "template gemm_bias_gelu_tanh_aux_bf16" in str(fuser.explain(cm))


def _copy_to(m: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    c = Block().to(dtype)
    c.load_state_dict({k: v.to(dtype) for k, v in m.state_dict().items()})
    return c


def test_compiled_prologue_cast_and_scale(monkeypatch):
    """Inference: an fp16 input cast to fp32 and scaled, used by the matmul only, is read
    as fp16 and cast in the template's prologue; GELU in its epilogue."""
    monkeypatch.setattr(config, "gemm", "template")
    torch._dynamo.reset()

    def f(x16, w):
        return F.gelu((x16.float() * 0.5) @ w)

    torch.manual_seed(2)
    x16, w = torch.randn(37, 29, dtype=torch.float16), torch.randn(29, 45)
    cf = torch.compile(f, backend="fuser")
    torch.testing.assert_close(cf(x16, w), f(x16, w), atol=2e-5, rtol=1e-5)
    text = str(fuser.explain(cf))
    assert "fuses: A cast to fp32, A * scale, gelu)" in text and "fp32 (A fp16)" in text


@pytest.mark.slow
def test_gpt2_tiles_compile_for_sm90_without_spills():
    """ptxas (sm_90, no GPU) on the planned kernels of the GPT-2 shapes: no spills, and
    tl.dot compiled to Hopper's warpgroup MMA (HGMMA)."""
    plans = [plan_gemm(*GPT2[name], H100.sms) for name in GPT2]
    for plan, res in zip(plans, plan_resources(plans, 90), strict=True):
        assert res["stack"] + res["local"] == 0, f"{plan.name} {plan.tiles.line()}: {res}"
        assert res["registers"] <= 255 and res["hgmma"], res


def _traced(f, *shapes, device="cpu", dtype=torch.float32):
    """f's ATen graph with fake values on every node, as AOTAutograd hands it over."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = [torch.empty(s, device=device, dtype=dtype) for s in shapes]
        return make_fx(f)(*args)


def test_chain_stops_where_a_value_is_needed_elsewhere(monkeypatch):
    """addmm + residual where the addmm is also returned: the residual add stays outside
    (the template would have to store both); the rewritten graph runs and matches."""
    from fuser.dynamo.gemm import lower_gemm

    monkeypatch.setattr(config, "backend", "triton")

    def f(x, w, b, r):
        y = torch.addmm(b, x, w.t())
        return F.gelu(y + r), y.sum(0)

    gm = _traced(f, (37, 29), (45, 29), (45,), (37, 45))
    (note,) = lower_gemm(gm, "template")
    assert "fuses: + bias[n])" in note and "gemm_bias_fp32" in note
    assert "aten.add" in gm.code and "aten.gelu" in gm.code
    torch.manual_seed(4)
    args = (torch.randn(37, 29), torch.randn(45, 29), torch.randn(45), torch.randn(37, 45))
    for got, want in zip(gm(*args), f(*args), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_cuda_backend_routes_bias_gelu_tanh_to_cublaslt(monkeypatch):
    """The CUDA backend has no template: addmm + GELU(tanh) with no saved pre-activation
    becomes cuBLASLt's epilogue (on CUDA tensors: fake ones here); the erf form and a
    saved pre-activation stay addmm + fuser's pointwise kernel; explain says which."""
    from fuser.dynamo.gemm import lower_gemm

    monkeypatch.setattr(config, "backend", "cuda")
    shapes = ((37, 29), (45, 29), (45,))
    cases = {
        "tanh": (lambda x, w, b: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh"), True),
        "erf": (lambda x, w, b: F.gelu(torch.addmm(b, x, w.t())), False),
        "saved": (lambda x, w, b: (F.gelu(y := torch.addmm(b, x, w.t()), approximate="tanh"), y),
                  False),
    }  # fmt: skip
    for name, (f, routed) in cases.items():
        gm = _traced(f, *shapes, device="cuda", dtype=torch.bfloat16)
        (note,) = lower_gemm(gm, "template")
        assert "the CUDA backend has no GEMM template" in note, name
        assert ("_addmm_activation" in gm.code) == routed, (name, gm.code)
        assert ("cuBLASLt's bias + GELU(tanh) epilogue" in note) == routed, (name, note)


def test_only_sums_over_k_are_fused(monkeypatch):
    """sum(w, [0]) beside mm(x, w) is a sum of B over K (fused); sum(x, [0]) beside
    addmm(b, x, w) sums A over M, not K (left alone); both results match."""
    from fuser.dynamo.gemm import lower_gemm

    monkeypatch.setattr(config, "backend", "triton")

    def f(x, w, b):
        return x @ w, w.sum(0), torch.addmm(b, x, w), x.sum(0)

    gm = _traced(f, (37, 29), (29, 45), (45,))
    notes = lower_gemm(gm, "template")
    assert "fuses: column sums of B over K)" in notes[0] and "fuses: + bias[n])" in notes[1]
    assert gm.code.count("aten.sum") == 1
    torch.manual_seed(8)
    args = (torch.randn(37, 29), torch.randn(29, 45), torch.randn(45))
    for got, want in zip(gm(*args), f(*args), strict=True):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_full_bias_is_a_residual_and_casts_fold(monkeypatch):
    """addmm with a full [M, N] bias is a residual add (nothing but a cast may follow);
    a cast of the result becomes the template's output dtype."""
    from fuser.dynamo.gemm import lower_gemm

    monkeypatch.setattr(config, "backend", "triton")

    def f(x, w, r):
        return torch.addmm(r, x, w).to(torch.float16), F.gelu(x @ w).to(torch.float16)

    gm = _traced(f, (37, 29), (29, 45), (37, 45))
    notes = lower_gemm(gm, "template")
    assert "fuses: + residual[m, n])" in notes[0] and "fp32 -> fp16" in notes[0]
    assert "fuses: gelu)" in notes[1] and "fp32 -> fp16" in notes[1]
    assert "aten.addmm" not in gm.code and "_to_copy" not in gm.code
    torch.manual_seed(9)
    args = (torch.randn(37, 29), torch.randn(29, 45), torch.randn(37, 45))
    for got, want in zip(gm(*args), f(*args), strict=True):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
