"""The Triton outer reduction's row loop: its pipelined form (plan.row_stages: the next
steps' loads issued ahead through shared memory, `tl.range(steps, num_stages=3)`) and its
row mask of a last step past the rows (plan.row_guard). Against torch on forced schedules,
with row splits that leave some blocks one step short and some with no step at all (their
partials are the reductions' identities), loops too short to pipeline, a per-row input,
and a max beside the sum.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fuser import FusionDefinition
from fuser.bench.measure import with_schedule
from fuser.examples.bias_grad import bias_grad_eager, bias_grad_fusion
from fuser.runtime.executor import CompiledFusion
from fuser.schedulers.device import get_device
from fuser.schedulers.outer import outer_candidates
from fuser.schedulers.schedule import Schedule

BF16, F32 = torch.bfloat16, torch.float32
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _outer(fd: FusionDefinition, ins: list[torch.Tensor]) -> tuple[CompiledFusion, int]:
    """The plan fd runs on `ins` with Triton, and the index of its outer kernel."""
    fd.execute(ins, backend="triton")
    plan = fd._runtime().last
    (idx,) = [i for i, k in plan.kernels.items() if k.schedule.kind == "outer_reduction"]
    return plan, idx


def _forced(plan: CompiledFusion, idx: int, rpb: int, split: int) -> Schedule:
    """A split candidate of 4 warps with `rpb` rows a step, forced to `split` splits."""
    cands = outer_candidates(plan.kernels[idx].spec, get_device("h100"), "triton")
    s = next(c for c in cands if c.rows_per_block == rpb and c.split_rows > 1 and c.num_warps == 4)
    return dataclasses.replace(s, split_rows=split)


def _main_source(plan: CompiledFusion, idx: int, s: Schedule) -> str:
    """The row kernel's source under `s` (not its finalize)."""
    src = with_schedule(plan, idx, s).kernels[idx].source
    return src.split("_finalize(")[0]


def _close(got: torch.Tensor, ref: torch.Tensor, rows: int) -> None:
    # two fp32 sums of `rows` terms in different orders, then the output's rounding
    eps = torch.finfo(got.dtype).eps
    scale = ref.float().abs().max().item() + 1.0
    atol = (4e-7 * math.sqrt(rows) + 2 * eps) * scale
    torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=2 * eps)


def _loop(plan: CompiledFusion, idx: int, s: Schedule) -> tuple[str, int]:
    """The row loop's header in the source under `s`, and the plan's row_stages."""
    k = with_schedule(plan, idx, s).kernels[idx]
    src = k.source.split("_finalize(")[0]
    (head,) = [ln.strip() for ln in src.splitlines() if ln.strip().startswith("for i in ")]
    return head, k.plan.row_stages


# 202 rows: 101 steps of 2 rows, 50.5 of 4; 15 and 8 splits give the busiest block 7
# steps (pipelined) and leave others one short, 50 splits 3 (too few to pipeline), 150
# splits leave 49 blocks no step
@pytest.mark.parametrize("rpb, split", [(2, 15), (2, 50), (2, 150), (4, 8), (4, 60)])
def test_gelu_bias_grad_row_loop(rpb: int, split: int) -> None:
    rows, cols = 202, 77
    g = torch.Generator().manual_seed(5)
    ins = [torch.randn(rows, cols, generator=g).to(BF16).to(DEVICE) for _ in range(2)]
    fd = bias_grad_fusion("gelu", BF16)
    plan, idx = _outer(fd, ins)
    s = _forced(plan, idx, rpb, split)
    src = _main_source(plan, idx, s)
    head, stages = _loop(plan, idx, s)
    steps = -(-rows // rpb)
    trips = -(-steps // split)  # steps of the busiest block
    assert stages == (3 if trips >= 6 else 1), head
    assert head == (
        f"for i in tl.range({trips}, num_stages=3):" if stages > 1 else f"for i in range({trips}):"
    )
    # a step reaching past the rows, or blocks with fewer steps than the loop: masked rows
    guarded = rows % (rpb * split) != 0
    assert ("row_ok" in src) == guarded, src
    got = with_schedule(plan, idx, s).run(ins)
    for g_, r in zip(got, bias_grad_eager("gelu", ins)):
        assert g_.dtype == r.dtype
        _close(g_, r, rows)


def _scaled_rows() -> FusionDefinition:
    """y = x * r[:, None] (r one value a row): y, its column max and its column sum."""
    with FusionDefinition("scaled_rows") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], BF16)
        r = fd.define_tensor([-1], F32)
        y = o.mul(o.cast(x, F32), o.broadcast_in_dim(r, shape=x.shape, broadcast_dims=[0]))
        fd.add_output(o.cast(y, BF16))
        fd.add_output(o.max(y, dims=[0]))
        fd.add_output(o.sum(y, dims=[0]))
    return fd


@pytest.mark.parametrize("rows, split", [(96, 5), (96, 40), (98, 5)])
def test_per_row_input_max_and_sum(rows: int, split: int) -> None:
    """A per-row input loaded under the row mask, pipelined or not; blocks without a step
    give max's -inf and sum's 0 as their partials."""
    cols = 45
    g = torch.Generator().manual_seed(rows + split)
    x = torch.randn(rows, cols, generator=g).to(BF16).to(DEVICE)
    r = (torch.randn(rows, generator=g) - 0.5).to(DEVICE)  # the max is not y's 0
    fd = _scaled_rows()
    plan, idx = _outer(fd, [x, r])
    cands = outer_candidates(plan.kernels[idx].spec, get_device("h100"), "triton")
    rpbs = sorted({c.rows_per_block for c in cands if c.split_rows > 1})
    y = x.float() * r[:, None]
    for rpb in rpbs[:2]:
        s = _forced(plan, idx, rpb, split)
        src = _main_source(plan, idx, s)
        assert ("row_ok" in src) == (rows % (rpb * split) != 0), src
        out, cmax, csum = with_schedule(plan, idx, s).run([x, r])
        torch.testing.assert_close(out, y.to(BF16), atol=0, rtol=0)
        torch.testing.assert_close(cmax, y.amax(0), atol=0, rtol=0)
        _close(csum, y.sum(0), rows)
