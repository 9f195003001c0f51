"""fuser-bench: measure fuser's kernels against eager and torch.compile over hidden sizes.

Each case is checked against eager first (a wrong kernel is reported, not timed), then
timed as the median of triton.testing.do_bench with the L2 flushed between repeats.
GB/s uses the minimal bytes (inputs read once, outputs written once); the ceiling is a
1 GiB device-to-device copy measured in the same run. --sweep times every schedule in
the scheduler's space and reports the heuristic's regret, time(heuristic)/time(best) - 1.

examples:
  python -m fuser.bench                                  # the full default suite
  python -m fuser.bench --ops ln_fused --hidden 1024:8192:1024 --sweep
  python -m fuser.bench --cpu-smoke                      # no GPU: correctness only
  python -m fuser.bench --out benchmarks/results/h100-$(date +%F)   # keep the results
  python -m fuser.bench --suite training --help          # issue 20's training kernels
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fuser.bench.cases import OPS
from fuser.bench.report import header, line, plot, regret, regret_summary, write_jsonl
from fuser.bench.run import Options, run
from fuser.bench.training_run import main as training_main
from fuser.config import config


def _sizes(text: str) -> list[int]:
    """'768,1024' or 'start:stop:step' (stop included)."""
    if ":" in text:
        a, b, *c = (int(x) for x in text.split(":"))
        return list(range(a, b + 1, c[0] if c else 256))
    return [int(x) for x in text.split(",") if x]


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fuser-bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "--suite",
        choices=["kernels", "training"],
        default="kernels",
        help="kernels: hand-built fusions (this help); training: torch.compile of eager\n"
        "training functions beside eager, Inductor and Liger (--suite training --help)",
    )
    ap.add_argument(
        "--ops",
        type=_names,
        default=list(OPS),
        help="comma-separated ops (default: all):\n  " + ", ".join(OPS),
    )
    ap.add_argument(
        "--hidden",
        type=_sizes,
        default=None,
        help="hidden sizes: '768,1600' or 'start:stop:step' (default: each op's "
        "own; the seed sweep 768..20480 for ln_fused)",
    )
    ap.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows of every case (default: each op's own, 8192 mostly)",
    )
    ap.add_argument(
        "--dtype",
        choices=["fp16", "bf16", "fp32"],
        default=None,
        help="dtype of every case (default: each op's own)",
    )
    ap.add_argument(
        "--backends",
        type=_names,
        default=["triton"],
        help="fuser backends to run: triton, cuda (default: triton)",
    )
    ap.add_argument(
        "--baselines",
        type=_names,
        default=["eager", "compile", "liger"],
        help="eager, compile (torch.compile), liger (when installed)",
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="time every legal schedule and report the heuristic's regret",
    )
    ap.add_argument(
        "--sweep-ops",
        type=_names,
        default=["ln_fused"],
        help="ops to sweep when --sweep is given (default: ln_fused)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=8,
        help="processes that compile sweep candidates in parallel (default 8)",
    )
    ap.add_argument("--quick", action="store_true", help="fewer timing repeats")
    ap.add_argument(
        "--flush",
        choices=["read", "zero"],
        default="read",
        help="how the L2 is flushed before each timed repeat: 'read' sums a 256 MB buffer "
        "(default); 'zero' writes it, as triton.testing.do_bench does, which leaves dirty "
        "lines whose write-back slows the timed kernel (~10 us on an H100)",
    )
    ap.add_argument(
        "--no-resources",
        action="store_true",
        help="skip reading registers/spills from the compiled kernels",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for results.jsonl, regret.jsonl and the plots (default: "
        "bench/latest in fuser's cache folder, ~/.cache/fuser/bench/latest; printed)",
    )
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="no GPU needed: tiny shapes through Triton's interpreter, "
        "correctness only (what CI runs)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    suite = argparse.ArgumentParser(add_help=False)
    suite.add_argument("--suite", default="kernels")
    if suite.parse_known_args(argv)[0].suite == "training":
        return training_main(argv)
    args = parser().parse_args(argv)
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print(
            "fuser-bench: no CUDA GPU here; timing needs one. "
            "Use --cpu-smoke for a correctness-only pass through Triton's interpreter."
        )
        return 2
    opts = Options(
        ops=args.ops,
        hidden=args.hidden or ([48, 100] if smoke else None),
        rows=args.rows or (3 if smoke else None),
        dtype=args.dtype,
        backends=args.backends,
        baselines=args.baselines,
        sweep=args.sweep,
        sweep_ops=args.sweep_ops,
        jobs=1 if smoke else args.jobs,
        quick=args.quick,
        flush=args.flush,
        smoke=smoke,
        resources=not args.no_resources,
    )
    rows: list[dict] = []
    # not the current folder: a smoke run in a checkout would leave results in it
    out = args.out or config.cache_dir / "bench" / "latest"
    out.mkdir(parents=True, exist_ok=True)
    print(f"results -> {out}", flush=True)
    partial = out / "results.partial.jsonl"  # grows as measurements come in
    partial.unlink(missing_ok=True)

    def emit(r: dict) -> None:
        if not rows:
            print(header(), flush=True)
        rows.append(r)
        print(line(r), flush=True)
        with open(partial, "a") as f:
            f.write(json.dumps(r) + "\n")

    run(opts, emit)
    write_jsonl(rows, out / "results.jsonl")
    partial.unlink(missing_ok=True)
    reg = regret(rows)
    if reg:
        write_jsonl(reg, out / "regret.jsonl")
        print(regret_summary(reg))
    for p in plot(rows, out):
        print(f"plot: {p}")
    bad = [r for r in rows if r["impl"].startswith("fuser-") and r.get("error")]
    bad += [r for r in rows if r["impl"].startswith("sweep-") and r.get("error")]
    for r in bad:
        print(f"FAILED {r['op']} {r['shape']} {r['impl']} {r.get('schedule', '')}: {r['error']}")
    print(f"{len(rows)} measurements -> {out / 'results.jsonl'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
