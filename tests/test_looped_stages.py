"""The Triton inner looped kernel's pipelined row walk (plan.walk_stages): every loop over
the row's chunks (the online max-and-sum pass, plain reduction passes, the output pass)
written `tl.range(start, end, width, num_stages=n)` with its loads addressed from the
scalar offset, the head and tail tiles outside it; `range(...)` and the usual addressing
where walk_stages is 1.

On forced looped schedules of small widths (many iterations over rows of a few thousand
columns, odd widths, a masked tail) and with config.looped_stages (FUSER_LOOPED_STAGES) set:
- the plan pipelines only where fuser/plan/build.py _walk_stages allows it (loads of 4
  bytes or more a thread, two iterations a stage), and the source has the staged loops
  exactly when the plan says so;
- softmax and log_softmax (fp32 and bf16) and the one-pass cross-entropy forward of
  fuser::cross_entropy (loss with ignored targets, gradient written into 16-byte aligned
  rows, logits a slice of wider rows or contiguous odd rows walked from an aligned start)
  match torch, and the staged kernel's outputs are bitwise those of the unstaged one.
On a GPU the same tests run the pipelined kernels themselves; here, Triton's interpreter
(which takes tl.range's num_stages and runs the loop as range does).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from fuser import FusionDefinition
from fuser.backends.registry import get_backend
from fuser.bench.measure import with_schedule
from fuser.config import config
from fuser.dynamo.ce_op import grad_row_stride
from fuser.dynamo.ce_region import one_pass_fusion
from fuser.runtime.executor import CompiledFusion
from fuser.schedulers.device import get_device
from fuser.schedulers.heuristics import schedule_looped
from fuser.segmenter import Kind

BF16, F32 = torch.bfloat16, torch.float32
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _row_kernel(fd: FusionDefinition, ins: list[torch.Tensor]) -> tuple[CompiledFusion, int]:
    """The plan fd runs on `ins` with Triton, and the index of its row kernel (the widest)."""
    fd.execute(ins, backend="triton")
    plan = fd._runtime().last
    idx = max(plan.kernels, key=lambda i: plan.kernels[i].spec.cols)
    return plan, idx


def _looped(
    plan: CompiledFusion,
    idx: int,
    stages: int,
    monkeypatch: pytest.MonkeyPatch,
    vector: int,
    align_walk: bool = False,
) -> CompiledFusion:
    """`plan` with its row kernel walked by one warp a chunk an iteration (32 x vector
    columns) and planned with config.looped_stages = `stages`."""
    monkeypatch.setattr(config, "looped_stages", stages)
    spec = plan.kernels[idx].spec
    s = schedule_looped(spec, get_device("h100"), vector, [], 1, 1, "triton", align_walk)
    return with_schedule(plan, idx, s)


def _loops(source: str) -> list[str]:
    return [ln.strip() for ln in source.splitlines() if ln.strip().startswith("for off in ")]


def _check_loops(forced: CompiledFusion, idx: int, want_stages: int) -> None:
    """The plan's walk_stages is `want_stages`, and every loop over the row says so."""
    k = forced.kernels[idx]
    p = k.plan
    assert p.kind == "inner_looped" and p.walk_stages == want_stages, p.text()
    start = p.walk_width if p.walk_align else 0
    steps = f"{start}, {p.walk_end}, {p.walk_width}"
    want = (
        f"for off in tl.range({steps}, num_stages={want_stages}):"
        if want_stages > 1
        else f"for off in range({steps}):"
    )
    loops = _loops(k.source)
    assert len(loops) == p.looped.count and set(loops) == {want}, k.source
    assert ("num_stages" in k.source) == (want_stages > 1)
    (x,) = [a for a in k.spec.args if a.kind == Kind.FULL and not a.is_output]
    lanes = f"{x.name}_ptr + off + rows * {x.row_stride} + tl.arange(0, {p.walk_width})[None, :]"
    if p.walk_align:
        lanes = f"{x.name}_ptr + row_base + off + tl.arange(0, {p.walk_width})[None, :]"
    assert (lanes in k.source) == (want_stages > 1), k.source
    if want_stages > 1:
        assert f"loads issued {want_stages - 1} iteration(s) ahead" in k.source
        assert f"loads {want_stages - 1} iteration(s) ahead" in p.text()


def _softmax(op: str, dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition(op) as fd:
        fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], dtype)))
    return fd


