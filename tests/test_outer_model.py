"""The outer reduction's cost model (fuser/schedulers/outer.py) against the H100: its pick
for the GELU backward's bias gradient lies near the fastest schedule measured; the
producer's math is priced (its instructions an element, its padded lanes and rows, the
warps that hide it) for Triton and left unpriced for CUDA (no CUDA kernel with a
producer's math has been swept); the Triton register estimate of an outer kernel tracks
ptxas.

tests/fixtures/outer_gelu_h100.jsonl holds the rows of benchmarks/results/
h100-2026-11-28-session12/1-gelu-bias-sweep/results.jsonl (every candidate timed quickly
with the L2 flushed, then the fastest three and the old pick re-timed: confirm rows)
within 10% of the fastest at each shape, and the confirm rows; benchmarks/outer_fit.py
reports the whole fit.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from fuser.examples.bias_grad import bias_grad_fusion, bias_grad_inputs
from fuser.schedulers.common import registers
from fuser.schedulers.device import get_device
from fuser.schedulers.outer import _make, cost, math_per_element

BF16 = torch.bfloat16
FIXTURE = Path(__file__).parent / "fixtures" / "outer_gelu_h100.jsonl"
SHAPES = ["8192x768", "8192x3072", "16384x3072", "32768x3072"]


def _kernel(form: str, shape: str, backend: str = "triton"):  # noqa: ANN202
    m, n = (int(x) for x in shape.split("x"))
    ins = [torch.empty(m, n, dtype=BF16, device="meta")] * bias_grad_inputs(form)
    (k,) = bias_grad_fusion(form, BF16).compile(ins, device="h100", backend=backend)
    return k


def _measured(shape: str) -> dict[str, float]:
    """schedule -> ms at `shape`: the confirm median where re-timed, else the quick time."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    out: dict[str, float] = {}
    for r in sorted(rows, key=lambda r: r["impl"].startswith("confirm")):
        if r["shape"] == shape:
            out[r["schedule"]] = r["ms"]
    return out


def _regret(shape: str) -> tuple[str, float]:
    timed = _measured(shape)
    mine = _kernel("gelu", shape).schedule.short()
    assert mine in timed, f"{shape}: {mine} is not within 10% of the fastest measured"
    return mine, timed[mine] / min(timed.values()) - 1


@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_pick_near_the_fastest_measured(shape: str) -> None:
    """The pick at each measured shape within 7% of the fastest of the ~150 schedules
    timed there (the old model's: 6.6-23.7%; the quick timings' noise is ~3-5%)."""
    mine, regret = _regret(shape)
    assert regret <= 0.07, f"{shape}: {mine} is {regret:.1%} slower than the fastest"


def test_gelu_median_regret() -> None:
    regrets = [_regret(shape)[1] for shape in SHAPES]
    assert statistics.median(regrets) <= 0.03, regrets


def test_math_per_element_counts_the_producer() -> None:
    """sm_90 SASS gave the plain column sum 7.6 instructions an element and the GELU
    backward 54.8 (benchmarks/outer_fit.py --sass); the estimate lands on both."""
    f32 = math_per_element(_kernel("f32", "8192x768").spec)
    gelu = math_per_element(_kernel("gelu", "8192x768").spec)
    assert f32 == pytest.approx(7.6) and gelu == pytest.approx(54.8)


def _cost(k, text: str, backend: str = "triton"):  # noqa: ANN001, ANN202
    """The model's cost of `k` under the schedule `text` (v tpr rpb split fin warps)."""
    v, tpr, rpb, split, fin, warps = (int(x) for x in text.split())
    s = _make(k.spec, v, tpr, warps, max(rpb * tpr // (warps * 32), 1), split, fin)
    return s, cost(k.spec, get_device("h100"), s, registers(k.spec, s, backend), backend)


def test_math_needs_warps_and_pays_for_padded_lanes() -> None:
    """The GELU backward at 8192x768: 4 blocks of 4 warps a SM issue its math slower than
    8; 1024-wide tiles over 768 columns issue a third more than 128-wide ones; the reasons
    print the math beside the memory."""
    k = _kernel("gelu", "8192x768")
    _, wide = _cost(k, "8 128 1 1056 8 4")
    _, narrow = _cost(k, "8 16 8 176 8 4")
    _, half = _cost(k, "8 16 8 88 8 4")  # 528 blocks: 4 a SM
    assert wide.warps == narrow.warps == 32 and half.warps == 16
    assert wide.math_us == pytest.approx(narrow.math_us * 1024 / 768, rel=0.05)
    assert half.issue < narrow.issue == 1.0 and half.math_us > narrow.math_us
    assert narrow.math_us > 0.8 * narrow.memory_us  # as much math as memory
    text = "\n".join(k.schedule.reasons)
    assert "55 instructions an element" in text and "overlapping memory" in text


def test_cuda_leaves_the_math_unpriced() -> None:
    """No CUDA kernel with a producer's math has been swept: its constants price none."""
    k = _kernel("gelu", "8192x768", "cuda")
    _, c = _cost(k, "8 16 8 176 8 4", "cuda")
    assert c.math_us == 0 and c.issue == 1.0
    assert "instructions an element" not in "\n".join(k.schedule.reasons)


# ptxas (sm_90, Triton 3.6) at 8 / 16 / 32 elements a thread, tpr128 4 warps, split
# (benchmarks/outer_fit.py --registers)
PTXAS = {"f32": (32, 35, 56), "gelu": (48, 80, 145)}


@pytest.mark.parametrize("form", sorted(PTXAS))
def test_triton_outer_registers_track_ptxas(form: str) -> None:
    """The estimate counts the producer's live temporaries: within 15 registers of ptxas
    (the GELU backward's base is ~14 high) and the same resident blocks of 4 warps, up to
    8, give or take one (the GELU backward at 32 elements was estimated 94 against ptxas
    145 before: 5 blocks where 3 fit)."""
    k = _kernel(form, "8192x3072")
    dev = get_device("h100")
    for rpb, real in zip((1, 2, 4), PTXAS[form]):
        s, _ = _cost(k, f"8 128 {rpb} 44 16 4")
        est = registers(k.spec, s, "triton")
        assert abs(est - real) <= 15, (rpb, est, real)
        # (8 blocks of 4 warps and more give the model's full issue rate)
        blocks = [min(dev.blocks_per_sm(128, r), 8) for r in (est, real)]
        assert abs(blocks[0] - blocks[1]) <= 1, (rpb, est, real)
