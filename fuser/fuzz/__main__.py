"""`python -m fuser.fuzz --seconds 600 --seed 1 [--json out.json]`: fuzz fuser for a while.

Runs hypothesis batches of random fusions (and, one case in ten where Triton is among the
backends, a matmul with pointwise work around it through the GEMM template: fuzz/gemm.py)
against ATen until the time is up, on the GPU if there is one (else in Triton's CPU
interpreter, with smaller sizes), in `--workers` processes that share one kernel cache
folder. Each case runs on one of `--backends`
(auto: Triton and CUDA C++ on a GPU where NVRTC is installed, Triton on the CPU; "cuda"
on the CPU runs the g++ emulator, slowly). Prints the number of fusions, the seeds
and every failure as a runnable repro; exits 1 on any mismatch or error (2 when only
the generator itself failed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import fuser
from fuser.config import config
from fuser.errors import FuserError
from fuser.fuzz.generator import CPU, GPU, PATTERNS
from fuser.fuzz.runner import Stats, profile_for, run_batch, run_for
from fuser.runtime import cuda_backend

WORKER_BATCHES = 100_000  # batch numbers per worker: worker i starts at i * this


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fuser.fuzz", description=__doc__)
    p.add_argument("--seconds", type=float, default=600.0, help="time budget (default 600)")
    p.add_argument("--seed", type=int, default=0, help="batch seeds are seed*1e6 + batch")
    p.add_argument("--json", type=Path, help="write counts, seeds and failures here")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default)")
    p.add_argument("--profile", choices=("cpu", "gpu"), help="size limits (default: device's)")
    p.add_argument(
        "--focus",
        choices=PATTERNS[1:],
        help="draw this pattern (generator.py) as often as all the others together",
    )
    p.add_argument("--workers", default="auto", help="processes (auto: 8 on a GPU, 1 on CPU)")
    p.add_argument("--backends", default="auto", help="triton,cuda or auto (default)")
    p.add_argument("--batch-size", type=int, help="cases per hypothesis batch")
    p.add_argument("--shrink-seconds", type=float, default=90.0, help="per failure")
    p.add_argument("--replay", type=int, help="rerun one batch seed (see the JSON) and stop")
    p.add_argument("--first-batch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _backends(name: str, device: str) -> tuple[str, ...]:
    """The backends cases are drawn from; "cuda" on the CPU turns the g++ emulator on."""
    if name == "auto":
        if not device.startswith("cuda"):
            return ("triton",)
        try:
            cuda_backend.nvrtc_version()
        except FuserError as e:
            print(f"[fuzz] Triton only: {e}", file=sys.stderr)
            return ("triton",)
        return ("triton", "cuda")
    backends = tuple(b.strip() for b in name.split(",") if b.strip())
    unknown = [b for b in backends if b not in ("triton", "cuda")]
    if unknown or not backends:
        raise SystemExit(f"--backends: expected triton and/or cuda, got {name!r}")
    if "cuda" in backends:
        if device.startswith("cuda"):
            cuda_backend.nvrtc_version()  # raises, naming what to install
        elif shutil.which("g++") is None:
            raise SystemExit("--backends cuda on the CPU needs g++ (the CUDA emulator)")
        else:
            cuda_backend.EMULATE_ON_CPU = True
    return backends


def _header(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import triton

    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return {
        "device": device,
        "gpu": gpu,
        "profile": args.profile or ("gpu" if device.startswith("cuda") else "cpu"),
        "versions": {
            "fuser": fuser.__version__,
            "torch": torch.__version__,
            "triton": triton.__version__,
        },
        "seed": args.seed,
        "focus": args.focus,
        "backends": list(args.backend_list),
        "budget_seconds": args.seconds,
        "cache_dir": str(config.cache_dir),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _write(path: Path | None, report: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, path)


def _single(args: argparse.Namespace, device: str) -> dict[str, Any]:
    profile = {"cpu": CPU, "gpu": GPU}.get(args.profile or "")
    if args.focus:
        profile = replace(profile or profile_for(device), focus=args.focus)
    header = _header(args, device)
    batch_size = args.batch_size or (50 if device.startswith("cuda") else 10)
    header["batch_size"] = batch_size

    def report(stats: Stats) -> dict[str, Any]:
        return {**header, "workers": 1, **stats.to_json()}

    def progress(stats: Stats) -> None:
        _write(args.json, report(stats))
        if not args.quiet:
            print(
                f"[fuzz] {stats.fusions} fusions, {len(stats.failures)} failure(s), "
                f"{stats.seconds:.0f}s",
                file=sys.stderr,
                flush=True,
            )

    if args.replay is not None:
        stats, start = Stats(), time.monotonic()
        run_batch(
            args.replay,
            batch_size,
            stats,
            device,
            profile,
            shrink_seconds=1e9,
            runs=2 if device.startswith("cuda") else 1,
            backends=args.backend_list,
        )
        stats.seconds = time.monotonic() - start
    else:
        stats = run_for(
            args.seconds,
            args.seed,
            device,
            batch_size,
            on_batch=progress,
            shrink_seconds=args.shrink_seconds,
            first_batch=args.first_batch,
            profile=profile,
            backends=args.backend_list,
        )
    out = report(stats)
    _write(args.json, out)
    return out


PARTIAL_EVERY_S = 30.0  # the merged report is rewritten this often while workers run


def _parallel(args: argparse.Namespace, device: str, workers: int, folder: Path) -> dict[str, Any]:
    """`workers` processes of the single mode, one kernel cache folder, merged reports.

    A worker whose GPU context died (a kernel faulted) stops after recording the case;
    a fresh worker takes its place while at least 30 s of the budget remain.
    """
    env = dict(os.environ)
    env.setdefault("FUSER_CACHE_DIR", str(folder / "cache"))
    end = time.monotonic() + args.seconds
    deadline = end + args.shrink_seconds + 120

    def spawn(w: int, seconds: float) -> subprocess.Popen:
        cmd = [
            sys.executable, "-m", "fuser.fuzz", "--workers", "1", "--quiet",
            "--seconds", f"{seconds:.0f}", "--seed", str(args.seed), "--device", device,
            "--shrink-seconds", str(args.shrink_seconds), "--json", str(folder / f"w{w}.json"),
            "--first-batch", str(w * WORKER_BATCHES), "--backends", ",".join(args.backend_list),
        ]  # fmt: skip
        if args.batch_size:
            cmd += ["--batch-size", str(args.batch_size)]
        if args.profile:
            cmd += ["--profile", args.profile]
        if args.focus:
            cmd += ["--focus", args.focus]
        return subprocess.Popen(cmd, env=env)

    running = {w: spawn(w, args.seconds) for w in range(workers)}
    codes: dict[int, int] = {}
    spawned = workers
    last_write = time.monotonic()
    while running:
        time.sleep(0.5)
        if args.json and time.monotonic() - last_write > PARTIAL_EVERY_S:
            # what the workers wrote so far: a run cut off from outside keeps its counts
            parts = [_read(folder / f"w{w}.json") for w in range(spawned)]
            partial = _merge(args, device, parts, [codes.get(w, -1) for w in range(spawned)])
            _write(args.json, {**partial, "partial": True})
            last_write = time.monotonic()
        for w, p in list(running.items()):
            if time.monotonic() > deadline and p.poll() is None:
                p.kill()  # stuck past its budget (a hung kernel?): keep what it wrote
            code = p.poll()
            if code is None:
                continue
            codes[w] = code
            del running[w]
            part = _read(folder / f"w{w}.json")
            left = end - time.monotonic()
            if part and part.get("cuda_lost") and left > 30:
                running[spawned] = spawn(spawned, left)
                spawned += 1
    parts = [_read(folder / f"w{w}.json") for w in range(spawned)]
    merged = _merge(args, device, parts, [codes.get(w, -1) for w in range(spawned)])
    merged["cache_dir"] = env["FUSER_CACHE_DIR"]
    _write(args.json, merged)
    return merged


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _merge(
    args: argparse.Namespace, device: str, parts: list[dict | None], codes: list[int]
) -> dict[str, Any]:
    out: dict[str, Any] = {**_header(args, device), "workers": len(parts)}
    out["worker_exit_codes"] = codes
    out["lost_workers"] = [i for i, p in enumerate(parts) if p is None]
    out["cuda_lost_workers"] = [i for i, p in enumerate(parts) if p and p.get("cuda_lost")]
    counts = ("fusions", "shrink_runs", "invalid", "fallback_segments", "mismatches", "errors")
    for key in (*counts, "out_of_memory"):
        out[key] = sum(p.get(key, 0) for p in parts if p)
    for key in ("batches", "failures", "invalid_examples"):
        out[key] = [x for p in parts if p for x in p[key]]
    for key in ("kinds", "known", "per_backend"):
        total: Counter = Counter()
        for p in parts:
            if p:
                total.update(p.get(key, {}))
        out[key] = dict(total)
    out["seconds"] = max((p["seconds"] for p in parts if p), default=0.0)
    out["batch_size"] = next((p["batch_size"] for p in parts if p), None)
    return out


def _print(report: dict[str, Any]) -> None:
    seeds = [b["seed"] for b in report["batches"]]
    print(
        f"fuser fuzz on {report['device']} ({report.get('gpu') or _cpu_runners(report)}), "
        f"{report['workers']} worker(s), {report['seconds']:.0f}s: "
        f"{report['fusions']} fusions checked (+{report['shrink_runs']} while shrinking), "
        f"{report['mismatches']} mismatch(es), {report['errors']} error(s), "
        f"{report.get('out_of_memory', 0)} skipped (GPU memory taken by other workers), "
        f"{report['invalid']} generator failure(s)"
    )
    print(f"seed {report['seed']}: {len(seeds)} batches, batch seeds {_ranges(seeds)}")
    print(f"fusions per backend: {report.get('per_backend', {})}")
    print(f"schedules: {report['kinds']}; ATen fallback segments: {report['fallback_segments']}")
    if report["known"]:
        print(f"known bugs seen (xfailed in tests/test_fuzz_found_*.py): {report['known']}")
    for ex in report.get("invalid_examples", []):
        print(f"generator failure (a fuzzer bug): {ex[:1500]}")
    for f in report["failures"]:
        print(f"\n=== {f['kind']} in batch seed {f['batch_seed']}: {f['summary']}")
        print(f["message"])
        print(f["repro"])
        print(
            f"# replay: python -m fuser.fuzz --replay {f['batch_seed']} "
            f"--device {report['device']} --profile {report['profile']} "
            f"--batch-size {report['batch_size']} "
            f"--backends {','.join(report.get('backends') or ['triton'])}"
            + (f" --focus {report['focus']}" if report.get("focus") else "")
        )


def _cpu_runners(report: dict[str, Any]) -> str:
    names = {"triton": "Triton interpreter", "cuda": "CUDA emulator"}
    return ", ".join(names[b] for b in report.get("backends") or ["triton"])


def _ranges(seeds: list[int]) -> str:
    out, seeds = [], sorted(seeds)
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        out.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ", ".join(out) or "none"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    device = _device(args.device)
    # settings this run changes, restored for a caller that goes on in this process
    emulate, cache_dir = cuda_backend.EMULATE_ON_CPU, config.cache_dir
    args.backend_list = _backends(args.backends, device)
    scratch = Path(tempfile.mkdtemp(prefix="fuser_fuzz_"))  # removed at the end
    if "FUSER_CACHE_DIR" not in os.environ:  # keep the user's cache clean
        config.cache_dir = scratch / "cache"
    if args.workers == "auto":
        workers = min(8, max(1, (os.cpu_count() or 2) // 2)) if device.startswith("cuda") else 1
    else:
        workers = int(args.workers)
    try:
        if workers > 1 and args.replay is None:
            report = _parallel(args, device, workers, scratch)
        else:
            report = _single(args, device)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        cuda_backend.EMULATE_ON_CPU, config.cache_dir = emulate, cache_dir
    if not args.quiet:
        _print(report)
    if report["mismatches"] or report["errors"]:
        return 1
    return 2 if report["invalid"] else 0  # the generator itself failed: a fuzzer bug


if __name__ == "__main__":
    sys.exit(main())
