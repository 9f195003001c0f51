"""python -m fuser.opdb: op_db samples of every op fuser claims, compiled vs eager.

`--merge s0.json s1.json ...` adds up the JSON reports of sharded runs instead (and
writes them as one to --json). FUSER_BACKEND=cuda runs the fused regions on the CUDA
C++ backend."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

import torch

from fuser.config import config
from fuser.opdb import DEFAULT_DTYPES, OpReport, SampleResult, run, summary_text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuser.opdb", description=__doc__)
    p.add_argument("--ops", nargs="*", help="claimed ATen ops or OpInfo names (default: all)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--dtypes",
        default=",".join(str(d).removeprefix("torch.") for d in DEFAULT_DTYPES),
        help="comma-separated (default float32,float16,bfloat16)",
    )
    p.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="per op and dtype, spread over the sample list (first and last included)",
    )
    p.add_argument("--sample", type=int, default=None, help="only the sample of this index")
    p.add_argument("--shard", default="0/1", help="K/N: every N-th target from the K-th")
    p.add_argument("--json", default=None, help="write every sample's result here")
    p.add_argument("-v", "--verbose", action="store_true", help="print every sample")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="add up sharded runs' reports")
    a = p.parse_args(argv)
    if a.merge:
        return _merge(a.merge, a.json)
    dtypes = [getattr(torch, d.strip()) for d in a.dtypes.split(",") if d.strip()]
    t0 = time.perf_counter()

    def progress(r: OpReport) -> None:
        line = (
            f"{r.target:32} ran {r.ran:3}  passed {r.count('passed'):3}  "
            f"fallback {r.count('fallback'):3}  failed {r.count('failed'):3}"
        )
        print(line, flush=True)
        for s in r.samples:
            if a.verbose or s.status == "failed":
                print(f"    [{s.status}] {s.dtype} #{s.index} ({s.seconds:.1f}s): {s.detail}")
                if s.status == "failed":
                    print(f"      repro: {s.repro}")

    k, n = (int(x) for x in a.shard.split("/"))
    reports, orphans = run(a.ops, dtypes, a.device, a.max_samples, a.sample, progress, (k, n))
    print(summary_text(reports, orphans, time.perf_counter() - t0))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "device": a.device,
                    "backend": config.backend,
                    "dtypes": a.dtypes,
                    "max_samples": a.max_samples,
                    "torch": torch.__version__,
                    "no_opinfo": orphans,
                    "ops": [asdict(r) for r in reports],
                },
                f,
                indent=1,
            )
    return 1 if any(r.count("failed") for r in reports) else 0


def _merge(paths: list[str], out: str | None) -> int:
    """One report from the shards' JSON files: the summary printed, the whole written."""
    parts = [json.loads(open(path).read()) for path in paths]
    reports = [
        OpReport(r["target"], r["claims"], [SampleResult(**s) for s in r["samples"]])
        for part in parts
        for r in part["ops"]
    ]
    orphans = sorted({o for part in parts for o in part["no_opinfo"]})
    seconds = sum(s.seconds for r in reports for s in r.samples)
    backend = parts[0].get("backend", "triton")
    print(f"{len(paths)} shard(s), backend {backend} (time: the samples' own, summed)")
    print(summary_text(reports, orphans, seconds))
    if out:
        ops = [asdict(r) for r in reports]
        merged = {**parts[0], "shards": len(paths), "no_opinfo": orphans, "ops": ops}
        with open(out, "w") as f:
            json.dump(merged, f, indent=1)
    return 1 if any(r.count("failed") for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
