"""The attention template (issue 23) against PyTorch's math attention in fp32, through
Triton's interpreter at tiny shapes: forward and the gradients of q, k, v; causal and not,
grouped-query, odd sequence lengths and head dims, non-contiguous q/k/v; then
torch.compile(backend="fuser") with FUSER_ATTENTION=template end to end, the choice in
explain, and the visible SDPA fallbacks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.codegen.triton.attention import render_attention
from fuser.config import config, use_interpreter
from fuser.runtime.attention import attention_backward, attention_forward
from fuser.runtime.attention_tune import decide
from fuser.schedulers.attention import AttentionShape, Tiles, choose, plan_attention

# these run the template on CPU tensors, in Triton's interpreter: a process that has a GPU
# runs Triton on it instead (TRITON_INTERPRET=1 makes them run there too)
interpreted = pytest.mark.skipif(
    not use_interpreter(), reason="CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)"
)


def math_attention(q, k, v, causal, scale=None):
    """fp64 reference: explicit softmax(q kᵀ) v with k, v repeated for grouped heads."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def _heads(b, t, h, d, packed=False):
    """[B, H, T, d] as models make them: a view of a [B, T, H, d] projection (strided);
    `packed` takes it out of a wider [B, T, 2H, d] buffer (k and v side by side)."""
    if packed:
        return torch.randn(b, t, 2 * h, d)[:, :, :h].transpose(1, 2)
    return torch.randn(b, t, h, d).transpose(1, 2)


# (B, Hq, Hkv, Tq, Tk, d, causal): T of 1, 7, 33; d 16/32/64 and 24 (head-dim mask);
# grouped heads; Tq != Tk (causal is top-left aligned, as ATen's is_causal)
CASES = [
    (1, 2, 2, 7, 7, 16, True),
    (1, 1, 1, 1, 1, 16, False),
    (1, 2, 1, 33, 33, 32, False),
    (1, 4, 2, 33, 20, 64, True),
    (2, 2, 2, 20, 33, 24, True),
]


@interpreted
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_H{}/{}_T{}x{}_d{}_{}".format(*c))
def test_forward_and_gradients_match_math(case):
    torch.manual_seed(sum(case))
    b, hq, hkv, tq, tk, d, causal = case
    q = _heads(b, tq, hq, d)
    k, v = _heads(b, tk, hkv, d, packed=True), _heads(b, tk, hkv, d, packed=True)
    if tq > 1 and tk > 1:  # (size-1 dims make any strides contiguous)
        assert not q.is_contiguous() and not k.is_contiguous()
    out, lse = attention_forward(q, k, v, causal)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref = math_attention(q64, k64, v64, causal)
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=1e-5)
    assert lse.shape == (b, hq, tq) and lse.dtype == torch.float32
    do = torch.randn_like(out)
    ref.backward(do.double())
    dq, dk, dv = attention_backward(do, q, k, v, out, lse, causal)
    assert dk.shape == k.shape and dv.shape == v.shape  # per key/value head under GQA
    for got, want in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        torch.testing.assert_close(got, want.float(), atol=5e-5, rtol=1e-4)


@interpreted
def test_scale_and_lse_are_atens():
    """An explicit scale, and the LSE in ATen's convention (natural log, per query row)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 16) for _ in range(3))
    out, lse = attention_forward(q, k, v, False, scale=0.3)
    torch.testing.assert_close(out, math_attention(q, k, v, False, 0.3), atol=2e-5, rtol=1e-5)
    want = torch.logsumexp(q @ k.transpose(-1, -2) * 0.3, -1)
    torch.testing.assert_close(lse, want, atol=2e-5, rtol=1e-5)


def test_plan_tiles_for_the_h100_targets():
    gpt2 = plan_attention(AttentionShape(16, 12, 12, 1024, 1024, 64, "bf16", True, "cuda"))
    # the tiles the per-kernel sweep measured fastest (benchmarks/attention_tiles.py)
    assert gpt2.forward == Tiles(64, 64, 4, 3)
    assert (gpt2.dkdv, gpt2.dq) == (Tiles(32, 64, 4, 4), Tiles(64, 64, 4, 3))
    assert gpt2.even_m and gpt2.even_n and gpt2.block_d == 64
    long = plan_attention(AttentionShape(4, 32, 32, 4096, 4096, 128, "bf16", True, "cuda"))
    assert long.forward == Tiles(64, 64, 4, 3)
    assert (long.dkdv, long.dq) == (Tiles(32, 64, 4, 4), Tiles(128, 64, 8, 3))
    assert any("fastest measured" in r for r in long.reasons)
    short = plan_attention(AttentionShape(2, 4, 4, 20, 20, 64, "bf16", True, "cuda"))
    assert short.forward.block_m == short.forward.block_n == 32  # no tile past the sequence
    odd = plan_attention(AttentionShape(1, 8, 2, 1000, 1000, 96, "fp16", False, "cuda"))
    assert not odd.even_m and odd.block_d == 128
    src = render_attention(odd)
    assert src.startswith('"""fuser attention template') and "why:" in src
    assert "offs_d[None, :] < HEAD_D" in src and "offs_m[:, None] < t_q" in src
    assert "offs_d[None, :] < HEAD_D" not in render_attention(gpt2)  # exact: no masks


