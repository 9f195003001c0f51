"""python -m fuser.suite: train the suite's models with eager, Inductor and fuser, side by side.

    python -m fuser.suite --size tiny                       # CPU: parity only
    python -m fuser.suite --size full --out $OUT/suite      # a GPU: parity, ms/step, memory

For each model: pass (no crash, loss and gradient parity with eager), ms/step, peak memory,
speedup over eager, and fuser's coverage (ATen ops fused / compute ops left to ATen, GEMMs,
attention and views apart) with the main reasons for the rest. Results go to
suite.jsonl and suite.md in --out; the geometric mean of each implementation's speedup
over eager closes the table.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from dataclasses import asdict
from pathlib import Path

import torch

from fuser.suite.models import FAMILIES
from fuser.suite.profiled import profiled
from fuser.suite.run import IMPLS, Result, judge, train


def table(results: list[Result]) -> str:
    rows = [
        "| model | impl | B | params M | pass | max loss diff | max grad err | ms/step | "
        "vs eager | peak GiB | graphs / breaks | fused/unfused ops | GPU busy ms | "
        "coverage (GPU time) | own kernels (GPU time) | eager between graphs ms | "
        "own kernels in graphs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    eager = {r.model: r for r in results if r.impl == "eager"}
    speedups: dict[str, list[float]] = {}
    for r in results:
        base = eager.get(r.model)
        speed = base.ms_per_step / r.ms_per_step if base and not r.error else float("nan")
        if speed == speed:
            speedups.setdefault(r.impl, []).append(speed)
        ops = f"{r.fused_ops}/{r.unfused_ops}" if r.impl == "fuser" and not r.error else ""
        state = "FAIL (error)" if r.error else ("pass" if r.ok else "FAIL (parity)")
        graphs = f"{r.graphs} / {r.graph_breaks}" if r.impl != "eager" and not r.error else ""
        timed = [v for k, v in r.gpu_ms.items() if k != "idle" and v is not None]
        busy = sum(timed) if timed else None
        gpu = (
            f"{busy:.1f} | {r.gpu_coverage:.0%} | {r.own_coverage:.0%} | "
            f"{r.outside_graphs_ms:.2f} | {r.own_coverage_in_graphs:.0%}"
            if busy is not None
            else " | | | | "
        )
        rows.append(
            f"| {r.model} | {r.impl} | {r.batch} | {r.params_m:.1f} | {state} | "
            f"{r.max_loss_diff:.2e} | {r.max_grad_err:.2e} | {r.ms_per_step:.1f} | {speed:.2f}x | "
            f"{r.peak_mem_gib:.2f} | {graphs} | {ops} | {gpu} |"
        )
    rows.append("")
    for impl, s in speedups.items():
        geo = math.exp(sum(math.log(v) for v in s) / len(s))
        passed = sum(r.ok for r in results if r.impl == impl)
        total = sum(r.impl == impl for r in results)
        line = f"- {impl}: {passed}/{total} pass, speedup over eager (geomean) {geo:.2f}x"
        if impl != "eager":
            breaks = sum(r.graph_breaks for r in results if r.impl == impl)
            line += f", {breaks} graph breaks in all"
        rows.append(line)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> list[Result]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default=",".join(FAMILIES), help="comma-separated")
    ap.add_argument("--impls", default=",".join(IMPLS), help="eager first: parity is against it")
    ap.add_argument("--size", choices=("tiny", "full"), default="tiny")
    ap.add_argument("--steps", type=int, default=None, help="default 2 on CPU, 12 on a GPU")
    ap.add_argument("--warmup", type=int, default=None, help="default 1 on CPU, 4 on a GPU")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default: the suite's)")
    ap.add_argument("--device", default=None, help="default cuda if available, else cpu")
    ap.add_argument("--out", type=Path, default=None, help="folder for suite.jsonl and suite.md")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="a GPU: profile one more step of each compiled run (GPU time by category, "
        "fused-op coverage by GPU time, and the share in the compiler's own kernels, "
        "copies and casts included); reports in --out/profiles",
    )
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    steps = args.steps or (2 if cpu else 12)
    warmup = args.warmup if args.warmup is not None else (1 if cpu else 4)
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    if "eager" in impls:  # parity is against eager: it runs first
        impls = ["eager"] + [i for i in impls if i != "eager"]
    results: list[Result] = []
    log = None
    if args.out:  # one line per result as it comes: a run cut short keeps what it had
        args.out.mkdir(parents=True, exist_ok=True)
        log = (args.out / "suite.jsonl").open("w")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        base, base_grads = None, {}
        ref, ref_grads = None, {}
        if not cpu and "eager" in impls:  # the fp32 step every bf16 one is judged against
            ref, ref_grads = train(
                name, args.size, "eager", device, steps, warmup, amp=False, batch_size=args.batch
            )
            if ref.error:
                print(f"{name:9s} fp32 reference failed: {ref.error.strip().splitlines()[-1]}")
        for impl in impls:
            prof = None
            if args.profile and not cpu and impl != "eager":
                prof = functools.partial(profiled, out=(args.out or Path("suite-out")) / "profiles")
            res, grads = train(
                name, args.size, impl, device, steps, warmup, profile=prof, batch_size=args.batch
            )
            if impl == "eager":
                base, base_grads = res, grads
            elif base is not None:
                judge(res, grads, base, base_grads, ref, ref_grads)
            del grads
            results.append(res)
            if log:
                log.write(json.dumps({**asdict(res), "ok": res.ok, "coverage": res.coverage}))
                log.write("\n")
                log.flush()
            state = "ERROR" if res.error else ("pass" if res.ok else "PARITY FAIL")
            print(
                f"{name:9s} {impl:9s} {state:11s} {res.ms_per_step:9.1f} ms/step "
                f"loss diff {res.max_loss_diff:.1e} grad err {res.max_grad_err:.1e}",
                flush=True,
            )
            if res.error:
                print(res.error.strip().splitlines()[-1], flush=True)
        del base_grads, ref_grads
    text = table(results)
    print(text)
    if log:
        log.close()
        (args.out / "suite.md").write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()
