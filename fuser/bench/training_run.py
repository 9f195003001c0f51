"""`python -m fuser.bench --suite training`: issue 20's training kernels as a user gets
them, `torch.compile(fn, backend="fuser")` beside the same function eager, with Inductor,
with Liger's and QuACK's kernels, in one run, L2 flushed (training_measure says exactly
what is timed). One results.jsonl row per op x variant x shape x implementation.

examples:
  python -m fuser.bench --suite training                    # everything (~10 min on an H100)
  python -m fuser.bench --suite training --time-limit 450 --out DIR    # then again with
  python -m fuser.bench --suite training --time-limit 450 --out DIR --resume  # the rest
  python -m fuser.bench --suite training --ops layernorm_fwd_bwd --shapes 768,4096
  python -m fuser.bench --suite training --ops bias_grad --variants sum --impls compile,fuser-triton
  python -m fuser.bench --suite training --cpu              # tiny shapes, interpreter, CI
  python -m fuser.bench.report RESULTS.jsonl                # the targets table again
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fuser.bench import training_measure as tm
from fuser.bench.measure import copy_gbps
from fuser.bench.run import meta as kernel_meta
from fuser.bench.targets import targets_table
from fuser.bench.training import OPS, VARIANTS, Inputs, TrainCase, cases
from fuser.config import config
from fuser.dynamo import FuserBackend

IMPLS = ["eager", "compile", "liger", "quack", "fuser-triton", "fuser-cuda"]
CPU_IMPLS = ["eager", "fuser-triton"]
NOT_INSTALLED = {
    "liger": "liger-kernel is not installed (pip install -e '.[peers]')",
    "quack": "quack-kernels is not installed: its CUTLASS DSL wheel (nvidia-cutlass-dsl, "
    "~92 MB) is over the GPU machine's carry limit; the targets table compares with "
    "QuACK's published H100 figures instead",
}


@dataclass
class TrainOptions:
    ops: list[str] = field(default_factory=lambda: list(OPS))
    shapes: list[str] | None = None  # 'MxN' or 'N'
    variants: list[str] | None = None
    impls: list[str] = field(default_factory=lambda: list(IMPLS))
    reps: int = 20
    flush: str = "read"
    cpu: bool = False  # tiny shapes through the interpreter: correctness only
    profile: bool = True  # count the GPU kernels of one step with torch.profiler


@dataclass
class Impl:
    fn: Callable[..., object]
    setup: Callable[[], None] | None = None
    backend: object | None = None  # the FuserBackend, for fuser's own kernels and fallbacks


def _installed(peer: str) -> bool:
    mod = {"liger": "liger_kernel", "quack": "quack"}[peer]
    try:
        __import__(mod)
    except Exception:  # ImportError, or a CUDA library the peer needs that is missing
        return False
    return True


def build(case: TrainCase, name: str, inp: Inputs, cpu: bool) -> Impl | str:
    """The implementation `name` of `case`, or why there is none."""
    if name == "eager":
        return Impl(case.fn)
    if name == "compile":
        # static shapes, fresh caches: each size gets its own kernels, as a user
        # compiling one model at one size would
        torch._dynamo.reset()
        return Impl(torch.compile(case.fn, dynamic=False))
    if name.startswith("fuser-"):
        torch._dynamo.reset()
        backend = FuserBackend()
        return Impl(torch.compile(case.fn, backend=backend, dynamic=False), backend=backend)
    peer = case.liger if name == "liger" else case.quack
    if isinstance(peer, str):
        return peer
    if cpu:
        return f"{name} runs on a GPU only"
    if not _installed(name):
        return NOT_INSTALLED[name]
    setup = None
    if name == "liger" and case.op == "cross_entropy_fwd_bwd":
        # Liger writes the gradient over the logits: put them back before each call
        logits = inp.args[0]
        pristine = logits.detach().clone()

        def setup() -> None:
            with torch.no_grad():
                logits.copy_(pristine)

    return Impl(peer, setup)


@contextlib.contextmanager
def fuser_backend(name: str) -> Iterator[None]:
    """config.backend set to the fuser impl's backend while it is compiled and run."""
    if not name.startswith("fuser-"):
        yield
        return
    old = config.backend
    config.backend = name.removeprefix("fuser-")
    try:
        yield
    finally:
        config.backend = old


def fuser_info(backend: object) -> dict:
    """fuser's own kernels (planned, forward and backward) and what ran as ATen."""
    graphs = [g for c in backend.captures for g in c.graphs]  # type: ignore[attr-defined]
    kernels = [k for g in graphs for k in g.kernels]
    fell = [f"{r.name}: {r.fallback}" for g in graphs for r in g.regions if r.fallback]
    fell += [f"{g.name}: {g.error}" for g in graphs if g.error]
    return {
        "fuser_kernels": len(kernels),
        "schedule": "; ".join(k.schedule.short() for k in kernels if hasattr(k, "schedule")),
        "fell_back": fell,
        "aten_ops": sorted({f.op for g in graphs for f in g.fallbacks}),
    }