def test_choice_default_forced_measured_and_unsupported():
    q, k = torch.empty(2, 4, 64, 64), torch.empty(2, 4, 64, 64)
    assert "FUSER_ATTENTION=sdpa (the default)" in decide(q, k, k, True, mode="sdpa").line()
    assert decide(q, k, k, True, mode="template").template
    shape = AttentionShape.of(q, k, True)
    fast = choose(shape, None, "auto", {"template_ms": 1.0, "sdpa_ms": 1.2, "device": "H100"})
    slow = choose(shape, None, "auto", {"template_ms": 1.3, "sdpa_ms": 1.2, "device": "H100"})
    assert fast.template and "faster" in fast.line() and not slow.template
    big = torch.empty(1, 2, 8, 256)
    assert "head dim 256" in decide(big, big, big, False, mode="template").line()
    assert "dropout" in decide(q, k, k, False, 0.1, mode="template").line()
    assert "attn_mask" in decide(q, k, k, False, 0.0, torch.ones(1), mode="template").line()
    for bad in (0.0, -0.125, float("inf"), float("nan")):  # the forward's max needs > 0
        assert "positive, finite scale" in decide(q, k, k, True, mode="template", scale=bad).line()
    assert decide(q, k, k, True, mode="template", scale=0.3).template
    odd_heads = torch.empty(2, 3, 64, 64)
    assert "not a multiple" in decide(q, odd_heads, odd_heads, True, mode="template").line()


class Block(torch.nn.Module):
    """A tiny attention block: q and packed kv projections, grouped heads, causal."""

    def __init__(self, dim=32, heads=2, kv_heads=1):
        super().__init__()
        self.h, self.hkv, self.hd = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q = self.q(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.hkv, self.hd).unbind(2)
        y = F.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=mask is None,
            enable_gqa=self.h != self.hkv,
        )  # fmt: skip
        return self.o(y.transpose(1, 2).reshape(b, t, c))


def _compiled_vs_eager(monkeypatch, mode, mask=None):
    monkeypatch.setattr(config, "attention", mode)
    torch._dynamo.reset()  # the choice is made when a graph is compiled: compile anew
    torch.manual_seed(0)
    m = Block()
    x = torch.randn(2, 7, 32, requires_grad=True)
    m(x, mask).square().sum().backward()
    want = [x.grad] + [p.grad for p in m.parameters()]
    x.grad = None
    m.zero_grad()
    cm = torch.compile(m, backend="fuser")
    out = cm(x, mask)
    out.square().sum().backward()
    torch.testing.assert_close(out, m(x, mask), atol=1e-5, rtol=1e-5)
    for got, w in zip([x.grad] + [p.grad for p in m.parameters()], want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-4, rtol=1e-4)
    return str(fuser.explain(cm))


@interpreted
def test_compiled_block_with_template_matches_eager(monkeypatch):
    text = _compiled_vs_eager(monkeypatch, "template")
    assert "attention forward" in text and "attention backward" in text
    assert "template attn_d16_fp32_causal_g2" in text and "FUSER_ATTENTION=template" in text
    assert "fuser_attention_forward" in text and "fuser_attention_backward" in text


@interpreted
def test_compiled_block_default_keeps_sdpa(monkeypatch):
    text = _compiled_vs_eager(monkeypatch, "sdpa")
    assert "SDPA: FUSER_ATTENTION=sdpa (the default)" in text
    assert "fuser_attention_forward" not in text


