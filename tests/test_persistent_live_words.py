"""The Triton persistent register estimate counts every form of the row live across a
reduction (registers.row_live_words): a cross-entropy row written as exp(x - max) / sum
keeps x and exp(x - max) across the exp-sum (2 words), softmax and LayerNorm one. Priced
at one word, the 16384 x 32000 bf16 cross-entropy took a 512-thread persistent plan that
ptxas (sm_90) compiled to 128 registers with 96 bytes spilled (benchmarks/row_sass.py);
its 1024-thread layout spills too (64-register cap), so the heuristic falls back to the
looped plan. fuser's own lowering (dynamo/ce_lower.py) computes the gradient from
x - max, defined after the target's logit: one word."""

from __future__ import annotations

import torch

from fuser.backends.registry import get_backend
from fuser.bench.cases import cross_entropy_fusion
from fuser.dynamo.ce_region import one_pass_fusion
from fuser.examples import seed_layernorm_fusion
from fuser.schedulers.device import get_device
from fuser.schedulers.heuristics import _persistent_candidates, vector_width
from fuser.schedulers.registers import row_live_words


def _ce_row_kernel(rows: int, cols: int, lowered: bool):
    x = torch.empty(rows, cols, dtype=torch.bfloat16, device="meta")
    t = torch.empty(rows, dtype=torch.int64, device="meta")
    fd = one_pass_fusion(x, t) if lowered else cross_entropy_fusion(rows, torch.bfloat16)
    kernels = fd.compile([x, t], device="h100", backend="triton")
    return max(kernels, key=lambda k: k.spec.cols * k.spec.rows)


def test_lowered_cross_entropy_keeps_one_word():
    assert row_live_words(_ce_row_kernel(16384, 32000, lowered=True).spec) == 1.0


def test_cross_entropy_row_keeps_two_words_and_loops_where_they_spill():
    k = _ce_row_kernel(16384, 32000, lowered=False)
    assert row_live_words(k.spec) == 2.0
    assert k.schedule.kind == "inner_looped", k.schedule.short()
    dev, be = get_device("h100"), get_backend("triton")
    v = vector_width(k.spec, [])
    wide = [c for c in _persistent_candidates(k.spec, dev, v, be) if c.threads_per_row == 1024]
    assert wide, "the 1024-thread layout is a candidate"
    # 32 elements a thread x 2 words + overhead: over the 64 registers of a 1024-thread block
    assert all(dev.blocks_per_sm(c.threads, c.registers) == 0 for c in wide)


def test_softmax_and_layernorm_rows_keep_one_word():
    fd = seed_layernorm_fusion()
    m = lambda *s: torch.empty(*s, dtype=torch.float16, device="meta")  # noqa: E731
    (ln,) = fd.compile([m(4096), m(512, 4096), m(4096), m(4096), m(4096)], device="h100")
    assert row_live_words(ln.spec) == 1.0
    assert ln.schedule.kind == "inner_persistent"
