"""GPT-2 training step: eager vs torch.compile (Inductor) vs torch.compile(backend="fuser").

    PYTHONPATH=. python benchmarks/gpt2_bench.py --out $OUT/gpt2.jsonl

One process, the same random initial weights and the same random token batches for every
implementation: GPT-2 124M, B=16, T=1024, bf16 autocast, fused AdamW. For each: the loss of
every step (parity with eager, step by step), ms/step (median after the warm-up steps),
tokens/s, peak memory, the first step's time (compilation included) and the number of
Dynamo graphs and recompilations. JSON lines go to --out as each implementation finishes;
beside it: fuser's explain report (full and brief), a CUDA profile of a few steps per
implementation, and a check pass (each fused region also run in ATen and compared, on real
GPU data; gpt2_fuser_check.txt).

`--impls eager,inductor,fuser,fuser-old` adds fuser without its call programs (each graph
run the old way: the FX graph interpreted, a module call per fused region), for an A/B of
the call program in the same process. `fuser-cg` is fuser with options={"cudagraphs": True}
(torch's cudagraph trees, as `inductor-ro` is Inductor's mode="reduce-overhead"):

    PYTHONPATH=. python benchmarks/gpt2_bench.py --batch 4 \
        --impls eager,eager2,inductor,inductor-ro,fuser,fuser-cg --out $OUT/gpt2_b4.jsonl

`eager2` runs eager a second time: the summary then also judges each implementation
against eager's own drift between two runs (`<impl>_loss_parity_vs_eager_noise`,
noise_bounds), for runs that train into a chaotic regime (B=4), where every backend,
Inductor included, leaves the fixed tolerance after ~15 steps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fuser  # noqa: E402,F401  (registers the backend)
from examples.train_gpt2 import (  # noqa: E402
    RunResult,
    fresh_model,
    make_batches,
    run_training,
    summary,
)
from fuser.config import config as fuser_config  # noqa: E402
from fuser.examples.gpt2 import get_config  # noqa: E402

LOSS_TOL = 0.05  # absolute: bf16 keeps ~3 significant digits of a loss near 10


def environment() -> dict[str, Any]:
    import triton

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    return {
        "device": dev,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fuser": fuser.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _steps(kept: dict, batch: tuple, steps: int) -> None:
    """`steps` more training steps of an already compiled model (run_training's `keep`)."""
    model, opt = kept["model"], kept["opt"]
    for _ in range(steps):
        if kept.get("cudagraph_steps"):  # inductor-ro: a new step for its CUDA graphs
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=kept["amp"]):
            _, loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def profile(kept: dict, name: str, batch: tuple, steps: int, path: Path) -> None:
    """A CUDA profile of `steps` more training steps of an already compiled model."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_available() and batch[0].is_cuda
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=acts) as prof:
        _steps(kept, batch, steps)
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    table = ""
    keys = ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",)
    for key in keys:
        try:
            table = events.table(sort_by=key, row_limit=70, max_name_column_width=100)
            break
        except Exception:  # the sort key's name changed across torch versions
            continue
    path.write_text(f"{name}: {steps} steps\n{table}\n")


def host_profile(kept: dict, name: str, batch: tuple, steps: int, path: Path) -> None:
    """Where the host's time goes in `steps` more training steps (cProfile, by own time)."""
    import cProfile
    import io
    import pstats

    cuda = torch.cuda.is_available() and batch[0].is_cuda
    if cuda:
        torch.cuda.synchronize()
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    _steps(kept, batch, steps)
    pr.disable()
    host = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(pr, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    head = f"{name}: {steps} steps, {host / steps * 1e3:.1f} ms of host time per step"
    path.write_text(f"{head}\n{out.getvalue()}")


def run_impl(impl: str, args: argparse.Namespace, batches: list, out_dir: Path) -> RunResult:
    """One implementation's run; "fuser-old" is fuser with config.call_program off (the
    graphs run the old way: fuser/dynamo/program/), its profiles included."""
    program = fuser_config.call_program
    fuser_config.call_program = program and impl != "fuser-old"
    try:
        return _run_impl(impl, args, batches, out_dir)
    finally:
        fuser_config.call_program = program


def _run_impl(impl: str, args: argparse.Namespace, batches: list, out_dir: Path) -> RunResult:
    torch._dynamo.reset()  # each implementation compiles from scratch, frees the last one's
    model = fresh_model(args.config, args.device, args.vocab, args.seed)
    kept: dict = {}
    t0 = time.perf_counter()
    try:
        res = run_training(
            model,
            {"fuser-old": "fuser", "eager2": "eager"}.get(impl, impl),
            batches,
            config=args.config,
            warmup=args.warmup,
            log=args.verbose,
            keep=kept,
        )
        res.backend = impl
    except Exception:
        res = RunResult(impl, args.config, args.batch, args.seq, args.steps, args.device, "bf16")
        res.error = traceback.format_exc()[-4000:]
        print(f"{impl} FAILED:\n{res.error}", flush=True)
        return res
    print(f"{summary(res)}  [{time.perf_counter() - t0:.0f} s]", flush=True)
    if impl in ("fuser", "fuser-cg"):
        text = fuser.explain(model)
        (out_dir / f"gpt2_{impl}_explain.txt").write_text(text + "\n")
        brief = fuser.explain(model, brief=True)
        (out_dir / f"gpt2_{impl}_explain_brief.txt").write_text(brief + "\n")
    for steps, kind, run in (
        (args.host_profile_steps, "host", host_profile),
        (args.profile_steps, "profile", profile),
    ):
        if not steps:
            continue
        try:
            run(kept, impl, batches[0], steps, out_dir / f"gpt2_{kind}_{impl}.txt")
        except Exception:
            print(f"{kind} profiling {impl} failed:\n{traceback.format_exc()[-2000:]}", flush=True)
    kept.clear()
    del model
    return res


def check_pass(args: argparse.Namespace, batches: list, out_dir: Path) -> dict[str, Any]:
    """Train `--check-steps` steps with every fused region also run in ATen and compared."""
    from fuser.dynamo import FuserBackend

    cuda = args.device.startswith("cuda")
    torch._dynamo.reset()
    model = fresh_model(args.config, args.device, args.vocab, args.seed)
    backend = FuserBackend(check=True)
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=cuda)
    for x, y in batches[: args.check_steps]:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            _, loss = compiled(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    regions = [r for c in backend.captures for g in c.graphs for r in g.regions]
    bad = [{"region": r.name, "ops": r.ops, "mismatch": m} for r in regions for m in r.mismatches]
    fell_back = [
        {"region": r.name, "ops": r.ops, "why": r.fallback}
        for r in regions
        if r.fallback is not None
    ]
    text = fuser.explain(backend)
    (out_dir / "gpt2_fuser_check.txt").write_text(text + "\n")
    return {"kind": "check", "regions": len(regions), "mismatches": bad, "fallbacks": fell_back}


def noise_bounds(eager: list[float], again: list[float]) -> list[float]:
    """Per step, the loss difference a compiled run is allowed against eager when eager
    itself, run again ("eager2": the same weights and batches, cuBLAS's and atomics'
    nondeterminism), drifts: twice eager's own largest drift so far, at least LOSS_TOL.
    A run that trains into a chaotic regime (GPT-2 B=4 from step ~15) diverges from
    eager whatever compiles it; this tells that from a wrong kernel."""
    out, worst = [], 0.0
    for a, b in zip(eager, again):
        worst = max(worst, abs(a - b))
        out.append(max(LOSS_TOL, 2 * worst))
    return out


def parity(results: dict[str, RunResult]) -> dict[str, Any]:
    ref = results.get("eager")
    out: dict[str, Any] = {"kind": "summary", "loss_tol": LOSS_TOL}
    again = results.get("eager2")
    bounds = None
    if ref is not None and again is not None and not ref.error and not again.error:
        bounds = noise_bounds(ref.losses, again.losses)
        out["eager_vs_eager2_max_loss_diff"] = max(
            abs(a - b) for a, b in zip(ref.losses, again.losses)
        )
    for name, r in results.items():
        if r.error:
            continue
        if ref is not None and not ref.error and name != "eager":
            diffs = [abs(a - b) for a, b in zip(r.losses, ref.losses)]
            out[f"{name}_max_loss_diff"] = max(diffs)
            out[f"{name}_loss_parity"] = max(diffs) <= LOSS_TOL
            if bounds is not None and name != "eager2":
                within = all(d <= b for d, b in zip(diffs, bounds))
                out[f"{name}_loss_parity_vs_eager_noise"] = within
            out[f"{name}_speedup_vs_eager"] = ref.ms_per_step / r.ms_per_step
            out[f"{name}_memory_vs_eager"] = r.peak_mem_gib / ref.peak_mem_gib
    ind, fus = results.get("inductor"), results.get("fuser")
    if ind and fus and not ind.error and not fus.error:
        out["fuser_speedup_vs_inductor"] = ind.ms_per_step / fus.ms_per_step
        out["fuser_memory_vs_inductor"] = fus.peak_mem_gib / ind.peak_mem_gib
    ro = results.get("inductor-ro")  # Inductor with mode="reduce-overhead"
    if ro and fus and not ro.error and not fus.error:
        out["fuser_speedup_vs_inductor_ro"] = ro.ms_per_step / fus.ms_per_step
    cg = results.get("fuser-cg")  # fuser with CUDA graphs, against Inductor's
    if ro and cg and not ro.error and not cg.error:
        out["fuser_cg_speedup_vs_inductor_ro"] = ro.ms_per_step / cg.ms_per_step
        out["fuser_cg_memory_vs_inductor_ro"] = cg.peak_mem_gib / ro.peak_mem_gib
    old = results.get("fuser-old")
    if old and fus and not old.error and not fus.error:  # the call program's own effect
        out["fuser_speedup_vs_fuser_old"] = old.ms_per_step / fus.ms_per_step
        out["fuser_memory_vs_fuser_old"] = fus.peak_mem_gib / old.peak_mem_gib
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines file to write")
    ap.add_argument("--impls", default="eager,inductor,fuser", help="comma-separated, in order")
    ap.add_argument("--steps", type=int, default=20, help="training steps per implementation")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of ms/step")
    ap.add_argument("--config", default="124m")
    ap.add_argument("--vocab", type=int, default=None, help="override the vocabulary size")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile-steps", type=int, default=3, help="0 skips the CUDA profiles")
    ap.add_argument(
        "--host-profile-steps", type=int, default=0, help="cProfile of the host for N steps"
    )
    ap.add_argument("--check-steps", type=int, default=1, help="0 skips the check pass")
    ap.add_argument("--verbose", action="store_true", help="print every step")
    ap.add_argument("--device", default="cuda", help="cpu only to smoke-test this script")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpt2_bench needs a CUDA GPU (try --device cpu --config tiny for a smoke test)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    out_dir = args.out.parent
    env = environment()
    print(json.dumps(env), flush=True)
    cfg = get_config(args.config, vocab_size=args.vocab)
    batches = make_batches(cfg.vocab_size, args.batch, args.seq, args.steps, args.device)
    results: dict[str, RunResult] = {}
    with args.out.open("w") as f:
        for impl in [s.strip() for s in args.impls.split(",") if s.strip()]:
            res = run_impl(impl, args, batches, out_dir)
            results[impl] = res
            f.write(json.dumps({"kind": "run", **env, **asdict(res)}) + "\n")
            f.flush()
        summary_row = {**env, **parity(results)}
        print(json.dumps(summary_row, indent=1), flush=True)
        f.write(json.dumps(summary_row) + "\n")
        if "fuser" in results and args.check_steps:
            try:
                check = check_pass(args, batches, out_dir)
            except Exception:
                check = {"kind": "check", "error": traceback.format_exc()[-4000:]}
            print(json.dumps(check, indent=1)[:6000], flush=True)
            f.write(json.dumps({**env, **check}) + "\n")


if __name__ == "__main__":
    main()