@interpreted
def test_mask_falls_back_visibly(monkeypatch):
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    text = _compiled_vs_eager(monkeypatch, "template", mask)
    assert "the template does not take this attention: an attn_mask" in text
    assert "fuser_attention_forward" not in text


def _sm90_resources(plan, kernel: str, tiles) -> dict:
    """ptxas's registers and spills of one template kernel compiled for sm_90 (no GPU),
    with the specializations Triton's launcher makes: unit head-dim strides, 16-aligned
    pointers and strides."""
    import importlib.util
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fuser.runtime.resources import cubin_resources

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "attn.py"
        path.write_text(render_attention(plan))
        spec = importlib.util.spec_from_file_location("_attn_sm90", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = getattr(mod, kernel)
        s = plan.shape
        values = {"BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n, "BLOCK_D": plan.block_d}
        values |= {"HEAD_D": s.head_dim, "GROUP": s.group}
        sig, consts = {}, {}
        for a in fn.arg_names:
            if a in values:
                sig[a], consts[a] = "constexpr", values[a]
            elif a in ("LSE", "DELTA"):
                sig[a] = "*fp32"
            elif a.isupper():
                sig[a] = f"*{s.dtype}"
            elif a == "sm_scale":
                sig[a] = "fp32"
            elif a.startswith("s") and (a.endswith("d") or a == "slm"):
                sig[a], consts[a] = "constexpr", 1  # Triton specializes strides of 1
            else:
                sig[a] = "i32"
        aligned = [i for i, a in enumerate(fn.arg_names) if sig[a] == "i32" or "*" in sig[a]]
        attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
        opts = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
        compiled = triton.compile(
            ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=opts
        )
        res = cubin_resources(compiled.asm["cubin"])
        return res.get(kernel) or next(iter(res.values()))


@pytest.mark.slow
@pytest.mark.parametrize("dims", [(16, 12, 1024, 64), (4, 32, 4096, 128)], ids=["gpt2", "long"])
def test_h100_tiles_compile_for_sm90_without_spills(dims):
    b, h, t, d = dims
    plan = plan_attention(AttentionShape(b, h, h, t, t, d, "bf16", True, "cuda"))
    for kernel, tiles in (("attn_fwd", plan.forward), ("attn_bwd_dkdv", plan.dkdv)):
        res = _sm90_resources(plan, kernel, tiles)
        assert res["stack"] + res["local"] == 0, f"{kernel} {tiles.line()} spills: {res}"
        assert res["registers"] <= 255


@interpreted
@pytest.mark.parametrize("lse_layout", ["efficient", "cudnn"])
def test_template_node_makes_atens_output_layouts(lse_layout):
    """What the lowering puts in place of a GPU kernel, on CPU: out with the kernel's
    strides ([B, T, H, d] memory), the LSE padded (efficient) or with a trailing 1 (cuDNN),
    the RNG placeholders; and the backward reads that LSE through its strides."""
    from fuser.dynamo.attention import Out, TemplateBackward, TemplateForward

    torch.manual_seed(3)
    q, k, v = (_heads(1, 9, 2, 16) for _ in range(3))
    lse_out = {
        "efficient": Out((1, 2, 32), (64, 32, 1), torch.float32),
        "cudnn": Out((1, 2, 9, 1), (18, 9, 1, 1), torch.float32),
    }[lse_layout]
    outs = (Out((1, 2, 9, 16), (288, 16, 32, 1), torch.float32), lse_out, Out((), (), torch.int64))
    out, lse, seed = TemplateForward(True, None, outs, "")(q, k, v)
    assert out.stride() == (288, 16, 32, 1) and lse.shape == lse_out.shape and seed.dim() == 0
    torch.testing.assert_close(out, math_attention(q, k, v, True), atol=2e-5, rtol=1e-5)
    grads = (Out(tuple(x.shape), tuple(x.stride()), x.dtype) for x in (q, k, v))
    do = torch.randn_like(out)
    dq, dk, dv = TemplateBackward(True, None, tuple(grads), "")(do, q, k, v, out, lse)
    want = attention_backward(do, q, k, v, out, lse[:, :, :9].reshape(1, 2, 9), True)
    for got, w in zip((dq, dk, dv), want, strict=True):
        torch.testing.assert_close(got, w)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the direct launches are GPU-only")
def test_direct_launches_match_the_jit_and_respecialize_on_alignment():
    """The second launch of a layout skips Triton's JIT (runtime/attention._direct); a
    misaligned view is another specialization, launched through the JIT again."""
    import fuser.runtime.attention as ra

    g = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn(4 * 2 * 70 * 64 + 8, device="cuda", generator=g, dtype=torch.bfloat16)

    def qkv(offset: int) -> list[torch.Tensor]:
        n = 2 * 70 * 64
        return [base[offset + i * n : offset + (i + 1) * n].view(1, 70, 2, 64).transpose(1, 2)
                for i in range(3)]  # fmt: skip

    ra._direct.clear()
    for offset in (0, 0, 1, 1, 0):  # aligned twice, misaligned twice, aligned again
        q, k, v = qkv(offset)
        out, lse = attention_forward(q, k, v, True)
        do = torch.randn_like(q)
        dq, dk, dv = attention_backward(do, q, k, v, out, lse, True)
        ref = [x.float().detach().requires_grad_() for x in (q, k, v)]
        want = math_attention(*ref, True)
        want.backward(do.float())
        assert (out.float() - want).abs().max() < 2e-2, offset
        for got, r in zip((dq, dk, dv), ref, strict=True):
            assert (got.float() - r.grad).abs().max() < 5e-2, offset
    # one direct launch per kernel and alignment: the misaligned views got their own
    fwd = [key for key in ra._direct if key[1] == "attn_fwd"]
    assert sorted(key[4][1] for key in fwd) == [False, True]  # q's (dtype, alignment)
    # fwd, dK/dV and dQ twice; delta once (it reads out and dO, fresh and aligned both times)
    assert len(ra._direct) == 7


def test_launch_key_holds_every_tensors_dtype_and_alignment():
    """The direct launches' key (runtime/attention.launch_key) is as fine as Triton's
    specialization: the same for another call of the same layout (new pointers, another
    float scale), another for an int argument's value, a misaligned pointer, or a tensor
    argument of another dtype. The plan holds q's dtype only: an fp32 grad_out after a
    bf16 one (attention_backward takes what it is given) reused the bf16 binary."""
    from fuser.runtime.attention import launch_key

    plan = plan_attention(AttentionShape(1, 2, 2, 9, 9, 16, "bf16", True, "cpu"))

    def key(grad_out=torch.bfloat16, offset=0, scale=0.25, t=9, head_d=16):
        q = torch.empty(2 * 9 * 16 + 8, dtype=torch.bfloat16)[offset:][: 2 * 9 * 16]
        do = torch.empty(2, 9, 16, dtype=grad_out)
        args = (q, do, scale, t, *do.stride())
        return launch_key(plan, "attn_bwd_dq", (1, 2), args, {"BLOCK_M": 16, "HEAD_D": head_d})

    assert key()[4] == (torch.bfloat16, True)  # the first argument's, as the GPU test reads
    assert key() == key(scale=0.5)  # fresh tensors, another float: one binary
    assert key() != key(t=16)  # 16 is divisible by 16: another specialization
    assert key() != key(offset=1)  # 2 bytes off: not 16-byte aligned
    assert key() != key(grad_out=torch.float32)  # *fp32 in the signature, not *bf16
    assert key() != key(head_d=12)  # a constexpr: another binary


@interpreted
def test_auto_measurement_runs_under_no_grad(monkeypatch):
    """FUSER_ATTENTION=auto times the template and SDPA while AOTAutograd compiles, with
    grad mode off. SDPA's backward then raised "does not require grad" and the whole
    graph fell back to ATen ops (a GPT-2 step at 108 ms): the timing turns grad on."""
    import fuser.runtime.attention_tune as tune

    calls = []

    def once(fn, reps):
        fn()
        calls.append(reps)
        return 1.0

    monkeypatch.setattr(tune, "median_ms", once)
    shape = AttentionShape(1, 2, 1, 9, 9, 16, "fp32", True, "cpu")  # GQA, odd T
    with torch.no_grad():
        got = tune._time(shape)
        assert not torch.is_grad_enabled()  # as it was: only the timing turned it on
    assert got == {"template_ms": 1.0, "sdpa_ms": 1.0} and len(calls) == 2
