"""The Triton inner_outer row loop pipelined (plan.row_stages: `tl.range(0, row_blocks,
blocks, num_stages=N)`, the next steps' loads issued ahead through shared memory), as
config.inner_outer_stages (FUSER_INNER_OUTER_STAGES) asks and fuser/plan/build.py
allows: against torch and against the unstaged loop, on forced grids of a few blocks so
that each walks many steps, the last one past the rows; LayerNorm backward plain and in
the GPT-2 form (fp32 residual stream, the residual gradient added, its bf16 cast) and
RMSNorm backward, at odd widths; and the rule that lowers or refuses the depth.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import fuser.codegen.triton.inner_outer as triton_inner_outer
from fuser.bench.measure import with_schedule
from fuser.config import config
from fuser.examples.norm_backward import norm_backward_fusion
from fuser.plan.build import STAGED_SMEM_PER_SM, make_plan
from fuser.runtime.executor import CompiledFusion
from fuser.schedulers.device import get_device
from fuser.schedulers.inner_outer import inner_outer_candidates
from fuser.schedulers.schedule import Schedule

F32, BF16 = torch.float32, torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5


def _inputs(kind: str, rows: int, cols: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 131 + cols)
    x = torch.randn(rows, cols, generator=g) * 2 + 0.5
    x = x if kind == "gpt2" else x.to(BF16)
    dy = torch.randn(rows, cols, generator=g).to(BF16)
    w = torch.randn(cols, generator=g) * 0.1 + 1
    xf = x.float()
    rstd = torch.rsqrt(((xf * xf).mean(1) if kind == "rms" else xf.var(1, unbiased=False)) + EPS)
    ins = [dy, x, w] + ([] if kind == "rms" else [xf.mean(1)]) + [rstd]
    if kind == "gpt2":
        ins.append(torch.randn(rows, cols, generator=g))
    return [t.to(DEVICE) for t in ins]


def _reference(kind: str, ins: list[torch.Tensor]) -> list[torch.Tensor]:
    """The backward in float64, in the fusion's output order."""
    dy, x, w = (t.double() for t in ins[:3])
    mean = None if kind == "rms" else ins[3].double()[:, None]
    rstd = ins[-2 if kind == "gpt2" else -1].double()[:, None]
    xhat = (x if mean is None else x - mean) * rstd
    wg = dy * w
    inner = wg - xhat * (wg * xhat).mean(1, keepdim=True)
    if mean is not None:
        inner = inner - wg.mean(1, keepdim=True)
    dx = rstd * inner
    outs = [ins[-1].double() + dx] * 2 if kind == "gpt2" else [dx]
    outs.append((dy * xhat).sum(0))
    if mean is not None:
        outs.append(dy.sum(0))
    return outs


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    # fp32 math over a short row or column, then the output's own rounding
    eps = torch.finfo(got.dtype).eps
    scale = ref.abs().max().item() + 1.0
    torch.testing.assert_close(got.double(), ref, atol=max(1e-5, 2 * eps) * scale, rtol=2 * eps)


def _plan(kind: str, ins: list[torch.Tensor], cols: int) -> tuple[CompiledFusion, int]:
    fd = norm_backward_fusion(kind, cols)
    fd.execute(ins, backend="triton")
    plan = fd._runtime().last
    (idx,) = [i for i, k in plan.kernels.items() if k.schedule.kind == "inner_outer"]
    return plan, idx


def _forced(plan: CompiledFusion, idx: int, rpb: int, tail: bool, blocks: int) -> Schedule:
    """A candidate layout of `rpb` rows a step (with or without a tail chunk), its grid
    forced to `blocks` blocks: each walks the rows in many steps."""
    cands = inner_outer_candidates(plan.kernels[idx].spec, get_device("h100"), "triton")
    s = next(c for c in cands if c.rows_per_block == rpb and bool(c.tail) == tail)
    return dataclasses.replace(s, split_rows=blocks, programs=blocks).validate()


def _loop_head(source: str) -> str:
    (head,) = [ln.strip() for ln in source.splitlines() if ln.strip().startswith("for step in ")]
    return head


# (kind, rows, cols, rows a step, tail chunk, blocks): odd widths (a tail chunk) at one
# row a step; several rows a step without a tail (the rule refuses a tail there)
CASES = [
    ("ln", 45, 77, 1, True, 4),  # 12 steps a block, the last past the rows for 3 blocks
    ("gpt2", 53, 131, 1, True, 3),  # 18 steps, the residual gradient and its cast
    ("rms", 47, 100, 1, True, 4),
    ("ln", 61, 96, 2, False, 3),  # 31 row blocks of 2: 11 steps, the last half past
    ("gpt2", 38, 64, 2, False, 3),
]


