"""python -m fuser.profile: where the milliseconds of a training step go, fuser vs Inductor.

    python -m fuser.profile                                  # GPT-2 124M, B=16, T=1024 (GPU)
    python -m fuser.profile --compare inductor --out DIR     # + Inductor, lined up; files
    python -m fuser.profile --model llama-125m --batch 8 --compare inductor
    python -m fuser.profile --load DIR/run-fuser.json.gz DIR/run-inductor.json.gz
    python -m fuser.profile --model gpt2-tiny                # a CPU: structure, no timing

Writes to --out: profile-<backend>.json (machines), table-<backend>.txt and
comparison.txt (people), step-budget.png (stacked bars) and run-<backend>.json.gz (the
profiled steps' traces, trimmed to what the report reads, for --load). On a GPU the step
reported is the median of --steps profiled steps; see fuser/profile/capture.py for how.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import sys
from pathlib import Path

import torch

from fuser.bench.measure import copy_gbps
from fuser.dynamo import CAPTURES
from fuser.profile.capture import Capture, capture, environment
from fuser.profile.compare import compare
from fuser.profile.models import BACKENDS, MODELS, PARAM_DTYPES, training_step
from fuser.profile.profiler import build, load_run, save_run, used_regions, write
from fuser.profile.regions import region_table


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m fuser.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cuda = torch.cuda.is_available()
    ap.add_argument("--model", default="gpt2" if cuda else "gpt2-tiny", choices=MODELS)
    ap.add_argument(
        "--batch",
        type=int,
        default=None,
        help="batch size (default 16 on a GPU, 2 on a CPU; a suite: model's own batch)",
    )
    ap.add_argument(
        "--seq",
        type=int,
        default=None,
        help="sequence length (default 1024 on a GPU, 8 on a CPU; a suite: model's own)",
    )
    ap.add_argument("--backend", default="fuser", choices=BACKENDS)
    ap.add_argument("--compare", default=None, choices=BACKENDS, help="a second backend")
    ap.add_argument(
        "--param-dtype",
        default="fp32",
        choices=PARAM_DTYPES,
        help="bf16: parameters in bf16 (pure-bf16 training; what FSDP2's mixed precision "
        "hands each compiled block)",
    )
    ap.add_argument("--steps", type=int, default=5, help="profiled steps (the median reported)")
    ap.add_argument("--warmup", type=int, default=8, help="steps before (the first compiles)")
    ap.add_argument("--timed", type=int, default=10, help="unprofiled steps, before and after")
    ap.add_argument("--top", type=int, default=30, help="kernel rows printed (0: all)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the files")
    ap.add_argument("--load", type=Path, nargs="+", help="saved runs to analyse again")
    ap.add_argument("--save-steps", type=int, default=None, help="steps kept in run-* (all)")
    ap.add_argument("--raw", type=Path, default=None, help="also dump the untrimmed traces")
    return ap.parse_args(argv)


def _run(args: argparse.Namespace) -> list:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    env = environment()
    copy = None
    if cuda:
        copy = copy_gbps()
        print(f"copy ceiling: {copy:.0f} GB/s", flush=True)
    results = []
    for backend in [args.backend] + ([args.compare] if args.compare else []):
        step, title = training_step(
            args.model, backend, args.batch, args.seq, device, param_dtype=args.param_dtype
        )
        print(f"[{backend}] {title}", flush=True)
        cap = capture(
            step, backend, steps=args.steps, warmup=args.warmup, timed=args.timed,
            captures=CAPTURES,
        )  # fmt: skip
        regions = used_regions(region_table(CAPTURES), cap)
        prof = build(cap, regions, env=env, copy_gbps=copy, title=title)
        print(prof.table(top=args.top or None), flush=True)
        if args.out is not None:
            path = args.out / f"run-{backend}.json.gz"
            save_run(cap, regions, env, copy, path, title, keep=args.save_steps)
        if args.raw is not None:
            _dump_raw(cap, args.raw, backend)
        results.append(prof)
        del step, cap
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return results


def _dump_raw(cap: Capture, folder: Path, backend: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for kind, p in (("timing", cap.timing), ("attributes", cap.attributes)):
        if p is not None:
            data = {"windows": p.windows, "step_ms": p.step_ms, "trace": p.trace}
            with gzip.open(folder / f"raw-{backend}-{kind}.json.gz", "wt") as f:
                json.dump(data, f)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.load:
        results = [load_run(p) for p in args.load]
        for p in results:
            print(p.table(top=args.top or None))
    else:
        results = _run(args)
    result = compare(results[0], results[1]) if len(results) >= 2 else results[0]
    if len(results) >= 2:
        print("\n" + result.table())
    if args.out is not None:
        write(result, args.out)
        print(f"\nwrote {args.out}/", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
