"""Dropout with its saved mask in the GEMM template's epilogue. fuser's graphs carry
dropout as ATen's native_dropout in the forward (a random op: it stays ATen, and saves a
bool mask) and, in the backward, as native_dropout_backward's decomposition
`grad * (mask.to(grad.dtype) * scale)`; where that grad is a matmul's result (dX of a
linear layer that follows a dropout), the template multiplies its tile by the saved mask
and the scale, before a GELU backward and a residual. Against PyTorch through Triton's
interpreter at odd shapes, split-K included; the matcher on a traced graph; a compiled
dropout -> linear model forward and backward against eager with the same masks; the
kernel compiled for sm_90."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.config import config
from fuser.dynamo.gemm import lower_gemm
from fuser.errors import FuserError
from fuser.runtime.gemm import aten_gemm, gemm, plan_for, shape_of
from fuser.runtime.gemm_resources import plan_resources
from fuser.schedulers.gemm import Epilogue, GemmShape, GemmTiles, plan_gemm, retile

aten = torch.ops.aten
EPILOGUES = {
    "mask": Epilogue(mask=True),
    "mask_dgelu_tanh": Epilogue(mask=True, gelu_grad="gelu_tanh"),
    "bias_gelu_mask_res": Epilogue(
        bias=True, activation="gelu", aux=True, mask=True, residual=True
    ),
}


def _case(e: Epilogue, m: int, n: int, k: int, dtype: torch.dtype) -> tuple:
    a = torch.randn(k, m).t().to(dtype)
    b = (torch.randn(k, n) / k**0.5).to(dtype)
    kw = {"mask": (torch.rand(m, 2 * n) > 0.3)[:, ::2], "mask_scale": 1 / 0.7}  # strided
    if e.bias:
        kw["bias"] = torch.randn(n).to(dtype)
    if e.residual:
        kw["residual"] = torch.randn(m, n).to(dtype)
    if e.gelu_grad != "none":
        kw["pre"] = torch.randn(m, n).to(dtype)
    return a, b, kw


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_mask_epilogue_matches_aten(name, dtype, split):
    torch.manual_seed(len(name) + split)
    e = EPILOGUES[name]
    a, b, kw = _case(e, 37, 45, 83, dtype)
    plan = None
    if split > 1:
        base = plan_for(shape_of(a, b, e, None, kw["mask"]), e)
        plan = retile(base, GemmTiles(16, 16, 16, 4, 4, 1, split), "split-K")
    got = gemm(a, b, e, plan=plan, **kw)
    want = aten_gemm(a.double(), b.double(), e, **_double(kw))
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g.double(), w, atol=tol, rtol=tol)


def _double(kw: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in kw.items()}  # fmt: skip


def test_mask_needs_its_scale_and_shape():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with pytest.raises(FuserError, match="no mask_scale"):
        gemm(a, b, Epilogue(mask=True), mask=torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(FuserError, match=r"the mask \[5, 4\] is not \[5, 3\]"):
        gemm(a, b, Epilogue(mask=True), mask=torch.ones(5, 4, dtype=torch.bool), mask_scale=2.0)


def _traced(f, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(f, tracing_mode="fake")(*args)


def test_matcher_takes_dropout_backward(monkeypatch):
    """dX = dY @ W, then dropout's backward as AOTAutograd decomposes it (a cast of the
    bool mask, times 1/(1-p), a contiguous clone), then the GELU backward: one template
    reading the bool mask; the cast and scale nodes are gone."""
    monkeypatch.setattr(config, "backend", "triton")

    def f(dy, w, mask, pre):
        d = (dy @ w).view(3, 13, 45)
        g = d * (mask.to(torch.float32) * (1 / 0.8))
        g = g.clone(memory_format=torch.contiguous_format)
        return aten.gelu_backward(g, pre, approximate="tanh")

    torch.manual_seed(3)
    args = (torch.randn(39, 29), torch.randn(29, 45), torch.rand(3, 13, 45) > 0.2,
            torch.randn(3, 13, 45))  # fmt: skip
    gm = _traced(f, *args)
    (note,) = lower_gemm(gm, "template")
    assert "fuses: * mask[m, n] * mask_scale (dropout), * gelu(tanh)'(pre))" in note, note
    assert "gemm_mask_dgelu_tanh_fp32" in note
    assert "_to_copy" not in gm.code and "aten.mul" not in gm.code and "clone" not in gm.code
    torch.testing.assert_close(gm(*args), f(*args), atol=2e-5, rtol=1e-5)


def test_a_returned_copy_stays_a_copy(monkeypatch):
    """The chain looks through a clone as through a view, except one the graph returns:
    two outputs must not become one tensor."""
    monkeypatch.setattr(config, "backend", "triton")

    def f(x, w):
        y = F.gelu(x @ w)
        return y, y.clone()

    args = (torch.randn(37, 29), torch.randn(29, 45))
    gm = _traced(f, *args)
    (note,) = lower_gemm(gm, "template")
    assert "template gemm_gelu_fp32" in note and "clone" in gm.code
    got = gm(*args)
    assert got[0].untyped_storage().data_ptr() != got[1].untyped_storage().data_ptr()
    for g, w in zip(got, f(*args), strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


class DropLinear(torch.nn.Module):
    """GELU -> dropout -> linear: the linear's dX in the backward is followed by dropout's
    backward and the GELU backward."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(29, 45)
        self.proj = torch.nn.Linear(45, 23)

    def forward(self, x):
        h = F.dropout(F.gelu(self.fc(x), approximate="tanh"), p=0.25, training=True)
        return self.proj(h)


def test_compiled_dropout_linear_matches_eager(monkeypatch):
    """Forward and backward with FUSER_GEMM=template against eager with the same seed:
    native_dropout stays ATen in both, so both draw the same masks; the backward's dX of
    proj fuses the saved mask and the GELU backward."""
    monkeypatch.setattr(config, "gemm", "template")
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = DropLinear()
    x = torch.randn(3, 13, 29, requires_grad=True)

    def step(model):
        x.grad = None
        m.zero_grad()
        torch.manual_seed(1)
        out = model(x)
        out.square().sum().backward()
        return [out, x.grad] + [p.grad.clone() for p in m.parameters()]

    want = step(m)
    cm = torch.compile(m, backend="fuser")
    for _ in range(2):  # the graphs, then the call programs
        for g, w in zip(step(cm), want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    text = str(fuser.explain(cm))
    assert "template gemm_mask_dgelu_tanh_fp32" in text, text
    torch._dynamo.reset()


@pytest.mark.slow
def test_mask_kernel_compiles_for_sm90_without_spills():
    """ptxas (sm_90, no GPU): dX of GPT-2's MLP with the saved mask and the GELU
    backward, and the same split 4 ways, read their bool mask without spills."""
    shape = GemmShape(16384, 3072, 768, "bf16", "bf16", "bf16", "cuda")
    plan = plan_gemm(shape, Epilogue(mask=True, gelu_grad="gelu_tanh"))
    split = retile(plan, GemmTiles(128, 128, 64, 8, 8, 4, 4), "split")
    for p, res in zip((plan, split), plan_resources([plan, split], 90), strict=True):
        assert res["stack"] + res["local"] == 0 and res["hgmma"], (p.name, res)
        assert res.get("finalize_stack", 0) + res.get("finalize_local", 0) == 0, res
