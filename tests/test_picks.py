"""One-hot selects read as one element a row (fuser/plan/picks.py): in a looped row walk
sum(where(iota == index, f(x), 0)) is f(x) at the index's column, 0 where the index is
off the row. Checked against torch on rows the h100 preset walks in a loop (Triton's
interpreter on a CPU), with indices in range, off either end and ignored, values that are
not finite elsewhere in the row, and on which sums the plan marks as picks."""

from __future__ import annotations

import pytest
import torch

import fuser
from fuser import FusionDefinition
from fuser.plan.picks import one_hot_picks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
COLS = 50003  # fp32: too long for registers on the h100 preset, so the row is walked


def _select_fusion(index_dtype: torch.dtype, zero: float = 0.0, transposed: bool = False):
    """Per row: sum(where(iota == index, 2 * x + 1, zero)) and the row's max (a walked
    reduction beside it), and x * 3 (an output pass)."""
    with FusionDefinition("select") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], torch.float32)
        i = fd.define_tensor([-1], index_dtype)
        rowb = o.broadcast_in_dim(i, shape=x.shape, broadcast_dims=[0])
        col = o.iota(x.shape, dim=1, dtype=index_dtype)
        hit = o.eq(rowb, col) if transposed else o.eq(col, rowb)
        fd.add_output(o.sum(o.where(hit, o.add(o.mul(x, 2.0), 1.0), zero), dims=[1]))
        fd.add_output(o.max(x, dims=[1]))
        fd.add_output(o.mul(x, 3.0))
    return fd


def _reference(x: torch.Tensor, i: torch.Tensor, zero: float = 0.0) -> list[torch.Tensor]:
    col = torch.arange(x.shape[1], device=x.device)[None, :]
    summand = torch.where(col == i[:, None].long(), 2 * x + 1, torch.full_like(x, zero))
    return [summand.sum(1), x.amax(1), x * 3]


def _row_kernel(fd: FusionDefinition):  # noqa: ANN202
    return max(fd.kernels, key=lambda k: k.spec.cols)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("transposed", [False, True])
def test_pick_matches_the_sum(index_dtype: torch.dtype, transposed: bool) -> None:
    g = torch.Generator().manual_seed(3)
    rows = 7
    x = torch.randn(rows, COLS + 5, generator=g)[:, 2 : COLS + 2]  # rows not contiguous
    i = torch.tensor([0, COLS - 1, 17, -1, COLS, -100, 31337], dtype=index_dtype)
    x[2, 5] = float("nan")  # not the picked column: the sum ignores it, so must the pick
    x[4, 9] = float("inf")
    x, i = x.to(DEVICE), i.to(DEVICE)
    fd = _select_fusion(index_dtype, transposed=transposed)
    got = fd.execute([x, i], backend="triton")
    k = _row_kernel(fd)
    assert k.schedule.kind == "inner_looped", k.schedule.explain()
    assert len(k.plan.picks) == 1 and "pick:" in k.plan.text(), k.plan.text()
    assert "cols_pick" in k.source and "acc_" + k.plan.picks[0].reduction.out.name not in k.source
    for a, b in zip(got, _reference(x, i)):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-6, atol=1e-6, equal_nan=True)
    # off the row (-1, COLS, -100) the sum is 0, as eager's
    assert got[0][[3, 4, 5]].abs().max().item() == 0.0


def test_nan_at_the_picked_column_is_kept() -> None:
    x = torch.randn(3, COLS)
    x[1, 42] = float("nan")
    i = torch.tensor([5, 42, 7])
    got = _select_fusion(torch.int64).execute([x.to(DEVICE), i.to(DEVICE)], backend="triton")
    assert torch.isnan(got[0][1]).item() and not torch.isnan(got[0][[0, 2]]).any().item()


