"""Where the time of a cached `fd.execute` goes, per backend: the kernels on the GPU, the
Python on the host, and the host's hot functions.

    PYTHONPATH=. python benchmarks/profile_backends.py --out $OUT/profile.json

For the seed fusion (fp16, 8192 rows) at a few hidden sizes and each backend: the device
time of the kernels alone (torch.profiler, averaged over calls), the host time of one call
(the GPU not waited for), the do_bench median the suite reports, and a cProfile of the
host path (top functions by own time) written beside the JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fuser.bench.cases import seed_case  # noqa: E402
from fuser.bench.measure import bench_ms, host_overhead_us  # noqa: E402


def kernel_us(fn, calls: int = 50) -> float:
    """Mean device time per call of the kernels `fn` launches (memsets and copies too)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
    return total / calls


def host_profile(fn, calls: int = 2000) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    return s.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="768,2048,5140,12288")
    ap.add_argument("--rows", type=int, default=8192)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows_out, texts = [], []
    for h in [int(x) for x in args.sizes.split(",")]:
        case = seed_case(args.rows, h, torch.float16)
        ins = case.inputs("cuda")
        for backend in ("triton", "cuda"):

            def fn(case=case, ins=ins, backend=backend):
                return case.fuser(ins, backend)

            try:
                fn()
                torch.cuda.synchronize()
                row = {
                    "op": "ln_fused",
                    "shape": case.shape,
                    "backend": backend,
                    "kernel_us": kernel_us(fn),
                    "host_us": host_overhead_us(fn),
                    "bench_us": bench_ms(fn) * 1e3,
                    "bytes": case.nbytes,
                }
                row["kernel_gbps"] = case.nbytes / row["kernel_us"] / 1e3
                row["bench_gbps"] = case.nbytes / row["bench_us"] / 1e3
                if h == 768:
                    texts.append(f"== {backend} {case.shape}\n{host_profile(fn)}")
            except Exception as e:  # report and go on with the next
                row = {"op": "ln_fused", "shape": case.shape, "backend": backend, "error": repr(e)}
            print(json.dumps(row), flush=True)
            rows_out.append(row)
    args.out.write_text("\n".join(json.dumps(r) for r in rows_out) + "\n")
    args.out.with_suffix(".host.txt").write_text("\n".join(texts))


if __name__ == "__main__":
    main()
