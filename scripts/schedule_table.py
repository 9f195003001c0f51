"""Print the heuristic's schedule of every kernel of the bench ops at every size, per
backend, on a device preset (no GPU, nothing compiled): run it in two checkouts and diff
the outputs to list the schedules a change to the heuristics changes.

    python scripts/schedule_table.py --device h100 > after.txt
"""

from __future__ import annotations

import argparse

import torch

from fuser.bench.cases import OPS, SEED_SWEEP, make_cases

# the hidden-size sweep: every op of the bench at the seed sweep's sizes
SWEEP_OPS = ("ln_fused", "layernorm", "layernorm_fwd_bwd", "softmax", "cross_entropy_fwd_bwd")


def meta_inputs(case) -> list[list[torch.Tensor]]:  # noqa: ANN001 - a bench Case
    """Meta inputs of each of the case's fusions, from its input definitions and sizes."""
    out = []
    for fd in case.fusions:
        ins = []
        for v in fd.graph.inputs:
            shape = [
                case.rows if i == 0 and len(v.shape) == 2 else case.cols
                for i in range(len(v.shape))
            ]
            if (
                len(v.shape) == 1
                and fd.name in ("layernorm_bwd", "cross_entropy_fwd_bwd")
                and v.dtype.torch in (torch.float32, torch.int64)
            ):
                shape = [case.rows]
            ins.append(torch.empty(shape, dtype=v.dtype.torch, device="meta"))
        out.append(ins)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="h100")
    args = ap.parse_args()
    for op in OPS:
        hidden = SEED_SWEEP if op in SWEEP_OPS else None
        for case in make_cases([op], hidden, None, None):
            for backend in ("triton", "cuda"):
                for fd, ins in zip(case.fusions, meta_inputs(case)):
                    for k in fd.compile(ins, device=args.device, backend=backend):
                        s = k.schedule
                        where = f"{op} {case.shape} {case.dtype_name} {backend} {k.name}"
                        print(f"{where}: {s.short()} grid {s.grid}")


if __name__ == "__main__":
    main()
