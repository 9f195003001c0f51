"""Bias gradients (column sums of [M, N]) on both backends, and the outer scheduler's
choices on the H100 model (issue 20, item 2).

Correctness: `dy.float().sum(0)`, `dy.sum(0)` and the GELU backward with its column sum
(dx a second output), fp32 and bf16, odd N, N not a multiple of the vector, one row, rows
not a multiple of the split, non-contiguous dy; against torch in fp64 with a tolerance
that grows with M. Every split and single-stage layout is run too, forced, on one shape.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fuser.bench.measure import with_schedule
from fuser.examples.bias_grad import bias_grad_eager, bias_grad_fusion
from fuser.schedulers.device import get_device
from fuser.schedulers.outer import PICK_BAND, cost, outer_candidates

BF16, F32 = torch.bfloat16, torch.float32


def _inputs(form: str, m: int, n: int, dtype: torch.dtype, layout: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(m * 131 + n)

    def one() -> torch.Tensor:
        if layout == "transposed":  # column-major: row stride 1
            return torch.randn(n, m, generator=g).to(dtype).t()
        if layout == "sliced":  # every other column of a wider tensor
            return torch.randn(m, 2 * n, generator=g).to(dtype)[:, ::2]
        return torch.randn(m, n, generator=g).to(dtype)

    return [one() for _ in range(2 if form == "gelu" else 1)]


def _compare(form: str, ins: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    """Against eager torch (fp32 accumulation, outputs in eager's dtypes)."""
    ref = bias_grad_eager(form, ins)
    m = ins[0].shape[0]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        eps = torch.finfo(g.dtype).eps
        # two fp32 sums of M terms in different orders differ by ~sqrt(M) ulps of the
        # terms' scale; then each rounds to the output dtype
        scale = r.float().abs().max().item() + 1.0
        atol = (4e-7 * math.sqrt(m) + 2 * eps) * scale
        torch.testing.assert_close(g.float(), r.float(), atol=atol, rtol=2 * eps)


SHAPES = [(1, 37), (5, 77), (300, 77), (257, 130), (64, 24)]


@pytest.mark.parametrize("form", ["f32", "same", "gelu"])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_bias_grad_matches_torch(backend, form, dtype, shape) -> None:
    if form == "f32" and dtype == F32:
        pytest.skip("the same fusion as 'same' on fp32")
    fd = bias_grad_fusion(form, dtype)
    ins = _inputs(form, *shape, dtype, "contiguous")
    out = fd.execute(ins)
    _compare(form, ins, out)
    assert "outer_reduction" in {k.schedule.kind for k in fd.kernels}
    # the partials are added in a fixed order: bit for bit the same again
    assert all(torch.equal(a, b) for a, b in zip(fd.execute(ins), out))


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
@pytest.mark.parametrize("form", ["f32", "gelu"])
def test_bias_grad_non_contiguous(backend, form, layout) -> None:
    fd = bias_grad_fusion(form, BF16)
    ins = _inputs(form, 70, 45, BF16, layout)
    _compare(form, ins, fd.execute(ins))


def test_every_outer_layout_runs(backend) -> None:
    """Every candidate the outer heuristic scores on 300 x 77 (gelu backward, dx and db):
    single stage and split, finalize tiles narrower than the columns; forced, each
    matches torch."""
    form, dtype = "gelu", BF16
    fd = bias_grad_fusion(form, dtype)
    ins = _inputs(form, 300, 77, dtype, "contiguous")
    fd.execute(ins)
    plan = fd._runtime().last
    (idx,) = [i for i, k in plan.kernels.items() if k.schedule.kind == "outer_reduction"]
    cands = outer_candidates(plan.kernels[idx].spec, get_device("h100"), backend)
    splits = {s.split_rows > 1 for s in cands}
    assert splits == {True, False}, [s.short() for s in cands]
    # one of each (tile width, split or not): the interpreter is slow
    picked: dict[tuple, object] = {}
    for s in cands:
        picked.setdefault((s.chunk, s.split_rows > 1, s.finalize_cols < 77), s)
    for s in picked.values():
        _compare(form, ins, with_schedule(plan, idx, s).run(ins))


# -- the heuristic on the H100 model ---------------------------------------------------------
TARGETS = [(8192, n) for n in (768, 1024, 2304, 3072, 4096, 6400)] + [(32768, 768), (32768, 3072)]


def _spec(form: str, m: int, n: int, backend: str):
    fd = bias_grad_fusion(form, BF16)
    ins = [torch.empty(m, n, dtype=BF16, device="meta")] * (2 if form == "gelu" else 1)
    (k,) = fd.compile(ins, device="h100", backend=backend)
    return k


SWEEP = Path(__file__).parent.parent / "benchmarks/results/h100-2026-11-25-outer-sweep/sweep.jsonl"


def sweep_regret(path: Path, backend: str, shape: str) -> tuple[str, float, float]:
    """(the heuristic's schedule, its measured ms, the fastest measured ms) at `shape` in
    an outer_sweep.py results file (f32 form: dy.float().sum(0) on bf16 dy)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = {
        r["schedule"]: r["ms"]
        for r in rows
        if r["shape"] == shape and r["impl"] == f"sweep-{backend}" and r.get("ms")
    }
    m, n = (int(x) for x in shape.split("x"))
    mine = _spec("f32", m, n, backend).schedule.short()
    assert mine in timed, f"{mine} was not timed in {path}"
    return mine, timed[mine], min(timed.values())


@pytest.mark.parametrize("backend_name", ["triton", "cuda"])
@pytest.mark.parametrize("shape", ["8192x768", "8192x3072", "32768x3072"])
def test_regret_on_the_h100_sweep(backend_name, shape) -> None:
    """The heuristic's choice, timed in the H100 sweep, is within 5% of the fastest of the
    ~150 schedules timed there (the sweep's run-to-run noise is about that)."""
    mine, ms, best = sweep_regret(SWEEP, backend_name, shape)
    assert ms <= 1.05 * best, f"{mine}: {ms:.4f} ms, the fastest {best:.4f}"


@pytest.mark.parametrize("backend_name", ["triton", "cuda"])
@pytest.mark.parametrize("form", ["f32", "gelu"])
@pytest.mark.parametrize("shape", TARGETS, ids=[f"{m}x{n}" for m, n in TARGETS])
def test_heuristic_at_the_targets(backend_name, form, shape) -> None:
    """Too few column tiles to fill 132 SMs at every target: the rows are split, the
    grid fills every SM with enough loads in flight to cover DRAM latency, the workspace
    is a few percent of the bytes, and the reasons say so."""
    dev = get_device("h100")
    k = _spec(form, *shape, backend_name)
    s = k.schedule
    assert s.kind == "outer_reduction" and s.split_rows > 1, s.short()
    c = cost(k.spec, dev, s, s.estimate.registers, backend_name)
    # (rounded down to whole column tiles: a few SMs may idle); several blocks a SM, the
    # warps to hide the loop's work (one block a SM measured at a third of the bandwidth)
    assert c.blocks >= 2 * dev.sms and c.warps >= 12
    assert c.efficiency >= 0.6
    # the partials (counted in the cost) stay a small L2-resident buffer
    assert s.split_rows * shape[1] * 4 <= dev.l2_bytes // 8 and c.workspace_us > 0
    # a finalize block per ~SM: its column tile leaves no more than a few tiles per SM
    assert s.finalize_cols >= s.vector and -(-shape[1] // s.finalize_cols) >= dev.sms // 2
    text = "\n".join(s.reasons)
    assert "split-M two stage" in text and "unsplit, the best column tiling" in text
    assert "warps a SM" in text and "of the copy ceiling" in text and "thread-row combines" in text
    assert "finalize as a second launch" in text and "fixed order" in text
    # explain prints the plan's finalize launch
    assert "finalize launch: grid" in k.plan.text()


@pytest.mark.parametrize("backend_name", ["triton", "cuda"])
def test_heuristic_wide_columns_need_no_split(backend_name) -> None:
    """2048 x 262144 bf16: 4096 column tiles of 64 fill every SM with loads in flight on
    their own: one launch, no workspace, and the reasons say why not split."""
    k = _spec("f32", 2048, 262144, backend_name)
    s = k.schedule
    assert s.split_rows == 1 and not k.plan.workspaces, s.short()
    text = "\n".join(s.reasons)
    assert "column-tiled single stage" in text and "best split-M schedule predicts" in text


def test_heuristic_chooses_the_cheapest_predicted() -> None:
    """The choice is within the tie band of the cheapest candidate the model scores."""
    dev = get_device("h100")
    for m, n in TARGETS:
        k = _spec("f32", m, n, "triton")
        cands = outer_candidates(k.spec, dev, "triton")
        best = min(cost(k.spec, dev, c, c.estimate.registers).total_us for c in cands)
        mine = cost(k.spec, dev, k.schedule, k.schedule.estimate.registers).total_us
        assert mine <= best * (1 + PICK_BAND) + 1e-9
