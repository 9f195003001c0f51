"""What the in-kernel target check of cross-entropy costs (issue 16): the same fusion with
and without check_index, timed in one process, rounds interleaved.

    python benchmarks/index_check_cost.py --out $OUT/index_check.jsonl

Each case is cross-entropy forward and backward over bf16 logits (the per-row loss and
dlogits in one fusion, as the bench's cross_entropy_fwd_bwd case) at V=50257. "checked"
passes the target through fd.ops.check_index first, as fuser's own lowering of
F.cross_entropy does; "unchecked" is the fusion without it. Beside them, in the same run:
`torch.compile(backend="fuser")` and Inductor on `F.cross_entropy(logits.float(), t)`
forward+backward, and eager. Timing: fuser.bench's protocol (median, L2 flushed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform

import torch
import torch.nn.functional as F

from fuser.bench.cases import cross_entropy_fusion
from fuser.bench.measure import bench_ms, copy_gbps


def fwd_bwd(fn):
    def run(x, t):
        x = x.detach().requires_grad_(True)
        loss = fn(x, t)
        return torch.autograd.grad(loss, x)[0]

    return run


def ce(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(x.float(), t)


def measure(rows: int, vocab: int, rounds: int, meta: dict, ceiling: float) -> list[dict]:
    """Every implementation at `rows` x `vocab`, checked against eager, then timed."""
    x = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, vocab, (rows,), device="cuda")
    impls = {}
    for backend in ("triton", "cuda"):
        for checked in (False, True):
            fd = cross_entropy_fusion(rows, torch.bfloat16, checked)
            impls[f"fuser-{backend}-{'checked' if checked else 'unchecked'}"] = (
                lambda fd=fd, backend=backend: fd.execute([x, t], backend=backend)
            )
    torch._dynamo.reset()
    compiled_fuser = torch.compile(fwd_bwd(ce), backend="fuser", dynamic=False)
    compiled_inductor = torch.compile(fwd_bwd(ce), dynamic=False)
    impls["compile-fuser"] = lambda: compiled_fuser(x, t)
    impls["compile-inductor"] = lambda: compiled_inductor(x, t)
    impls["eager"] = lambda: fwd_bwd(ce)(x, t)
    ref = fwd_bwd(ce)(x, t).float()  # correctness first: each dlogits against eager's
    for name, fn in impls.items():
        got = fn()
        dl = (got[1] if isinstance(got, list) else got).float()
        err = (dl - ref).abs().max().item()
        assert err <= 1e-2 / rows, (name, err)  # dlogits are at most 1/rows
    times: dict[str, list[float]] = {name: [] for name in impls}
    for _ in range(rounds):
        for name, fn in impls.items():
            times[name].append(bench_ms(fn))
    nbytes = 2 * rows * vocab * 2 + rows * 8
    out = []
    for name, ts in times.items():
        ms = sorted(ts)[len(ts) // 2]
        row = {
            **meta,
            "rows": rows,
            "vocab": vocab,
            "impl": name,
            "ms": round(ms, 4),
            "ms_rounds": [round(v, 4) for v in ts],
            "pct_of_copy": round(100 * nbytes / (ms * 1e-3) / 1e9 / ceiling, 1),
        }
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="8192,32768")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="index_check.jsonl")
    args = ap.parse_args()
    torch.manual_seed(0)
    ceiling = copy_gbps()
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "copy_gbps": round(ceiling, 1),
    }
    rows_out = []
    for rows in [int(r) for r in args.rows.split(",")]:
        rows_out += measure(rows, args.vocab, args.rounds, meta, ceiling)
    with open(args.out, "w") as f:
        for row in rows_out:
            f.write(json.dumps(row) + "\n")
    for rows in sorted({r["rows"] for r in rows_out}):
        by = {r["impl"]: r["ms"] for r in rows_out if r["rows"] == rows}
        for backend in ("triton", "cuda"):
            a, b = by[f"fuser-{backend}-unchecked"], by[f"fuser-{backend}-checked"]
            change = 100 * (b / a - 1)
            print(
                f"rows={rows} {backend}: unchecked {a:.4f} ms, checked {b:.4f} ms ({change:+.1f}%)"
            )


if __name__ == "__main__":
    main()
