"""Rotary embeddings in fuser kernels: a broadcast over part of the row dims (cos/sin
[B, T, D] read for q [B, H, T, D], ir.broadcast.row_map) and an input or output whose
row dims do not collapse (q, a transposed [B, T, H, D] projection) are read and written
in place through per-dim row strides (Arg.row_dims), not materialized or copied;
rotate_half's slices and cat are column index maps. On both backends at the fusion
level, and through torch.compile on transformers' tiny Llama (forward and backward
parity, and which ops fused)."""

from __future__ import annotations

import math

import pytest
import torch

import fuser

B, H, T, D = 2, 3, 5, 12
# where there is a GPU, tensors live there (CPU tensors run through Triton's interpreter
# only in a process without one)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _heads(fd: fuser.FusionDefinition, x):  # noqa: ANN001, ANN202
    """cos or sin [B, T, D] in fp32, broadcast over the heads to [B, H, T, D]."""
    x = fd.ops.cast(x, torch.float32)
    return fd.ops.broadcast_in_dim(x, shape=[B, H, T, D], broadcast_dims=[0, 2, 3])


def _rope_fd(dtype: torch.dtype) -> fuser.FusionDefinition:
    """q * cos + rotate_half(q) * sin, cos/sin [B, T, D] broadcast over the heads."""
    with fuser.FusionDefinition("rope") as fd:
        q = fd.define_tensor([B, H, T, D], dtype)
        cos = fd.define_tensor([B, T, D], dtype)
        sin = fd.define_tensor([B, T, D], dtype)
        qf = fd.ops.cast(q, torch.float32)

        half = D // 2
        lo, hi = fd.ops.slice(qf, 3, 0, half), fd.ops.slice(qf, 3, half, D)
        rot = fd.ops.cat([fd.ops.neg(hi), lo], 3)
        out = fd.ops.add(fd.ops.mul(qf, _heads(fd, cos)), fd.ops.mul(rot, _heads(fd, sin)))
        fd.add_output(fd.ops.cast(out, dtype))
    return fd


