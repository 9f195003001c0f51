"""The row scatter-add's deterministic kinds in every regime (fuser/schedulers/scatter.py):
few rows hit by many tokens each (T5's relative position bias, BERT's token types: the
`table` kind, no sort), many rows with a few tokens each (`runs`), long runs in rows too
many for a table (`split`), narrow rows (12 columns). Each against ATen in float64 with a
tolerance that grows with the run's length, each run twice for the same bits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fuser.errors import OutOfBoundsError
from fuser.runtime.checks import check_errors
from fuser.runtime.scatter import embedding_backward, plan_for, scatter_add_rows, source_of
from fuser.schedulers.scatter import ScatterShape, plan_scatter

aten = torch.ops.aten
BF16 = torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run only without a GPU


def _data(rows: int, tokens: int, cols: int, dtype: torch.dtype, seed: int, skew: bool = True):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(tokens, cols, generator=g).to(dtype)
    if skew:  # T5's buckets are far from uniform: row 0 takes a third of the tokens
        index = torch.where(
            torch.rand(tokens, generator=g) < 0.33,
            torch.zeros(tokens, dtype=torch.long),
            torch.randint(0, rows, (tokens,), generator=g),
        )
    else:
        index = torch.randint(0, rows, (tokens,), generator=g)
    index[-3:] = rows - 1  # the last row, named by the last tokens
    return src.to(DEVICE), index.to(DEVICE)


def _assert_close(got, want, src, index, rows, dtype) -> None:
    """|got - want| within fp32 rounding of a sum of the row's run (its length n: 8 sqrt(n)
    units of 2^-24 of the sum of the |terms|), plus the output's own rounding (bf16: half
    a unit in the last place, 2^-9 relative)."""
    mags = torch.zeros(rows, src.shape[-1], dtype=torch.float64, device=src.device).index_add(
        0, index.reshape(-1), src.reshape(-1, src.shape[-1]).double().abs()
    )
    longest = int(torch.bincount(index.reshape(-1), minlength=rows).max())
    tol = mags * (8 * math.sqrt(max(1, longest)) * 2**-24) + 1e-12
    if dtype == BF16:
        tol = tol + want.abs() * 2**-8
    err = (got.double() - want).abs()
    assert got.dtype == dtype
    assert bool((err <= tol).all()), (
        f"max error {float(err.max()):.3g} (tol {float(tol.max()):.3g})"
    )


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {torch.float32: torch.int32, BF16: torch.int16, torch.float16: torch.int16}
    return torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


# -- which kind the plan takes ------------------------------------------------------------
def _plan(rows: int, tokens: int, cols: int, **kw):
    return plan_scatter(ScatterShape(tokens, rows, cols, "torch.bfloat16", "torch.int64", **kw),
                        "sorted")  # fmt: skip


def test_plans_by_regime():
    t5, bert = _plan(32, 262144, 12), _plan(2, 4096, 768)
    assert t5.kind == "table" and bert.kind == "table"
    assert t5.finalize is not None and t5.grid()[0] * t5.grid()[1] >= 264  # fills an H100
    assert "no sort" in t5.explain() and "finalize" in t5.line()
    # GPT-2's token embedding: the runs kernel with its tile unchanged
    gpt2 = _plan(50257, 16384, 768)
    assert (gpt2.kind, gpt2.block_rows, gpt2.block_cols, gpt2.grid()) == ("runs", 8, 256, (6283, 1))
    assert gpt2.line().startswith("sorted scatter-add") and gpt2.finalize is None
    mid = _plan(512, 65536, 768)  # 128 tokens a row, too many rows for a table
    assert mid.kind == "split" and mid.parts == 8 and len(mid.grid()) == 3
    assert _plan(64, 100, 32).kind == "runs"  # short runs: no gain in a table
    # forced kinds, and a table asked of too many rows says why it is not one
    forced = plan_scatter(ScatterShape(4096, 1000, 8, "torch.float32", "torch.int64"), "table")
    assert forced.kind == "runs" and "table asked for, but 1000 rows" in forced.explain()
    with pytest.raises(ValueError, match="scatter mode 'tabel'"):
        plan_scatter(ScatterShape(8, 2, 8, "torch.float32", "torch.int64"), "tabel")


# -- few rows, many tokens: the table ---------------------------------------------------------
@pytest.mark.parametrize(
    "rows, tokens, cols, dtype",
    [
        (4, 5000, 12, torch.float32),
        (4, 5000, 12, BF16),
        (2, 3000, 64, BF16),
        (2, 3000, 64, torch.float32),
        (19, 2500, 40, torch.float32),
    ],  # fmt: skip
)
def test_table_matches_aten_and_repeats_bits(rows, tokens, cols, dtype):
    src, index = _data(rows, tokens, cols, dtype, seed=rows * cols)
    plan = plan_for(src, index, rows, dtype)
    assert plan.kind == "table", plan.explain()
    got = embedding_backward(src, index, rows)
    want = aten.embedding_dense_backward(src.double(), index, rows, -1, False)
    _assert_close(got, want, src, index, rows, dtype)
    assert _same_bits(got, embedding_backward(src, index, rows))


def test_t5_layout_int32_index_padding_and_freq():
    """T5's gradient: [q, k, heads] seen from the [heads, q, k] one (tokens stride 1,
    columns stride q * k), a 2-D int32 bucket index; padding_idx and scale_grad_by_freq."""
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(12, 48, 50, generator=g).to(DEVICE).permute(1, 2, 0)  # [48, 50, 12]
    index = torch.randint(0, 6, (48, 50), generator=g, dtype=torch.int32).to(DEVICE)
    assert plan_for(grad, index, 6, grad.dtype).kind == "table"
    for pad, freq in ((-1, False), (2, True)):
        got = embedding_backward(grad, index, 6, pad, freq)
        want = aten.embedding_dense_backward(grad.double(), index.long(), 6, pad, freq)
        _assert_close(got, want, grad, index.long(), 6, torch.float32)
        if pad >= 0:
            assert not got[pad].any()


@pytest.mark.parametrize("how", ["table", "split", "runs"])
def test_index_add_and_index_put_with_base(how):
    src, index = _data(5, 900, 24, torch.float32, seed=11)
    base = torch.randn(5, 24, device=DEVICE)
    plan = plan_for(src, index, 5, torch.float32, has_base=True, how=how)
    assert plan.kind == how, plan.explain()
    got = scatter_add_rows(src, index, 5, base=base, alpha=-0.5, how=how)
    want = base.double().index_add(0, index, src.double(), alpha=-0.5)
    _assert_close(got, want, src * 0.5, index, 5, torch.float32)
    got = scatter_add_rows(src, index, 5, base=base.to(BF16), how=how)  # index_put(accumulate)
    want = torch.index_put(base.to(BF16).double(), (index,), src.double(), accumulate=True)
    _assert_close(got, want, src, index, 5, BF16)


def test_kinds_agree_and_freq_with_padding():
    """table, split and runs on the same few-row data with both embedding options."""
    src, index = _data(7, 1500, 20, BF16, seed=5)
    want = aten.embedding_dense_backward(src.double(), index, 7, 0, True)
    for how in ("table", "split", "runs"):
        got = embedding_backward(src, index, 7, 0, True, how=how)
        assert plan_for(src, index, 7, BF16, True, 0, how=how).kind == how
        _assert_close(got, want, src, index, 7, BF16)
        assert not got[0].any()


def test_bad_index_in_a_table_raises():
    src, index = _data(4, 700, 12, torch.float32, seed=6)
    index[333] = 4
    # on a GPU the kernel reports it and the next check raises (runtime/checks.py)
    with pytest.raises(OutOfBoundsError, match=r"Index 4 is out of bounds: .*\[333\].*\[0, 4\)"):
        embedding_backward(src, index, 4)
        check_errors()
    index[333], index[600] = 1, -7
    with pytest.raises(OutOfBoundsError, match=r"Index -7 is out of bounds: .*\[600\]"):
        embedding_backward(src, index, 4)
        check_errors()


@pytest.mark.nonfinite
def test_table_keeps_inf_and_nan_in_their_rows():
    """0 * inf in a one-hot product would make every row NaN: a step holding an inf or a
    NaN is added token by token, so only the rows eager makes non-finite are."""
    src, index = _data(3, 400, 16, torch.float32, seed=7, skew=False)
    index[:3] = torch.tensor([0, 1, 1])
    src[0, 5] = float("inf")
    src[1, 2], src[2, 2] = float("inf"), float("-inf")  # row 1: inf - inf = NaN
    got = embedding_backward(src, index, 3)
    want = aten.embedding_dense_backward(src.double(), index, 3, -1, False)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    torch.testing.assert_close(got.double()[finite], want[finite], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("how", ["table", "split"])
def test_empty_index(how):
    empty = torch.randn(0, 12, device=DEVICE), torch.zeros(0, dtype=torch.long, device=DEVICE)
    got = scatter_add_rows(*empty, 3, how=how)
    assert got.shape == (3, 12) and not got.any()


# -- many rows: runs and split ------------------------------------------------------------
def test_many_rows_runs_and_split():
    src, index = _data(200, 1000, 24, torch.float32, seed=8, skew=False)
    assert plan_for(src, index, 200, torch.float32).kind == "runs"
    got = embedding_backward(src, index, 200, 7)
    _assert_close(got, aten.embedding_dense_backward(src.double(), index, 200, 7, False),
                  src, index, 200, torch.float32)  # fmt: skip
    src, index = _data(140, 4800, 13, torch.float32, seed=9, skew=False)  # 34 a row: split
    plan = plan_for(src, index, 140, torch.float32)
    assert plan.kind == "split" and plan.parts == 3, plan.explain()
    got = embedding_backward(src, index, 140)
    want = aten.embedding_dense_backward(src.double(), index, 140, -1, False)
    _assert_close(got, want, src, index, 140, torch.float32)
    assert _same_bits(got, embedding_backward(src, index, 140))


def test_runs_skip_the_padding_rows_run():
    src, index = _data(40, 600, 8, torch.float32, seed=10, skew=False)
    index[::2] = 3  # half the batch is padding
    source = source_of(plan_for(src, index, 40, torch.float32, padding_idx=3, how="runs"))
    assert "count = tl.where(rows == padding_idx, 0, count)" in source
    got = embedding_backward(src, index, 40, 3, how="runs")
    want = aten.embedding_dense_backward(src.double(), index, 40, 3, False)
    _assert_close(got, want, src, index, 40, torch.float32)


# -- sm_90 without a GPU, torch.compile ---------------------------------------------------
def test_table_and_finalize_compile_for_sm90_without_spills():
    """ptxas for sm_90, no GPU: T5's table in fp32 (exact FMA products) and BERT's token
    types in bf16 (tensor cores), each with its finalize, keep everything in registers."""
    from fuser.runtime.scatter import resources_of

    pairs = [(_plan(32, 262144, 12), "torch.float32"), (_plan(2, 4096, 768), "torch.bfloat16")]
    for r in resources_of(pairs):
        assert r["spill_bytes"] == 0 and r["finalize"]["spill_bytes"] == 0, r
        assert r["registers"] <= 128 and r["finalize"]["registers"] <= 128, r


def test_compiled_few_row_embedding_takes_the_table():
    from fuser.dynamo import FuserBackend

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(12)
    w0 = torch.randn(8, 12, generator=g).to(DEVICE)
    index = torch.randint(0, 8, (40, 40), generator=g).to(DEVICE)
    w1, w2 = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    backend = FuserBackend(strict=True)
    torch.compile(lambda w, i: F.embedding(i, w).sin().sum(), backend=backend)(w1, index).backward()
    F.embedding(index, w2).sin().sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-5)
    notes = backend.captures[0].graphs[1].scatters
    torch._dynamo.reset()
    assert notes and "table scatter-add" in notes[0], notes


def test_repeated_calls_plan_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scatter-add called again with the same shapes (an embedding's backward, every
    step) looks its plan and module up instead of planning and loading them again; a new
    shape or mode plans afresh, and every call's result is still ATen's."""
    import fuser.runtime.scatter as scatter

    calls = []
    real = scatter.plan_scatter

    def counting(shape: ScatterShape, how: str):  # noqa: ANN202
        calls.append((shape, how))
        return real(shape, how)

    monkeypatch.setattr(scatter, "plan_scatter", counting)
    scatter._planned.cache_clear()
    src, index = _data(37, 211, 24, torch.float32, seed=5, skew=False)
    want = torch.zeros(37, 24, dtype=torch.float64, device=DEVICE)
    want.index_add_(0, index, src.double())
    for _ in range(3):
        got = scatter_add_rows(src, index, 37)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 1, calls
    scatter_add_rows(src, index, 37, how="atomic")
    scatter_add_rows(src[:, :12], index, 37)
    assert len(calls) == 3, calls