def test_not_a_pick_where_the_other_branch_is_not_zero() -> None:
    """where(hit, x, 1) sums V - 1 ones besides x: a walked sum, and the right one."""
    g = torch.Generator().manual_seed(4)
    x, i = torch.randn(3, COLS, generator=g), torch.tensor([1, 2, COLS + 3])
    fd = _select_fusion(torch.int64, zero=1.0)
    got = fd.execute([x.to(DEVICE), i.to(DEVICE)], backend="triton")
    assert not _row_kernel(fd).plan.picks
    for a, b in zip(got, _reference(x.to(DEVICE), i.to(DEVICE), zero=1.0)):
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-2)


def test_float_index_and_row_iota_are_not_picks() -> None:
    """An iota along the rows, or an index that is not an integer, is no column pick."""
    with FusionDefinition("rows") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], torch.float32)
        f = fd.define_tensor([-1], torch.float32)
        rowb = o.broadcast_in_dim(f, shape=x.shape, broadcast_dims=[0])
        by_rows = o.eq(o.iota(x.shape, dim=0, dtype=torch.float32), rowb)
        by_float = o.eq(o.iota(x.shape, dim=1, dtype=torch.float32), rowb)
        fd.add_output(o.sum(o.where(by_rows, x, 0.0), dims=[1]))
        fd.add_output(o.sum(o.where(by_float, x, 0.0), dims=[1]))
    xs = [torch.empty(64, COLS, device="meta"), torch.empty(64, device="meta")]
    for k in fd.compile(xs, "h100", "triton"):
        assert not one_hot_picks(k.spec), k.plan.text()


def test_index_returned_as_an_output_is_not_read_back() -> None:
    """An index the kernel computes and also returns is used from its register: loading
    it back from the output just stored would race with the store on a GPU."""
    with FusionDefinition("out_index") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], torch.float32)
        t = fd.define_tensor([-1], torch.int64)
        narrow = o.cast(o.minimum(o.maximum(t, -1), COLS), torch.int32)
        rowb = o.broadcast_in_dim(narrow, shape=x.shape, broadcast_dims=[0])
        hit = o.eq(o.iota(x.shape, dim=1, dtype=torch.int32), rowb)
        fd.add_output(o.sum(o.where(hit, x, 0.0), dims=[1]))
        fd.add_output(narrow)
        fd.add_output(o.mul(x, 2.0))
    x, t = torch.randn(3, COLS), torch.tensor([5, -100, COLS - 1])
    got = fd.execute([x.to(DEVICE), t.to(DEVICE)], backend="triton")
    k = _row_kernel(fd)
    assert k.plan.picks, k.plan.text()
    (out,) = [a for a in k.spec.outputs if a.value.id == k.plan.picks[0].index.id]
    assert f"tl.load({out.name}_ptr" not in k.source, k.source
    want = torch.tensor([x[0, 5].item(), 0.0, x[2, COLS - 1].item()])
    torch.testing.assert_close(got[0].cpu(), want)


def test_index_checks_in_the_summand_keep_the_sum() -> None:
    """A check_index inside the summand reports a bad index in any column; a pick would
    look at one column only, so the sum stays a walk and the bad index raises."""
    with FusionDefinition("checked") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], torch.float32)
        idx = fd.define_tensor([-1, -1], torch.int64)
        t = fd.define_tensor([-1], torch.int64)
        checked = o.cast(o.check_index(idx, bound=10), torch.float32)
        rowb = o.broadcast_in_dim(t, shape=x.shape, broadcast_dims=[0])
        hit = o.eq(o.iota(x.shape, dim=1, dtype=torch.int64), rowb)
        fd.add_output(o.sum(o.where(hit, o.add(x, checked), 0.0), dims=[1]))
        fd.add_output(o.max(x, dims=[1]))
    idx = torch.randint(0, 10, (3, COLS))
    idx[1, 100] = 999  # not a picked column
    ins = [torch.randn(3, COLS), idx, torch.tensor([5, 6, 7])]
    with pytest.raises(fuser.OutOfBoundsError):
        fd.execute([a.to(DEVICE) for a in ins], backend="triton")
        fuser.check_errors()  # a GPU records the bad index for the host (on a CPU: raised)
    assert not _row_kernel(fd).plan.picks