@pytest.mark.parametrize("kind, rows, cols, rpb, tail, blocks", CASES)
def test_staged_loop_against_torch_and_unstaged(
    monkeypatch: pytest.MonkeyPatch, kind, rows, cols, rpb, tail, blocks
) -> None:
    ins = _inputs(kind, rows, cols)
    plan, idx = _plan(kind, ins, cols)
    s = _forced(plan, idx, rpb, tail, blocks)
    ref = _reference(kind, ins)
    row_blocks = -(-rows // rpb)
    outs = {}
    for asked in (1, 3, 2):  # 1: unstaged
        monkeypatch.setattr(config, "inner_outer_stages", asked)
        run = with_schedule(plan, idx, s)
        k = run.kernels[idx]
        assert k.plan.row_stages == asked, k.plan.text()
        head = _loop_head(k.source)
        trips = f"0, {row_blocks}, {blocks}"
        if asked > 1:
            assert head == f"for step in tl.range({trips}, num_stages={asked}):"
            assert f"loads {asked - 1} step(s) ahead through shared memory" in k.plan.text()
        else:
            assert head == f"for step in range({trips}):"
            assert "num_stages" not in k.source and "ahead through" not in k.plan.text()
        got = run.run(ins)
        assert [t.dtype for t in got] == [t.dtype for t in plan.run(ins)]
        for g, r in zip(got, ref):
            _close(g, r)
        outs[asked] = got
    if DEVICE == "cpu":  # the interpreter: the same ops in the same order, bit for bit
        for asked in (3, 2):
            assert all(torch.equal(a, b) for a, b in zip(outs[asked], outs[1]))


def test_hoisted_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's switch (HOIST_COLUMNS): the weights loaded once, before the staged
    loop, give the same results."""
    kind, rows, cols = "gpt2", 41, 72
    ins = _inputs(kind, rows, cols)
    plan, idx = _plan(kind, ins, cols)
    s = _forced(plan, idx, 1, False, 3)
    monkeypatch.setattr(config, "inner_outer_stages", 3)
    base = with_schedule(plan, idx, s)
    monkeypatch.setattr(triton_inner_outer, "HOIST_COLUMNS", True)
    hoisted = with_schedule(plan, idx, s)
    src = hoisted.kernels[idx].source
    w = next(a for a in hoisted.kernels[idx].spec.inputs if a.kind.name == "COL").name
    loop = src[src.index("for step in ") : src.index("_finalize(")]
    assert f"tl.load({w}_ptr" in src.split("for step in ")[0] and f"{w}_ptr" not in loop
    for g, b, r in zip(hoisted.run(ins), base.run(ins), _reference(kind, ins)):
        _close(g, r)
        if DEVICE == "cpu":
            assert torch.equal(g, b)


def _meta(kind: str, rows: int, cols: int) -> list[torch.Tensor]:
    small = _inputs(kind, 3, cols)
    shape = {(3, cols): (rows, cols), (3,): (rows,), (cols,): (cols,)}
    return [torch.empty(shape[tuple(t.shape)], dtype=t.dtype, device="meta") for t in small]


def _chosen(kind: str, rows: int, cols: int, monkeypatch, asked: int):
    monkeypatch.setattr(config, "inner_outer_stages", asked)
    (k,) = norm_backward_fusion(kind, cols).compile(_meta(kind, rows, cols), "h100", "triton")
    assert k.schedule.kind == "inner_outer"
    return k


def test_default_depths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default asks 3 stages, and the rule lowers them where the buffers would not
    fit: the depths measured on the H100 (build.py INNER_OUTER_STAGES)."""
    for kind, rows, cols, want in [
        ("gpt2", 16384, 768, 2),
        ("gpt2", 8192, 1600, 2),
        ("ln", 8192, 4096, 3),
        ("rms", 8192, 1600, 3),
    ]:
        k = _chosen(kind, rows, cols, monkeypatch, 0)
        assert k.plan.row_stages == want, (kind, rows, cols, k.schedule.short())
        assert f"num_stages={want}" in k.source


def test_rule_lowers_or_refuses_the_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPT-2 step at 768: 16 steps a block, 8 blocks a SM; 3 stages' 2 buffers of
    # 10.8 KB a block are 172 KB a SM, over the budget: 2 stages (86 KB)
    k = _chosen("gpt2", 16384, 768, monkeypatch, 3)
    s = k.schedule
    assert (s.estimate.blocks_per_sm, s.rows_per_block, s.tail) == (8, 1, 0), s.short()
    assert 2 * 8 * 768 * 14 > STAGED_SMEM_PER_SM >= 8 * 768 * 14
    assert k.plan.row_stages == 2
    assert _loop_head(k.source) == "for step in tl.range(0, 16384, 1056, num_stages=2):"
    # too few steps a block to pipeline: fewer than 2 x the stages (grids forced)
    monkeypatch.setattr(config, "inner_outer_stages", 2)
    for blocks, steps, stages in [(5462, 3, 1), (4096, 4, 2)]:
        forced = dataclasses.replace(s, split_rows=blocks, programs=blocks)
        assert -(-16384 // forced.grid[0]) == steps
        assert make_plan(k.spec, forced).row_stages == stages
    # one block a SM of 16 warps at 4096 columns: 3 stages fit (2 x 56 KB), 4 do not
    k = _chosen("gpt2", 8192, 4096, monkeypatch, 4)
    assert k.schedule.estimate.blocks_per_sm == 1 and k.plan.row_stages == 3


def test_no_staging_with_several_rows_a_step_and_a_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """ptxas gave such loops ~45 more registers staged: a block fewer a SM than the grid
    needs (LayerNorm backward at 8192 x 1600, 2 rows a step, a 64-column tail)."""
    k = _chosen("ln", 8192, 1600, monkeypatch, 3)
    s = k.schedule
    assert s.rows_per_block > 1 and s.tail, s.short()
    assert k.plan.row_stages == 1
    one_row = dataclasses.replace(s, rows_per_block=1)
    monkeypatch.setattr(config, "inner_outer_stages", 2)
    assert make_plan(k.spec, one_row).row_stages == 2