# (dtype, cols, vector, pipelined): fp32 rows of odd width move 4 bytes a thread (vector 1:
# cp.async takes them); bf16 rows of 2000 start 16-byte aligned (vector 8); odd bf16 rows
# move 2 bytes a thread, which Triton does not pipeline, so neither does the plan
SOFTMAX_CASES = [(F32, 1003, 1, True), (BF16, 2000, 8, True), (BF16, 2003, 1, False)]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize(("dtype", "cols", "vector", "pipelined"), SOFTMAX_CASES)
def test_softmax_staged_walk(
    op: str,
    dtype: torch.dtype,
    cols: int,
    vector: int,
    pipelined: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = 5
    g = torch.Generator().manual_seed(cols)
    x = (torch.randn(rows, cols, generator=g) * 3).to(dtype).to(DEVICE)
    fd = _softmax(op, dtype)
    plan, idx = _row_kernel(fd, [x])
    want = getattr(torch, op)(x.float(), dim=-1)
    outs = []
    for stages in (1, 3):
        forced = _looped(plan, idx, stages, monkeypatch, vector)
        _check_loops(forced, idx, stages if pipelined else 1)
        (y,) = forced.run([x])
        assert y.dtype == dtype
        if dtype == F32:
            torch.testing.assert_close(y, want, atol=2e-6, rtol=2e-6)
        else:  # the output's rounding (a bf16 ulp is 2^-8 relative) and an fp32 order
            torch.testing.assert_close(y.float(), want, atol=1e-6, rtol=2**-7)
        outs.append(y)
    assert torch.equal(outs[0], outs[1]), "the staged walk computed other values"


def _cross_entropy(x: torch.Tensor, t: torch.Tensor) -> FusionDefinition:
    """The fusion torch.compile(backend="fuser") makes of fuser::cross_entropy (mean,
    ignore_index -100, logits upcast to float32, the gradient in 16-byte aligned rows) for
    logits and targets laid out as `x` and `t`."""
    return one_pass_fusion(x, t)


# (cols, the logits' row stride, vector, aligned-start walk, stages, pipelined): logits a
# slice of 16-byte aligned rows, walked 256 columns an iteration: 2001 columns take 7
# iterations and a tail of 209 (enough for 3 stages, not for 4), 2113 take 8 and a tail of
# 65, 1001 take 3 (too few for 3 stages); contiguous odd rows walked from their aligned
# start: a masked head, 6 iterations, the tail
CE_CASES = [
    (2001, 2008, 8, False, 3, True),
    (2001, 2008, 8, False, 4, False),
    (2113, 2120, 8, False, 2, True),
    (1001, 1008, 8, False, 3, False),
    (2001, 2001, 8, True, 3, True),
]


@pytest.mark.parametrize(("cols", "stride", "vector", "align", "stages", "pipelined"), CE_CASES)
def test_cross_entropy_staged_walk(
    cols: int,
    stride: int,
    vector: int,
    align: bool,
    stages: int,
    pipelined: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = 6
    g = torch.Generator().manual_seed(cols + stride)
    base = (torch.randn(rows, stride, generator=g) * 2).to(BF16).to(DEVICE)
    x = base[:, :cols]
    t = torch.randint(0, cols, (rows,), generator=g)
    t[[1, 4]] = -100  # ignored rows: no loss, a zero gradient, not counted in the mean
    t[2] = cols - 1  # a target in the tail tile
    t = t.to(DEVICE)
    fd = _cross_entropy(x, t)
    plan, idx = _row_kernel(fd, [x, t])
    xr = x.float().requires_grad_(True)
    want = F.cross_entropy(xr, t)
    want.backward()
    outs = []
    for n in (1, stages):
        forced = _looped(plan, idx, n, monkeypatch, vector, align)
        assert forced.kernels[idx].plan.walk_align == (vector if align else 0)
        _check_loops(forced, idx, n if pipelined else 1)
        loss, grad = forced.run([x, t])
        assert grad.stride() == (grad_row_stride(cols, BF16), 1)
        torch.testing.assert_close(loss, want.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grad.float(), xr.grad, atol=1e-6, rtol=1.6e-2)
        assert not grad[[1, 4]].any(), "an ignored row has a gradient"
        outs.append((loss, grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_default_stages_narrow_walks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default (build.py WALK_STAGES, WIDE_BYTES) a walk of 16-byte vectors stays
    unpipelined (the cross-entropy row kernel at GPT-2's 16384 x 50257 bf16: no gain on
    the H100) and a walk of narrow loads is staged 3 deep (the softmax of 8192 x 50257
    fp32 rows, one 4-byte element an access: 1.68x); planned from meta tensors."""
    monkeypatch.setattr(config, "looped_stages", 0)  # as when FUSER_LOOPED_STAGES is unset
    x = torch.empty_strided((16384, 50257), (50264, 1), dtype=BF16, device="meta")
    t = torch.empty(16384, dtype=torch.int64, device="meta")
    k = max(_cross_entropy(x, t).compile([x, t], "h100", "triton"), key=lambda k: k.spec.cols)
    assert k.plan.kind == "inner_looped" and k.plan.vector == 8 and k.plan.walk_stages == 1
    assert "num_stages" not in k.source and len(_loops(k.source)) == 2
    y = torch.empty((8192, 50257), dtype=torch.float32, device="meta")
    (k,) = _softmax("softmax", torch.float32).compile([y], "h100", "triton")
    assert k.plan.kind == "inner_looped" and k.plan.vector == 1, k.schedule.short()
    assert k.plan.walk_stages == 3 and "num_stages=3" in k.source


def test_cuda_ignores_walk_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA renderer prints the same source whatever walk_stages says (IGNORED_BY)."""
    monkeypatch.setattr(config, "looped_stages", 3)
    x = torch.empty_strided((64, 50257), (50264, 1), dtype=BF16, device="meta")
    t = torch.empty(64, dtype=torch.int64, device="meta")
    k = max(_cross_entropy(x, t).compile([x, t], "h100", "cuda"), key=lambda k: k.spec.cols)
    assert k.plan.kind == "inner_looped"
    one, three = (get_backend("cuda").render(replace(k.plan, walk_stages=n)) for n in (1, 3))
    assert one == three
