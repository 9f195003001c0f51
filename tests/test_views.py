"""Slice, pad and cat as index maps (issue 21): IR checks, kernels on both backends
against torch, the vector width they allow, and rotary embeddings through torch.compile."""

from __future__ import annotations

import pytest
import torch

from fuser.errors import DTypeError, ShapeError
from fuser.frontend.fusion_definition import FusionDefinition
from fuser.ir.ops import Op
from tests.test_dynamo import _fresh_dynamo, fused_ops, rand, run_both  # noqa: F401


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


# -- IR -------------------------------------------------------------------------------
def test_infer_checks_bounds():
    fd = FusionDefinition("bad")
    with fd:
        x = fd.define_tensor([3, 10], torch.float32)
        y = fd.define_tensor([3, 4], torch.float16)
        with pytest.raises(ShapeError, match=r"\[2:11:1\] is out of range for dim 1"):
            fd.ops.slice(x, 1, 2, 11)
        with pytest.raises(ShapeError, match="step >= 1"):
            fd.ops.slice(x, 1, 0, 4, 0)
        with pytest.raises(DTypeError, match="cast them to one dtype"):
            fd.ops.cat([x, y], 1)
        with pytest.raises(ShapeError, match="all dims but 1 must match"):
            fd.ops.cat([x, fd.define_tensor([2, 4], torch.float32)], 1)
        with pytest.raises(ShapeError, match="must be ints >= 0"):
            fd.ops.pad(x, 1, -1, 0)
        fd.add_output(fd.ops.slice(x, 1, 1, 10, 3))


CASES = {
    # name: (columns, builder of the fused outputs, torch reference)
    "rotary": (
        10,
        lambda o, q, c, s: o.add(
            o.mul(q, c),
            o.mul(o.cat([o.neg(o.slice(q, 2, 5, 10)), o.slice(q, 2, 0, 5)], 2), s),
        ),
        lambda q, c, s: q * c + rotate_half(q) * s,
    ),
    "odd_step_pad": (
        13,
        lambda o, q, c, s: o.mul(o.pad(o.exp(o.slice(q, 2, 1, 13, 3)), 2, 5, 4), c),
        lambda q, c, s: torch.nn.functional.pad(q[..., 1::3].exp(), (5, 4)) * c,
    ),
    "three_pieces": (
        7,
        lambda o, q, c, s: o.cat(
            [o.slice(o.mul(q, s), 2, 3, 6), o.slice(c, 2, 0, 7, 2), o.slice(q, 2, 6, 7)], 2
        ),
        lambda q, c, s: torch.cat(((q * s)[..., 3:6], c[..., ::2], q[..., 6:7]), -1),
    ),
    "slice_of_cat": (
        9,
        lambda o, q, c, s: o.slice(o.cat([q, o.neg(c)], 2), 2, 4, 15, 2),
        lambda q, c, s: torch.cat((q, -c), -1)[..., 4:15:2],
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_views_match_torch(backend: str, case: str, dtype: torch.dtype):
    cols, build, ref = CASES[case]
    shape = [3, 5, cols]
    fd = FusionDefinition(case)
    with fd:
        ins = [fd.define_tensor(shape, dtype) for _ in range(3)]
        fd.add_output(build(fd.ops, *ins))
    args = [torch.randn(shape, generator=_gen(i)).to(dtype) for i in range(3)]
    (out,) = fd.execute(args)
    want = ref(*(a.float() for a in args)).to(dtype)
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out, want, **tol, msg=lambda m: f"{case} {dtype}: {m}")
    ops = {n.op for n in fd.pipeline().final.nodes}
    assert Op.VIEW in ops and not ops & {Op.SLICE, Op.PAD, Op.CAT}, ops
    assert all(s.fused for s in fd._runtime().last.segments), "every segment is a kernel"


def test_view_of_strided_input(backend: str):
    """A transposed input ([B, T, H, D] seen as [B, H, T, D], as q in transformers)."""
    q = torch.randn(2, 7, 3, 8, generator=_gen(0)).transpose(1, 2)
    c = torch.randn(2, 3, 7, 8, generator=_gen(1))
    fd = FusionDefinition("strided")
    with fd:
        a = fd.define_tensor([2, 3, 7, 8], torch.float32)
        b = fd.define_tensor([2, 3, 7, 8], torch.float32)
        o = fd.ops
        rot = o.cat([o.neg(o.slice(a, 3, 4, 8)), o.slice(a, 3, 0, 4)], 3)
        fd.add_output(o.add(o.mul(a, b), rot))
    (out,) = fd.execute([q, c])
    torch.testing.assert_close(out, q * c + rotate_half(q))


def test_odd_offset_narrows_vector():
    """A slice at an odd column reads unaligned: no wider access than one element."""
    fd = FusionDefinition("odd")
    with fd:
        x = fd.define_tensor([8, 136], torch.float16)
        fd.add_output(fd.ops.mul(fd.ops.slice(x, 1, 1, 129), 2.0))
    x = torch.randn(8, 136).half()
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x[:, 1:129] * 2)
    s = fd.kernels[0].schedule
    assert s.vector == 1, s.reasons
    assert "column offsets of" in s.reasons[0]


