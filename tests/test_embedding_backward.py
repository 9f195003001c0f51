"""The row scatter-add (fuser/runtime/scatter.py): embedding backward, index_add and
index_put(accumulate) in fuser's Triton kernels (interpreted here), sorted and
deterministic by default, atomic on request; and their lowering from torch.compile
(fuser/dynamo/indexing.py), GPT-2 tiny included. References: ATen in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fuser.errors import OutOfBoundsError
from fuser.runtime.checks import check_errors
from fuser.runtime.scatter import embedding_backward, scatter_add_rows

aten = torch.ops.aten
# fuser runs a CPU tensor's kernels only under the interpreter, which a GPU host does not
# use: there the tests run on the GPU (53 of them failed on the H200 with CPU tensors)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16
V, N = 37, 53  # vocabulary and tokens: no power of two, no block divides them


def _tolerance(dtype: torch.dtype) -> dict:
    # fp32 sums of <= 53 rows against float64; bf16: one rounding of the fp32 sum
    return {"rtol": 2**-7, "atol": 1e-5} if dtype == BF16 else {"rtol": 1e-5, "atol": 1e-5}


def _data(h: int, dtype: torch.dtype, seed: int, shape: tuple = (N,)):
    g = torch.Generator().manual_seed(seed)
    grad = torch.randn(*shape, h, generator=g).to(dtype)
    index = torch.randint(0, V, shape, generator=g)
    index.view(-1)[:9] = 5  # one row named by many tokens
    index.view(-1)[9:12] = V - 1  # the last row
    return grad.to(DEVICE), index.to(DEVICE)


@pytest.mark.parametrize("how", ["sorted", "atomic"])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("h", [24, 13])
@pytest.mark.parametrize("padding_idx, by_freq", [(-1, False), (5, False), (3, True)])
def test_embedding_backward_matches_aten(how, dtype, h, padding_idx, by_freq):
    grad, index = _data(h, dtype, seed=h + padding_idx)
    got = embedding_backward(grad, index, V, padding_idx, by_freq, how=how)
    want = aten.embedding_dense_backward(grad.double(), index, V, padding_idx, by_freq)
    assert got.dtype == dtype and got.shape == (V, h)
    torch.testing.assert_close(got.double(), want, **_tolerance(dtype))
    if padding_idx >= 0:
        assert not got[padding_idx].any()
    unused = sorted(set(range(V)) - set(index.tolist()))
    assert unused and not got[unused].any()  # rows no token names: zeros


def test_strided_grad_2d_index_int32():
    """A [B, T, H] gradient that is a transposed view (its rows are not contiguous) and a
    [B, T] int32 index."""
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(6, 3, 40, generator=g).to(DEVICE)[:, :, 2:26].transpose(0, 1)  # [3, 6, 24]
    index = torch.randint(0, V, (3, 6), generator=g, dtype=torch.int32).to(DEVICE)
    assert not grad.is_contiguous()
    for how in ("sorted", "atomic"):
        got = embedding_backward(grad, index, V, how=how)
        want = aten.embedding_dense_backward(grad.double(), index.long(), V, -1, False)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_wide_rows_take_several_column_blocks():
    """H = 600: 128-column blocks, the last one masked; few row blocks, so each column
    block is its own program."""
    grad, index = _data(600, torch.float32, seed=3)
    got = embedding_backward(grad, index, V)
    want = aten.embedding_dense_backward(grad.double(), index, V, -1, False)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_sorted_is_deterministic_bitwise():
    grad, index = _data(24, BF16, seed=4, shape=(4, 50))
    runs = [embedding_backward(grad, index, V).view(torch.int16) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("how", ["sorted", "atomic"])
def test_empty_index(how):
    empty = torch.zeros(0, dtype=torch.long, device=DEVICE)
    got = embedding_backward(torch.randn(0, 24, device=DEVICE), empty, V, how=how)
    assert got.shape == (V, 24) and not got.any()


@pytest.mark.parametrize("how", ["sorted", "atomic"])
@pytest.mark.parametrize("bad", [V, -1, 10**6])
def test_out_of_range_index_raises(how, bad):
    grad, index = _data(24, torch.float32, seed=5)
    index[17] = bad
    with pytest.raises(
        OutOfBoundsError, match=rf"Index {bad} is out of bounds: .*\[17\].*\[0, {V}\)"
    ):
        embedding_backward(grad, index, V, how=how)
        check_errors()  # a GPU's kernel reports it; the interpreter raised already


@pytest.mark.parametrize("how", ["sorted", "atomic"])
def test_index_add_with_base_and_alpha(how):
    grad, index = _data(13, torch.float32, seed=6)
    base = torch.randn(V, 13).to(DEVICE)
    got = scatter_add_rows(grad, index, V, base=base, alpha=-0.5, how=how)
    want = base.double().index_add(0, index, grad.double(), alpha=-0.5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_kernels_compile_for_sm90_without_spills():
    """ptxas for sm_90, no GPU: the default (sorted) plan of the GPT-2 shape (bf16, 768
    columns) keeps its fp32 accumulators in registers, 4 blocks of 8 warps an SM."""
    from fuser.runtime.scatter import resources
    from fuser.schedulers.scatter import ScatterShape, plan_scatter

    shape = ScatterShape(16384, 50257, 768, "torch.bfloat16", "torch.int64", padding_idx=0)
    r = resources(plan_scatter(shape, "sorted"), "torch.bfloat16")
    assert r["spill_bytes"] == 0 and r["registers"] <= 64, r


# -- torch.compile ---------------------------------------------------------------------------
@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _explained(backend) -> str:
    from fuser.dynamo.graph_text import graph_text

    return "\n".join(graph_text(g) for c in backend.captures for g in c.graphs)


def test_compiled_embedding_padding_and_freq(_fresh_dynamo):
    """F.embedding with padding_idx and scale_grad_by_freq: the backward is fuser's sorted
    kernel (explain says so), the weight gradient matches eager."""
    from fuser.dynamo import FuserBackend

    def f(w, i):
        return (F.embedding(i, w, padding_idx=4, scale_grad_by_freq=True) * 1.5).sum(-1)

    grad, index = _data(24, torch.float32, seed=7, shape=(5, 9))
    w0 = torch.randn(V, 24).to(DEVICE)
    w1, w2 = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    backend = FuserBackend(strict=True)
    torch.compile(f, backend=backend)(w1, index).backward(grad[..., 0])
    f(w2, index).backward(grad[..., 0])
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)
    text = _explained(backend)
    assert "fuser_embedding_backward" in text and "padding_idx=4, scale_grad_by_freq" in text


def test_compiled_embedding_with_symbolic_sizes(_fresh_dynamo):
    """torch.compile(dynamic=True): the backward's num_weights is a size node, which the
    run-time specialization (lower.py) puts in as a constant before lowering; the
    embedding backward read it as an int and failed (found by fuser.fuzz.programs)."""
    from fuser.dynamo import FuserBackend

    def f(w, i):
        return torch.tanh(F.embedding(i, w)) * 2.0

    grad, index = _data(12, torch.float32, seed=9, shape=(3, 7))
    w0 = torch.randn(V, 12).to(DEVICE)
    w1, w2 = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    backend = FuserBackend(strict=True)
    torch.compile(f, backend=backend, dynamic=True)(w1, index).backward(grad)
    f(w2, index).backward(grad)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)
    assert "fuser_embedding_backward" in _explained(backend)


def test_compiled_index_add_and_index_put(_fresh_dynamo):
    from fuser.dynamo import FuserBackend

    def f(base, i, src):
        a = base.index_add(0, i, src, alpha=2.0)
        b = torch.index_put(base, (i,), src * 3.0, accumulate=True)
        return a, b

    grad, index = _data(13, torch.float32, seed=8)
    base = torch.randn(V, 13).to(DEVICE)
    backend = FuserBackend(strict=True)
    got = torch.compile(f, backend=backend)(base, index, grad)
    for g, w in zip(got, f(base.double(), index, grad.double())):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)
    text = _explained(backend)
    assert "fuser_index_add" in text and "fuser_index_put" in text, text


def test_gpt2_tiny_embedding_backward_in_fuser(_fresh_dynamo):
    """GPT-2 tiny (tied token embedding and lm head) trained one step under
    torch.compile: both embedding backwards run in fuser's sorted kernel and every
    gradient matches eager."""
    from fuser.dynamo import FuserBackend
    from fuser.examples.gpt2 import GPT, get_config

    torch.manual_seed(0)
    eager, fused = GPT(get_config("tiny")).to(DEVICE), GPT(get_config("tiny")).to(DEVICE)
    fused.load_state_dict(eager.state_dict())
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    x[0, :4] = 3  # repeated tokens
    x, y = x.to(DEVICE), y.to(DEVICE)
    backend = FuserBackend(strict=True)
    _, want = eager(x, y)
    _, got = torch.compile(fused, backend=backend)(x, y)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    backward = backend.captures[0].graphs[1]
    assert len(backward.scatters) == 2 and all("sorted scatter-add" in s for s in backward.scatters)
    assert not any(f.op == "aten.embedding_dense_backward" for f in backward.fallbacks)
