"""sm_90 registers and spills of the row kernels session 11's heuristics choose between,
compiled offline (no GPU): the register figures quoted in fuser/schedulers/heuristics.py
and registers.py come from here.

    PYTHONPATH=. python benchmarks/row_sass.py > benchmarks/results/<dir>/row_sass.txt

Rows: fuser's chosen plan for each case; for the 32000-wide cross-entropy, also the
512-thread persistent plan the heuristic chose before (in the bench's hand-built form,
exp(x - max) / sum with the target summed after the exp-sum, and in fuser's lowering).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0")  # render the GPU's source, not the interpreter's

import torch

from fuser import FusionDefinition
from fuser.backends.registry import get_backend
from fuser.bench.cases import cross_entropy_fusion
from fuser.dynamo.ce_region import one_pass_fusion
from fuser.runtime.executor import render_kernel
from fuser.runtime.resources import many_resources
from fuser.schedulers.device import get_device
from fuser.schedulers.heuristics import _inner_schedule, _persistent_candidates, vector_width

BF16 = torch.bfloat16


def row_kernel(fd: FusionDefinition, ins: list[torch.Tensor]):  # noqa: ANN201
    return max(fd.compile(ins, "h100", "triton"), key=lambda k: k.spec.cols * k.spec.rows)


def ce(  # noqa: ANN201
    rows: int, cols: int, stride: int, lowered: bool, same: bool = False, dtype=BF16
):
    """`same`: the lowered gradient in the logits' layout (logits that are a graph input),
    else 16-byte aligned rows; the bench form's gradient is contiguous."""
    x = torch.empty_strided((rows, cols), (stride, 1), dtype=dtype, device="meta")
    t = torch.empty(rows, dtype=torch.int64, device="meta")
    fd = one_pass_fusion(x, t, aligned=not same) if lowered else cross_entropy_fusion(rows, dtype)
    return row_kernel(fd, [x, t])


def softmax(rows: int, cols: int, dtype: torch.dtype):  # noqa: ANN201
    with FusionDefinition("softmax") as fd:
        fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], dtype), dim=-1))
    return row_kernel(fd, [torch.empty(rows, cols, dtype=dtype, device="meta")])


def persistent_512(k):  # noqa: ANN001, ANN201
    """Kernel `k`'s row as the 512-thread persistent plan."""
    dev, be = get_device("h100"), get_backend("triton")
    v = vector_width(k.spec, [])
    cands = [c for c in _persistent_candidates(k.spec, dev, v, be) if c.threads_per_row == 512]
    c = min(cands, key=lambda c: c.rows_per_block)  # one row a block, as it was chosen
    return render_kernel(k.spec, _inner_schedule(k.spec, dev, v, c, [], be), "triton")


def main() -> None:
    cases = [
        ("CE 16384x32000 lowered, chosen", ce(16384, 32000, 32000, True)),
        ("CE 16384x50257 rows of 50304, chosen", ce(16384, 50257, 50304, True)),
        ("CE 8192x50257 contiguous, chosen", ce(8192, 50257, 50257, True)),
        ("softmax bf16 8192x50257, chosen", softmax(8192, 50257, BF16)),
        ("softmax bf16 8192x32000, chosen", softmax(8192, 32000, BF16)),
        # the Triton aligned-start walk (session 17)
        (
            "CE 8192x50257 lowered, gradient as the logits, chosen",
            ce(8192, 50257, 50257, True, True),
        ),
        (
            "CE 8192x32001 lowered, gradient as the logits, chosen",
            ce(8192, 32001, 32001, True, True),
        ),
        ("CE 8192x50257 bench form bf16, chosen", ce(8192, 50257, 50257, False)),
        (
            "CE 8192x50257 bench form fp32, chosen",
            ce(8192, 50257, 50257, False, dtype=torch.float32),
        ),
        ("softmax bf16 8192x32001, chosen", softmax(8192, 32001, BF16)),
        ("softmax bf16 8192x20001, chosen", softmax(8192, 20001, BF16)),
    ]
    cases += [
        (
            "CE 16384x32000 bench form, persistent 512",
            persistent_512(ce(16384, 32000, 32000, False)),
        ),
        ("CE 16384x32000 lowered, persistent 512", persistent_512(ce(16384, 32000, 32000, True))),
    ]
    res = many_resources([k for _, k in cases])
    print("sm_90, ptxas through Triton 3.6.0 (offline, no GPU); fuser's register estimate beside")
    print("| case | plan | estimate | registers | spill bytes |")
    print("|---|---|---|---|---|")
    for (name, k), r in zip(cases, res):
        est = get_backend("triton").estimate(k.plan)
        print(f"| {name} | {k.schedule.short()} | {est} | {r['registers']} | {r['spill_bytes']} |")


if __name__ == "__main__":
    main()
