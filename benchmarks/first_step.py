"""First-step time of GPT-2 training, cold and warm caches, beside aot_eager's (issue 19).

    PYTHONPATH=. python benchmarks/first_step.py --out $OUT/first_step.json

Runs benchmarks/gpt2_bench.py for aot_eager and for fuser (2 steps, no profiles, no check
pass), each in a new process, three times: cold (empty FUSER_CACHE_DIR and
TRITON_CACHE_DIR), then warm twice (the same folders, now filled). Extra arguments after
`--` go to gpt2_bench.py (e.g. `-- --batch 4`). Writes the
first steps side by side and fuser's own account of its first step (the "first step:"
lines of explain) for each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(tag: str, caches: Path, out_dir: Path, extra: list[str]) -> dict:
    env = {
        **os.environ,
        "FUSER_CACHE_DIR": str(caches / "fuser"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "PYTHONPATH": str(ROOT),
    }
    got = {}
    for impl in ("aot_eager", "fuser"):  # each in its own process: neither warms the other
        run_dir = out_dir / tag / impl
        run_dir.mkdir(parents=True, exist_ok=True)
        jsonl = run_dir / "gpt2.jsonl"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "gpt2_bench.py"), "--out", str(jsonl)]
        cmd += ["--impls", impl, "--steps", "2", "--warmup", "1"]
        cmd += ["--profile-steps", "0", "--check-steps", "0", *extra]
        subprocess.run(cmd, env=env, check=True)
        rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
        got.update({r["backend"]: r["first_step_s"] for r in rows if "first_step_s" in r})
    explain = out_dir / tag / "fuser" / "gpt2_fuser_explain.txt"
    lines = explain.read_text().splitlines() if explain.exists() else []
    keep = [
        ln
        for i, ln in enumerate(lines)
        if ln.startswith("first step:")
        or (i and lines[i - 1].startswith("first step:") and ln.startswith("  "))
        or ln.startswith("  kernels:")
        or ln.startswith("  slowest:")
    ]
    return {"first_step_s": got, "fuser_report": keep}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("extra", nargs="*", help="more gpt2_bench.py arguments (after --)")
    args = ap.parse_args(argv)
    out_dir = args.out.parent / "first_step_runs"
    with tempfile.TemporaryDirectory(prefix="fuser-first-step-") as tmp:
        caches = Path(tmp)
        result = {
            "cold": _run("cold", caches, out_dir, args.extra),
            "warm": _run("warm", caches, out_dir, args.extra),
            "warm2": _run("warm2", caches, out_dir, args.extra),
        }
    for tag in ("cold", "warm", "warm2"):
        f = result[tag]["first_step_s"]
        if "fuser" in f and "aot_eager" in f:
            result[tag]["fuser_minus_aot_eager_s"] = f["fuser"] - f["aot_eager"]
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