def measure(case: TrainCase, name: str, inp: Inputs, ref: tm.Tensors, opts: TrainOptions) -> dict:
    """One row: checked against the fp32 reference, then (on a GPU) timed and counted."""
    row: dict = {"impl": name, "ms": None, "gbps": None, "ok": None, "error": None}
    impl = build(case, name, inp, opts.cpu)
    if isinstance(impl, str):
        row["skipped"] = impl
        return row

    def call() -> tm.Tensors:
        return tm.step(impl.fn, inp)

    with fuser_backend(name):
        try:
            if impl.setup:
                impl.setup()
            t0 = time.perf_counter()
            got = call()
            if not opts.cpu:
                torch.cuda.synchronize()
            row["compile_s"] = round(time.perf_counter() - t0, 3)
            names = tm.output_names(len(ref) - len(inp.wrt), inp)
            wrong, err = tm.check(got, ref, case.reduction_length, names)
            del got
            row.update(ok=wrong is None, error=wrong, max_err=err)
            if impl.backend is not None:
                row.update(fuser_info(impl.backend))
                if row["fell_back"]:
                    row.update(ok=False, error=f"ran as ATen: {row['fell_back'][0]}"[:300])
            if opts.cpu or wrong is not None:
                return row
            for _ in range(2):  # warm-up: later compiles, autotuning, caches
                if impl.setup:
                    impl.setup()
                call()
            if opts.profile:
                if impl.setup:
                    impl.setup()
                row["kernels"], row["memops"], row["kernel_names"] = tm.gpu_kernels(call)
            ms, host = tm.gpu_ms(call, opts.reps, impl.setup, opts.flush)
            row.update(ms=ms, gbps=case.nbytes / ms / 1e6, host_ms=host)
        except torch.OutOfMemoryError:
            row.update(ok=False, error="out of GPU memory")
        except Exception as e:  # reported in its row; the run goes on
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        finally:
            if impl.setup:  # leave the inputs as the next implementation expects them
                impl.setup()
    return row


def run_case(case: TrainCase, opts: TrainOptions, base: dict, emit: Callable) -> None:
    inp = tm.leaves(case.make("cpu" if opts.cpu else "cuda"))
    ref = case.reference(inp) if case.reference else tm.reference(case.fn, inp)
    base = {
        **base,
        "suite": "training",
        "op": case.op,
        "variant": case.variant,
        "shape": case.shape,
        "rows": case.rows,
        "cols": case.cols,
        "dtype": "bfloat16",
        "bytes": case.nbytes,
        "bytes_counted": case.note,
    }
    for name in opts.impls:
        emit({**base, **measure(case, name, inp, ref, opts)})
        gc.collect()
        if not opts.cpu:
            torch.cuda.empty_cache()


def line(r: dict) -> str:
    """One row of the terminal table."""
    label = f"{r['op']}[{r['variant']}]" if r.get("variant") else r["op"]
    ok = {True: "ok", False: "FAIL", None: "skip" if r.get("skipped") else ""}[r.get("ok")]
    ms, gbps, ceil = r.get("ms"), r.get("gbps"), r.get("copy_gbps")
    cells = [f"{label:36s}", f"{r['shape']:12s}", f"{r['impl']:13s}", f"{ok:4s}"]
    cells.append(f"{ms:8.4f} ms" if ms else " " * 11)
    cells.append(f"{gbps:6.0f} GB/s" if gbps else " " * 11)
    cells.append(f"{gbps / ceil:5.1%}" if gbps and ceil else " " * 6)
    k = r.get("kernels", r.get("fuser_kernels"))
    cells.append(f"{k:3d}k" if k is not None else "    ")
    cells.append(r.get("error") or r.get("skipped") or r.get("schedule") or "")
    return " ".join(cells)


def meta() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    info = kernel_meta()
    for peer, dist in (("liger", "liger-kernel"), ("quack", "quack-kernels")):
        try:
            info[f"{peer}_version"] = version(dist)
        except PackageNotFoundError:
            info[f"{peer}_version"] = None
    return info


def case_key(r: dict | TrainCase) -> tuple:
    if isinstance(r, TrainCase):
        return (r.op, r.variant, r.shape)
    return (r["op"], r.get("variant", ""), r["shape"])


