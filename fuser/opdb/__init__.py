"""PyTorch's op_db through the fuser backend: every OpInfo sample of every op fuser claims,
compiled with torch.compile(backend=FuserBackend()) and compared with eager.

    python -m fuser.opdb                                   # everything, on CPU (interpreter)
    python -m fuser.opdb --ops add softmax --max-samples 3 --json out.json
    python -m fuser.opdb --device cuda                     # on a GPU
    python -m fuser.opdb --shard 0/4 --json s0.json        # a quarter of the targets

claims.py: the claimed ops (from the lowering tables) and the OpInfos that exercise them
(by name, or as the frontend op table, fuser/frontend/registry.py, lists them);
run.py: one sample compiled vs eager, counted as passed (a fused region ran and matched),
fallback (everything stayed ATen, with the reasons), failed (a wrong result or an error).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fuser.opdb.claims import Claim, Target, claimed_ops, targets
from fuser.opdb.run import OpReport, SampleResult, run_sample, run_target

DEFAULT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]

__all__ = [
    "DEFAULT_DTYPES",
    "Claim",
    "OpReport",
    "SampleResult",
    "Target",
    "claimed_ops",
    "run",
    "run_sample",
    "run_target",
    "summary_text",
    "targets",
]


def run(
    ops: list[str] | None = None,
    dtypes: list[torch.dtype] | None = None,
    device: str = "cpu",
    max_samples: int | None = None,
    only: int | None = None,
    progress: Callable[[OpReport], None] | None = None,
    shard: tuple[int, int] = (0, 1),
) -> tuple[list[OpReport], list[str]]:
    """Every target's report (of shard k of n: every n-th target from the k-th), and the
    claimed ops that no OpInfo exercises."""
    found, orphans = targets(ops)
    found = found[shard[0] :: shard[1]]
    reports = []
    for t in found:
        r = run_target(t, dtypes or DEFAULT_DTYPES, device, max_samples, only)
        reports.append(r)
        if progress is not None:
            progress(r)
    return reports, orphans


def summary_text(reports: list[OpReport], orphans: list[str], seconds: float) -> str:
    """The totals, the fallback reasons by count, and each failing target's first failure."""
    tot = {k: sum(r.count(k) for r in reports) for k in ("passed", "fallback", "failed")}
    ran = sum(r.ran for r in reports)
    lines = [
        f"op_db: {len(reports)} OpInfo targets, {ran} samples ran: {tot['passed']} passed "
        f"(fused), {tot['fallback']} fell back to ATen, {tot['failed']} failed "
        f"({seconds:.0f}s)",
        f"claimed ops without an OpInfo: {', '.join(orphans) or 'none'}",
    ]
    for r in reports:
        f = r.first_failure
        if f is not None:
            lines.append(f"FAILED {r.target} ({r.count('failed')}x): {f.detail.splitlines()[-1]}")
            lines.append(f"  repro: {f.repro}")
    return "\n".join(lines)
