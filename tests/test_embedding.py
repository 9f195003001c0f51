"""gather_rows (embedding, index_select along dim 0): an indexed row read fused into
pointwise and row-reduction kernels, on both backends (Triton's interpreter, the CUDA
emulator), with a checked index, and lowered from torch.compile (fuser/dynamo/indexing.py)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.errors import OutOfBoundsError
from fuser.runtime import cuda_backend

BF16 = torch.bfloat16


@pytest.fixture(params=["triton", "cuda"])
def backend(request, monkeypatch):
    if request.param == "cuda":
        if shutil.which("g++") is None:
            pytest.skip("the CUDA emulator needs g++")
        monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", True)
    return request.param


def _emb_ln(v: int, h: int, index_shape: list[int], dtype: torch.dtype, idtype: torch.dtype):
    """tok = table[index]; out = tok + pos; (out, layer_norm(out))."""
    with fuser.FusionDefinition() as fd:
        table = fd.define_tensor([v, h], dtype)
        index = fd.define_tensor(index_shape, idtype)
        pos = fd.define_tensor([*index_shape, h], dtype)
        s = fd.ops.add(fd.ops.embedding(table, index), pos)
        fd.add_output(s)
        fd.add_output(fd.ops.layer_norm(s))
    return fd


def _reference(table, index, pos):
    s = (table.float()[index] + pos.float()).to(table.dtype)
    return s, F.layer_norm(s.float(), (table.shape[1],)).to(table.dtype)


@pytest.mark.parametrize(
    "v, h, index_shape, dtype, idtype, strided",
    [
        (11, 7, [5], torch.float32, torch.int64, False),  # odd H: no vector divides it
        (50, 40, [3, 6], BF16, torch.int32, False),  # a [B, T] index, bf16 table
        (9, 12, [2, 5], torch.float32, torch.int32, True),  # table: a view, row stride 20
        (17, 64, [33], BF16, torch.int64, True),
    ],
)
def test_gather_fused_matches_torch(backend, v, h, index_shape, dtype, idtype, strided):
    g = torch.Generator().manual_seed(v * h)
    base = torch.randn(v, h + 8 if strided else h, generator=g).to(dtype)
    table = base[:, 3 : 3 + h] if strided else base
    index = torch.randint(0, v, index_shape, generator=g).to(idtype)
    index.view(-1)[: min(3, index.numel())] = v - 1  # repeated rows, the last row
    pos = torch.randn(*index_shape, h, generator=g).to(dtype)
    fd = _emb_ln(v, h, index_shape, dtype, idtype)
    got = fd.execute([table, index, pos], backend=backend)
    want = _reference(table, index, pos)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == BF16 else dict(atol=1e-5, rtol=1e-5)
    for gt, w in zip(got, want):
        torch.testing.assert_close(gt, w, **tol)
    ks = fd.kernels
    assert len(ks) == 1, fd.explain()  # the gather, the add and the LayerNorm: one kernel
    assert "gather_rows" in ks[0].source and "sum" in str(fd.explain())


def test_gathered_table_is_read_in_16_byte_packs_when_aligned():
    fd = _emb_ln(64, 256, [8], torch.float32, torch.int64)
    args = [torch.randn(64, 256), torch.randint(0, 64, (8,)), torch.randn(8, 256)]
    (k,) = fd.compile(args, "h100", "cuda")
    assert "load_pack<4>(t0_v" in k.source, k.source
    assert "< 64ull" in k.source  # the load is masked by the index's range


@pytest.mark.parametrize("idtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("v, bits", [(64, 32), (2**21 + 1, 64)])
def test_gathered_row_offset_bits_are_the_plans(v, bits, idtype):
    """plan.gather_bits decides once whether a gathered row's offset (index * row stride)
    needs 64 bits: a table of 2**31 elements or more, however few rows the kernel has
    (its index_bits stays 32); both renderers print it (meta tensors: nothing allocated)."""
    h = 1024
    fd = _emb_ln(v, h, [8], torch.float32, idtype)
    args = [torch.empty(v, h, device="meta"), torch.empty(8, dtype=idtype, device="meta")]
    args.append(torch.empty(8, h, device="meta"))
    for backend in ("triton", "cuda"):
        (k,) = fd.compile(args, "h100", backend)
        assert k.plan.gather_bits == (("t0", bits),) and k.plan.index_bits == 32
        src = k.source
        if backend == "triton":
            assert ("t0_at = t0_at.to(tl.int64)" in src) == (bits == 64 and idtype == torch.int32)
        else:
            at = {64: "(long long)t1_ptr[", 32: "(int)t1_ptr[" if idtype == torch.int64 else ""}
            assert at[bits] in src, src
            assert ("(long long)t1_ptr[" in src) == (bits == 64), src
    assert ("64-bit gathered row offsets: t0" in k.plan.text()) == (bits == 64)


@pytest.mark.parametrize("bad", [64, -1])
def test_index_out_of_range_raises(backend, bad):
    fd = _emb_ln(64, 8, [2, 3], torch.float32, torch.int64)
    index = torch.randint(0, 64, (2, 3))
    index[1, 2] = bad
    with pytest.raises(OutOfBoundsError, match=f"Index {bad} is out of bounds"):
        fd.execute([torch.randn(64, 8), index, torch.randn(2, 3, 8)], backend=backend)


def test_empty_index():
    fd = _emb_ln(10, 8, [0], torch.float32, torch.int64)
    s, y = fd.execute([torch.randn(10, 8), torch.zeros(0, dtype=torch.int64), torch.randn(0, 8)])
    assert s.shape == (0, 8) and y.shape == (0, 8)


def test_index_select_and_gather_rows_alone():
    with fuser.FusionDefinition() as fd:
        table = fd.define_tensor([13, 5], torch.float32)
        index = fd.define_tensor([4], torch.int32)
        fd.add_output(fd.ops.exp(fd.ops.index_select(table, 0, index)))
    t, i = torch.randn(13, 5), torch.tensor([12, 0, 0, 7], dtype=torch.int32)
    (got,) = fd.execute([t, i])
    torch.testing.assert_close(got, torch.index_select(t, 0, i).exp())


# -- torch.compile ------------------------------------------------------------------------
@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_embedding_and_index_select(_fresh_dynamo):
    from fuser.dynamo import FuserBackend

    def f(w, idx, sel):
        a = F.embedding(idx, w) * 2.0
        b = torch.index_select(w, 0, sel)
        return F.layer_norm(a + 1.0, (w.shape[1],)), b.sigmoid()

    w = torch.randn(20, 24)
    idx, sel = torch.randint(0, 20, (3, 4)), torch.tensor([19, 2, 2])
    backend = FuserBackend(strict=True, check=True)
    got = torch.compile(f, backend=backend)(w, idx, sel)
    for g, want in zip(got, f(w, idx, sel)):
        torch.testing.assert_close(g, want)
    ops = " ".join(r.ops for g in backend.captures[0].graphs for r in g.fused)
    assert "embedding" in ops and "index_select" in ops, ops


def test_compiled_bad_index_raises(_fresh_dynamo):
    from fuser.dynamo import FuserBackend

    f = torch.compile(lambda w, i: F.embedding(i, w).relu(), backend=FuserBackend(strict=True))
    with pytest.raises(Exception, match="out of bounds"):
        f(torch.randn(8, 4), torch.tensor([1, 8]))


def test_gpt2_embeddings_fuse_into_the_first_layernorm(_fresh_dynamo):
    """GPT-2 tiny forward + backward under torch.compile matches eager; the token and the
    position embedding are read inside the first LayerNorm's kernel."""
    from fuser.dynamo import FuserBackend
    from fuser.examples.gpt2 import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, block_size=16)
    eager, fused = GPT(cfg), GPT(cfg)
    fused.load_state_dict(eager.state_dict())
    backend = FuserBackend(strict=True, check=True)
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    _, want = eager(x, y)
    _, got = torch.compile(fused, backend=backend)(x, y)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    forward = backend.captures[0].graphs[0]
    first = next(r for r in forward.fused if "native_layer_norm" in r.ops)
    assert first.ops.startswith("embedding x2"), first.ops
    kernels = [k for k in first.fd.kernels if "gather_rows" in k.source]
    assert len(kernels) == 1 and "tl.sum" in kernels[0].source