def test_views_along_other_dims_stay_aten(backend: str):
    fd = FusionDefinition("dim0")
    with fd:
        x = fd.define_tensor([6, 4], torch.float32)
        fd.add_output(fd.ops.mul(fd.ops.slice(x, 0, 1, 5, 2), 3.0))
    x = torch.randn(6, 4)
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x[1:5:2] * 3)
    reasons = " ".join(s.reason for s in fd._runtime().last.segments if not s.fused)
    assert "only the last dim is an index map" in reasons


# -- torch.compile ----------------------------------------------------------------------
def _rope(q, k, inv_freq, pos):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb, q/k [B, H, T, D]."""
    freqs = (inv_freq[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def test_rotary_fused_forward_and_backward(backend: str):
    b, t, d = 2, 5, 12
    q, k = rand(b, 3, t, d, seed=1), rand(b, 1, t, d, seed=2)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    pos = torch.arange(t)[None].expand(b, t)
    fb, _ = run_both(_rope, [q, k, inv_freq, pos])
    ops = fused_ops(fb)
    assert {"slice", "cat", "neg", "slice_backward"} <= ops, ops


def test_fused_rms_norm_lowered():
    """aten._fused_rms_norm and its backward (F.rms_norm's ops) as fuser IR, against
    ATen's forward and autograd of the formula (the backward has no CPU kernel)."""
    from torch import fx

    from fuser.dynamo.context import LOWERINGS, LowerCtx
    from fuser.dynamo.support import try_lower

    aten = torch.ops.aten
    shapes = [(3, 5, 8), (8,), (3, 5, 8)]
    x, w, g = (torch.randn(s, generator=_gen(i)) for i, s in enumerate(shapes))
    graph = fx.Graph()
    xn, wn, gn = (graph.placeholder(name) for name in "xwg")
    for node, val in zip((xn, wn, gn), (x, w, g)):
        node.meta["val"] = val
    fw = graph.call_function(aten._fused_rms_norm.default, (xn, [8], wn, 1e-5))
    rstd_meta = torch.empty(3, 5, 1)
    fw.meta["val"] = (x, rstd_meta)
    rn = graph.call_function(lambda t, i: t[i], (fw, 1))  # stands for getitem
    rn.meta["val"] = rstd_meta
    bw = graph.call_function(
        aten._fused_rms_norm_backward.default, (gn, xn, [8], rn, wn, [True, True])
    )
    bw.meta["val"] = (x, w)
    fd = FusionDefinition("rms")
    ctx = LowerCtx(fd)
    with fd:
        for n in (xn, wn, gn):
            ctx.define_input(n)
        assert try_lower(fw) is None and try_lower(bw) is None
        y, rstd = LOWERINGS[fw.target](ctx, fw)
        ctx.values[rn] = rstd
        dx, dw = LOWERINGS[bw.target](ctx, bw)
        for t in (y, rstd, dx, dw):
            fd.add_output(t)
    y, rstd, dx, dw = fd.execute([x, w, g])
    ey, erstd = torch.ops.aten._fused_rms_norm(x, [8], w, 1e-5)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-5) * wr
    ref.backward(g)
    for got, want in ((y, ey), (rstd, erstd), (dx, xr.grad), (dw, wr.grad)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_transposed_view_made_contiguous_is_a_fused_copy(backend: str):
    """`.contiguous()` of a permuted view (attention's head split and merge) is a copy into
    another layout: a kernel reading through the strides, not the region 'computing
    nothing' that left it to ATen's strided copy (about a quarter of copy bandwidth)."""

    def f(x):
        return (x.permute(0, 2, 1, 3).contiguous(),)

    x = rand(2, 257, 32, 65, grad=False)  # >= 2**20 elements: a copy worth a kernel
    fb, ((eager, _), (fused, _)) = run_both(f, [x])
    assert fused[0].is_contiguous() and torch.equal(fused[0], eager[0])
    assert "clone" in fused_ops(fb)


@pytest.mark.parametrize(
    "src, out, bdims",
    [
        ([5, 8], [3, 5, 8], [1, 2]),  # over a leading dim (cos/sin over heads)
        ([8], [3, 5, 8], [2]),  # a column
        ([3, 1, 8], [3, 5, 8], [0, 1, 2]),  # a size-1 dim expanded in place
        ([5, 1], [3, 5, 1], [1, 2]),  # a last dim of size 1, not broadcast
        ([5, 8], [5, 8, 4], [0, 1]),  # a new last dim: a row value
    ],
)
def test_column_maps_through_broadcasts(src: list[int], out: list[int], bdims: list[int]) -> None:
    """cat along the last dim of a broadcast (of a computed value) and of an input, each
    pattern of broadcast_dims views.broadcast tells apart, against torch."""
    with FusionDefinition("bcast_cat") as fd:
        a = fd.define_tensor(src, torch.float32)
        q = fd.define_tensor(out, torch.float32)
        b = fd.ops.broadcast_in_dim(fd.ops.mul(a, a), shape=out, broadcast_dims=bdims)
        last = len(out) - 1
        fd.add_output(fd.ops.add(fd.ops.cat([b, q], last), fd.ops.cat([q, b], last)))
    g = _gen(7)
    x, y = torch.randn(*src, generator=g), torch.randn(*out, generator=g)
    shape = [1] * len(out)
    for i, d in enumerate(bdims):
        shape[d] = src[i]
    bx = (x * x).reshape(shape).expand(out)
    (got,) = fd.execute([x, y])
    torch.testing.assert_close(got, torch.cat([bx, y], -1) + torch.cat([y, bx], -1))