def _rope_ref(q, cos, sin):
    q, cos, sin = q.double(), cos.double()[:, None], sin.double()[:, None]
    rot = torch.cat([-q[..., D // 2 :], q[..., : D // 2]], -1)
    return q * cos + rot * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_reads_q_and_cos_in_place(backend, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, T, H, D, generator=g).to(DEV, dtype).transpose(1, 2)  # rows do not collapse
    cos, sin = (torch.randn(B, T, D, generator=g).to(DEV, dtype) for _ in range(2))
    fd = _rope_fd(dtype)
    (out,) = fd.execute([q, cos, sin])
    tol = {"rtol": 2**-7, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out.double(), _rope_ref(q, cos, sin), **tol)
    (k,) = fd.kernels  # one kernel: no ATen broadcast, no copy of q
    text = fd.explain()
    assert "contiguous copies" not in text and "ATen fallback" not in text, text
    assert f"rows (size, stride) ({B}, {T * D}) x ({H}, 0) x ({T}, {D})" in k.source
    assert f"({H}, {D}) x ({T}, {H * D})" in k.source  # q's own strides


def _rope_backward_fd(dtype: torch.dtype) -> fuser.FusionDefinition:
    """The rotation's backward as AOTAutograd hands it over: dq = g * cos +
    rotate_half's transpose of g * sin, the transpose as slice_backward pads of the
    product's halves (pads of a value computed from a head broadcast of sin)."""
    half = D // 2
    with fuser.FusionDefinition("rope_bw") as fd:
        g = fd.define_tensor([B, H, T, D], dtype)
        cos = fd.define_tensor([B, T, D], dtype)
        sin = fd.define_tensor([B, T, D], dtype)
        gf = fd.ops.cast(g, torch.float32)

        gs = fd.ops.mul(gf, _heads(fd, sin))
        lo, hi = fd.ops.slice(gs, 3, 0, half), fd.ops.slice(gs, 3, half, D)
        back = fd.ops.add(fd.ops.pad(hi, 3, 0, half), fd.ops.pad(fd.ops.neg(lo), 3, half, 0))
        fd.add_output(fd.ops.cast(fd.ops.add(fd.ops.mul(gf, _heads(fd, cos)), back), dtype))
    return fd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_backward_reads_sin_through_the_head_broadcast(backend, dtype):
    """The pads' column maps are pushed through the head broadcast to sin itself: no
    kernel materializes the [B, H, T, D] broadcast of sin (a full fp32 tensor written
    and read back, twice q's traffic on an H100) before the kernel that uses it."""
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(B, T, H, D, generator=g).to(DEV, dtype).transpose(1, 2)
    cos, sin = (torch.randn(B, T, D, generator=g).to(DEV, dtype) for _ in range(2))
    fd = _rope_backward_fd(dtype)
    (out,) = fd.execute([grad, cos, sin])
    gd, c, s = grad.double(), cos.double()[:, None], sin.double()[:, None]
    gs = gd * s
    want = gd * c + torch.cat([gs[..., D // 2 :], -gs[..., : D // 2]], -1)
    tol = {"rtol": 2**-7, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out.double(), want, **tol)
    plan = fd._runtime().last
    assert all(s.fused for s in plan.segments), plan.explain()
    for k in plan.kernels.values():
        made = [a for a in k.spec.outputs if a.value.id not in plan._output_ids]
        too_big = [a.value for a in made if math.prod(a.value.shape) >= B * H * T * D]
        assert not too_big, (k.name, k.spec.segment.ops_summary())


def test_partial_broadcast_of_a_computed_value_splits(backend):
    """cos computed in the fusion: the broadcast over the heads reads it from memory in a
    second kernel (a kernel reads such a broadcast from an input only)."""
    with fuser.FusionDefinition("cos_then_rope") as fd:
        q = fd.define_tensor([B, H, T, D], torch.float32)
        ang = fd.define_tensor([B, T, D], torch.float32)
        c = fd.ops.broadcast_in_dim(fd.ops.cos(ang), shape=[B, H, T, D], broadcast_dims=[0, 2, 3])
        fd.add_output(fd.ops.mul(q, c))
    g = torch.Generator().manual_seed(1)
    q, ang = torch.randn(B, H, T, D, generator=g).to(DEV), torch.randn(B, T, D, generator=g).to(DEV)
    (out,) = fd.execute([q, ang])
    torch.testing.assert_close(out, q * ang.cos()[:, None])
    assert len(fd.kernels) == 2 and "ATen fallback" not in fd.explain()


def test_row_broadcast_over_some_row_dims(backend):
    """A per-(batch, position) scale [B, T] broadcast over heads and columns: a ROW
    operand read at mapped rows."""
    with fuser.FusionDefinition("scale_heads") as fd:
        x = fd.define_tensor([B, H, T, D], torch.float32)
        s = fd.define_tensor([B, T], torch.float32)
        sb = fd.ops.broadcast_in_dim(s, shape=[B, H, T, D], broadcast_dims=[0, 2])
        fd.add_output(fd.ops.mul(x, sb))
    g = torch.Generator().manual_seed(2)
    x, s = torch.randn(B, H, T, D, generator=g).to(DEV), torch.randn(B, T, generator=g).to(DEV)
    (out,) = fd.execute([x, s])
    torch.testing.assert_close(out, x * s[:, None, :, None])
    assert len(fd.kernels) == 1 and "ATen fallback" not in fd.explain()


def test_row_norm_of_a_transposed_input_into_a_transposed_output(backend):
    """A row reduction (RMSNorm over D, as Qwen3's q_norm) of q [B, H, T, D] seen through
    a transpose, written back in the transposed layout (fd.output_strides): read and
    written in place by the persistent kernel, rows odd (D = 40)."""
    d = 40
    with fuser.FusionDefinition("q_norm") as fd:
        q = fd.define_tensor([B, H, T, d], torch.bfloat16)
        w = fd.define_tensor([d], torch.bfloat16)
        y = fd.ops.rms_norm(fd.ops.cast(q, torch.float32), fd.ops.cast(w, torch.float32))
        fd.add_output(fd.ops.cast(y, torch.bfloat16))
    fd.output_strides[0] = (T * H * d, d, H * d, 1)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, T, H, d, generator=g).to(DEV, torch.bfloat16).transpose(1, 2)
    w = torch.randn(d, generator=g).to(DEV, torch.bfloat16)
    (out,) = fd.execute([q, w])
    want = torch.nn.functional.rms_norm(q.double(), (d,), w.double(), eps=1e-6)
    assert out.stride() == q.stride()
    torch.testing.assert_close(out.double(), want, rtol=2**-7, atol=1e-2)
    assert len(fd.kernels) == 1 and "contiguous copies" not in fd.explain()


# -- torch.compile: transformers' Llama ------------------------------------------------
@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_tiny_llama_rotary_fuses_forward_and_backward(_fresh_dynamo):
    """Llama (2 layers, hidden 64, 4 heads, 2 kv heads): one training step with fuser
    matches eager; every region holding rotate_half (slice, neg, cat) runs all its ops in
    fuser kernels, the q and k rotations each one kernel that reads cos/sin through the
    head broadcast, forward and backward; the embedding backward is fuser's."""
    pytest.importorskip("transformers")
    from fuser.dynamo import FuserBackend
    from fuser.suite.models import batch, build

    eager, fused = build("llama", "tiny", DEV), build("llama", "tiny", DEV)
    kw = batch("llama", "tiny", eager, DEV, 0)
    backend = FuserBackend(strict=True)
    want = eager(**kw).loss
    got = torch.compile(fused, backend=backend)(**kw).loss
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)

    fw, bw = backend.captures[0].graphs
    for graph in (fw, bw):
        rotary = [r for r in graph.fused if "neg" in r.ops and "slice" in r.ops]
        assert len(rotary) >= 2, [r.ops for r in graph.fused]
        for r in rotary:
            plan = r.fd._runtime().last
            assert all(s.fused for s in plan.segments), (r.name, plan.explain())
            assert not r.restrided  # q/k written in transformers' layout, in place
            # the rotations (rotate_half's neg); the cos/sin kernel of the first layer has none
            turns = [k for k in plan.kernels.values() if "neg" in k.spec.segment.ops_summary()]
            assert turns and all("broadcast_in_dim" in k.spec.segment.ops_summary() for k in turns)
    assert bw.scatters and "sorted scatter-add" in bw.scatters[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_backward_reads_shifted_sin_in_its_kernels(_fresh_dynamo, backend, dtype):
    """The backward of q * cos + rotate_half(q) * sin reads sin shifted by half the head
    (rotate_half's pads) through the head broadcast: a view of the broadcast, one kernel
    for q and one for k, as in the forward. Before, the shifted sin [B, T, D] was a value
    of its own, two more kernels that wrote and read it back."""

    def rotate_half(x):  # noqa: ANN001, ANN202
        return torch.cat((-x[..., D // 2 :], x[..., : D // 2]), dim=-1)

    def f(q, k, cos, sin):  # noqa: ANN001, ANN202
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    from fuser.dynamo import FuserBackend

    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, T, H, D, generator=g).to(DEV, dtype).transpose(1, 2)
    # one key-value head: k [B, 1, T, D] reads sin [B, T, D] with no head broadcast at all
    k = torch.randn(B, T, 1, D, generator=g).to(DEV, dtype).transpose(1, 2)
    cos, sin = (torch.randn(B, T, D, generator=g).to(DEV, dtype) for _ in range(2))
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    backend = FuserBackend(strict=True)
    compiled = torch.compile(f, backend=backend)
    grads = []
    for fn in (f, compiled):
        qq, kk = q.detach().requires_grad_(), k.detach().requires_grad_()
        grads.append(torch.autograd.grad(fn(qq, kk, cos, sin), (qq, kk), (gq, gk)))
    tol = {"rtol": 2**-7, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, **tol)
    bw = backend.captures[0].graphs[1]
    kernels = [kk for r in bw.fused for kk in r.kernels]
    assert len(kernels) == 2, [kk.spec.segment.ops_summary() for kk in kernels]
    for kk in kernels:
        assert "neg" in kk.spec.segment.ops_summary()
