"""`python -m fuser.fuzz.programs --seconds 600 --seed 1 [--json out.json]`: random
PyTorch programs through torch.compile(backend="fuser") against eager.

Programs are drawn from seeds seed*1e6, seed*1e6 + 1, ... until the time is up (or
`--count` programs ran); each is compiled with a strict FuserBackend (an unexpected error
while lowering raises instead of falling back to ATen), called three times, forward and
backward, and judged against eager (judge.py). Every failure prints its program, runnable
as it stands; `--replay SEED` runs one program again and prints it. A result aot_eager
gets as wrong is torch's bug and is listed apart ("as aot_eager"). Exits 1 on any
failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from fuser.config import config
from fuser.dynamo import FuserBackend
from fuser.fuzz.programs.generate import CPU, GPU, draw_program
from fuser.fuzz.programs.judge import judge


def _device(arg: str) -> str:
    if arg != "auto":
        return arg
    return "cuda" if torch.cuda.is_available() else "cpu"


def _seeds(args: argparse.Namespace, start: float) -> Iterator[int]:
    """The replayed seed, or seed * 1e6 + 0, 1, ... until the time or the count is up."""
    if args.replay is not None:
        yield args.replay
        return
    i = 0
    while time.perf_counter() - start <= args.seconds and not (args.count and i >= args.count):
        yield args.seed * 1_000_000 + i
        i += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fuser.fuzz.programs", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--seconds", type=float, default=600.0, help="time budget (default 600)")
    ap.add_argument(
        "--count", type=int, default=0, help="stop after this many programs (0: no limit)"
    )
    ap.add_argument("--seed", type=int, default=1, help="programs are drawn from seed*1e6 + i")
    ap.add_argument(
        "--device",
        default="auto",
        help="cuda, cpu or auto (cpu on a GPU host needs TRITON_INTERPRET=1 set beforehand)",
    )
    ap.add_argument("--backend", default=None, help="triton or cuda (default: FUSER_BACKEND's)")
    ap.add_argument("--amp", action="store_true", help="run under bf16 autocast")
    ap.add_argument("--dynamic", action="store_true", help="compile with symbolic sizes")
    ap.add_argument(
        "--lenient",
        action="store_true",
        help="a region that fails falls back to ATen with a warning, as by default for "
        "users (default: strict, an error; lenient already under --amp on a CPU)",
    )
    ap.add_argument("--sizes", choices=("cpu", "gpu"), help="dims drawn (default: device's)")
    ap.add_argument("--json", type=Path, help="write counts and failures here")
    ap.add_argument("--replay", type=int, help="run the program of this seed and print it")
    args = ap.parse_args(argv)

    device = _device(args.device)
    if args.backend:
        config.backend = args.backend
    # CPU autocast: ATen's CPU layer_norm returns float32 statistics where its meta (the
    # traced graph) says bfloat16, so a region fed by it meets another dtype than it was
    # planned for, and gives up to ATen with a warning; strict, that would be an error
    strict = not (args.lenient or (args.amp and device == "cpu"))
    sizes = GPU if (args.sizes or ("gpu" if device == "cuda" else "cpu")) == "gpu" else CPU
    torch._dynamo.config.cache_size_limit = 64
    start = time.perf_counter()
    counts: Counter = Counter()
    failures: list[dict] = []
    for seed in _seeds(args, start):
        program = draw_program(seed, sizes=sizes)
        if args.replay is not None:
            print(program.source)
        backend = FuserBackend(strict=strict)
        try:
            v = judge(program, backend, device, amp=args.amp, dynamic=args.dynamic)
        except Exception as e:  # noqa: BLE001  (the harness or eager failed: not fuser's)
            counts["harness error"] += 1
            print(f"seed {seed}: harness error {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            if args.replay is not None:
                traceback.print_exc()
            continue
        finally:
            torch._dynamo.reset()
        counts["programs"] += 1
        counts["fused regions"] += v.regions
        counts["ATen nodes"] += len(v.fallbacks)
        counts["resized"] += v.resized
        if v.ok:
            counts["passed"] += 1
            continue
        if v.as_aot_eager:  # torch's own bug: reported, not counted against fuser
            counts["as aot_eager"] += 1
            print(f"AS AOT_EAGER seed {seed}: {v.problem}\n  {v.detail}", flush=True)
            continue
        counts["failed"] += 1
        failures.append(  # the inputs too: a later generator draws another program
            dict(seed=seed, problem=v.problem, detail=v.detail, source=program.source,
                 inputs=[asdict(i) for i in program.inputs])
        )  # fmt: skip
        print(f"FAIL seed {seed}: {v.problem}\n  {v.detail}\n{program.source}", flush=True)
    elapsed = time.perf_counter() - start
    summary = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    mode = dict(device=device, backend=config.backend, amp=args.amp, dynamic=args.dynamic)
    mode["strict"] = strict
    mode["sizes"] = "gpu" if sizes is GPU else "cpu"
    print(f"{summary} in {elapsed:.0f} s ({', '.join(f'{k} {v}' for k, v in mode.items())})")
    if args.json:
        record = dict(counts=dict(counts), seconds=elapsed, seed=args.seed, **mode)
        record["failures"] = failures
        args.json.write_text(json.dumps(record, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