def run(
    opts: TrainOptions,
    emit: Callable[[dict], None],
    done: set[tuple] | None = None,
    deadline: float | None = None,
) -> list[str]:
    """Run every case not in `done`; those left when `deadline` (perf_counter) passed are
    returned by name, not run."""
    todo = list(cases(opts.ops, opts.shapes, opts.variants, tiny=opts.cpu))
    if not todo:
        raise SystemExit("no case matches --ops/--shapes/--variants")
    base = {**meta(), "flush": None if opts.cpu else opts.flush}
    base["copy_gbps"] = None if opts.cpu else copy_gbps()
    if base["copy_gbps"]:
        emit({**base, "suite": "training", "op": "copy", "variant": "", "shape": "1GiB",
              "impl": "torch-copy", "gbps": base["copy_gbps"], "ok": None})  # fmt: skip
    left = []
    for case in todo:
        if done and case_key(case) in done:
            continue
        if deadline is not None and time.perf_counter() > deadline:
            left.append(f"{case.label} {case.shape}")
            continue
        t0 = time.perf_counter()
        run_case(case, opts, base, emit)
        print(f"# {case.label} {case.shape}: {time.perf_counter() - t0:.1f} s", flush=True)
    return left


def parser() -> argparse.ArgumentParser:
    def names(text: str) -> list[str]:
        return [x for x in text.split(",") if x]

    ap = argparse.ArgumentParser(
        prog="fuser-bench --suite training",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--suite", choices=["training"], default="training")
    ap.add_argument("--ops", type=names, default=list(OPS), help=", ".join(OPS))
    ap.add_argument("--shapes", type=names, default=None, help="'8192x768,50257': MxN or N")
    variants = sorted({v for vs in VARIANTS.values() for v in vs})
    ap.add_argument("--variants", type=names, default=None, help=", ".join(variants))
    ap.add_argument("--impls", type=names, default=None, help=", ".join(IMPLS))
    ap.add_argument("--reps", type=int, default=None, help="timed repeats (default 20)")
    ap.add_argument("--quick", action="store_true", help="10 repeats")
    ap.add_argument("--flush", choices=["read", "zero"], default="read")
    ap.add_argument("--no-profile", action="store_true", help="don't count GPU kernels")
    ap.add_argument("--cpu", action="store_true", help="tiny shapes, interpreter, no timing")
    ap.add_argument("--out", type=Path, default=None, help="folder for results.jsonl")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds after which no new case starts (the rest are listed; --resume runs them)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --out's results and run only the cases they lack",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("fuser-bench: no CUDA GPU here; --cpu runs the tiny shapes without timing.")
        return 2
    opts = TrainOptions(
        ops=args.ops,
        shapes=args.shapes,
        variants=args.variants,
        impls=args.impls or (CPU_IMPLS if args.cpu else list(IMPLS)),
        reps=args.reps or (10 if args.quick else 20),
        flush=args.flush,
        cpu=args.cpu,
        profile=not args.no_profile,
    )
    unknown = set(opts.impls) - set(IMPLS)
    if unknown:
        raise SystemExit(f"unknown implementations {sorted(unknown)}; choose from {IMPLS}")
    out = args.out or config.cache_dir / "bench" / "training"
    out.mkdir(parents=True, exist_ok=True)
    print(f"results -> {out}", flush=True)
    rows: list[dict] = []
    partial = out / "results.partial.jsonl"
    done: set[tuple] = set()
    if args.resume:
        for path in (out / "results.jsonl", partial):
            if path.exists():
                old = [json.loads(x) for x in open(path) if x.strip()]
                rows += [r for r in old if r.get("suite") == "training" and r["op"] != "copy"]
        rows = list({(case_key(r), r["impl"]): r for r in rows}.values())
        done = {case_key(r) for r in rows}
        print(f"resuming: {len(done)} cases already measured", flush=True)
    partial.unlink(missing_ok=True)
    with open(partial, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)

    def emit(r: dict) -> None:
        rows.append(r)
        print(line(r), flush=True)
        with open(partial, "a") as f:
            f.write(json.dumps(r) + "\n")

    t0 = time.perf_counter()
    deadline = t0 + args.time_limit if args.time_limit else None
    left = run(opts, emit, done, deadline)
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    partial.unlink(missing_ok=True)
    print(targets_table(rows))
    bad = [r for r in rows if r["impl"].startswith("fuser-") and r.get("ok") is False]
    for r in bad:
        print(f"FAILED {r['op']}[{r['variant']}] {r['shape']} {r['impl']}: {r['error']}")
    if left:
        print(f"not run (--time-limit): {', '.join(left)}")
        print("the same command with --resume runs them")
    print(f"{len(rows)} rows in {time.perf_counter() - t0:.0f} s -> {out / 'results.jsonl'}")
    return 1 if bad else 0
