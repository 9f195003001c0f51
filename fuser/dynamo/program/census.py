"""What the call programs of a training step do, counted: the host work of a step.

Every line of a call program costs host time at every step: a kernel launch, a call of a
region module (fd.execute: a plan looked up by the inputs' signature, outputs packed,
several times an inlined launch), an ATen call (the dispatcher), a view (one
reinterpret). The census counts the steps of every program a step runs, forward and
backward (each tangent variant), by kind; a region module call by why it was not inlined,
an ATen call by its op, and the copies an inlined region makes (clones, restrides) apart.
It is measured on a CPU, from what the programs contain: the same programs a GPU runs,
less the kernels' compiled launchers.

    python -m fuser.dynamo.program.census suite:t5-tiny suite:bert-tiny gpt2-tiny
    python -m fuser.dynamo.program.census suite:t5 --device cuda   # a GPU's programs
    python -m fuser.dynamo.program.census suite:llama --clock --batch 16 --seq 1024
        # on a GPU: the host time of each kind of step (clock.py), at the model's real size
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from fuser.config import config
from fuser.dynamo import CAPTURES
from fuser.dynamo.program.clock import host_table
from fuser.dynamo.program.step import COPIES, Step, step_key  # noqa: F401  (census rows)
from fuser.profile.models import training_step


def census(programs: Iterable[Any]) -> Counter:
    """Steps by row over `programs` (CallPrograms; those without a program are counted
    under "no program")."""
    out: Counter = Counter()
    for p in programs:
        if p is None or p.fn is None:
            out["no program"] += 1
            continue
        out["programs"] += 1
        out.update(step_key(s) for s in p.steps)
        # an allocation the memory plan gives a dead buffer is a name, not a call
        out["alloc: reused"] += len(p.memory.reuse)
        out["alloc"] -= len(p.memory.reuse)
    return out


def programs_of(captures: Iterable[Any]) -> list[Any]:
    """The CallProgram of every graph of `captures` (FuserBackend.captures): forward,
    backward and each tangent variant; None for a graph that has none."""
    return [g.program for c in captures for g in c.graphs]


def totals(c: Counter) -> dict[str, int]:
    """The summary rows: launches, region module calls, ATen calls, copies, views."""
    return {
        "launches (inlined)": c["launch"],
        "region module calls": sum(v for k, v in c.items() if k.startswith("region module")),
        "aten calls": sum(v for k, v in c.items() if k.startswith("aten:")),
        "other calls": sum(v for k, v in c.items() if k.startswith("call:")),
        "region copies": sum(v for k, v in c.items() if k.startswith("region copy")),
        "views": sum(v for k, v in c.items() if k == "view" or k.startswith("view:")),
        "allocations (new)": c["alloc"],
        "allocations (a dead buffer reused)": c["alloc: reused"],
    }


def table(columns: dict[str, Counter], top: int = 0) -> str:
    """The census of each column (a model) side by side: the totals, then every row,
    most frequent first (the first `top` of them; 0: all)."""
    names = list(columns)
    width = max(12, *(len(n) for n in names))
    heads = "".join(f"{n:>{width}}" for n in names)
    lines = [f"{'':<72}{heads}"]
    sums = {n: totals(c) for n, c in columns.items()}
    for row in next(iter(sums.values()), {}):
        lines.append(f"{row:<72}" + "".join(f"{sums[n][row]:>{width}}" for n in names))
    lines.append("")
    every: Counter = Counter()
    for c in columns.values():
        every.update(c)
    skip = ("programs", "launch", "view", "alloc", "alloc: reused")
    rows = [k for k, _ in every.most_common() if k not in skip]
    for row in rows[: top or None]:
        label = row if len(row) <= 70 else row[:67] + "..."
        lines.append(f"{label:<72}" + "".join(f"{columns[n][row]:>{width}}" for n in names))
    return "\n".join(lines)


def model_census(model: str, steps: int = 2, device: str = "cpu") -> Counter:
    """The census of one training step of `model` (a name fuser.profile knows: gpt2-tiny,
    suite:t5-tiny...) compiled by fuser on `device` (on a GPU under bf16 autocast, as
    fuser.profile runs it); `steps` steps are run (the programs are built at the first)."""
    before = len(CAPTURES)
    step, _ = training_step(model, "fuser", 2, 8, device)
    for _ in range(steps):
        step()
    return census(programs_of(CAPTURES[before:]))


def model_clock(model: str, batch: int | None, seq: int | None, warmup: int, steps: int) -> str:
    """The host time of `model`'s call programs by kind of step (clock.py), over `steps`
    training steps after `warmup` (at least 1: the programs are built at the first), on
    the GPU where there is one, against the step's mean wall time (synchronized before
    and after), as the clocks' sums are means too."""
    cuda = torch.cuda.is_available()
    saved, config.program_clock = config.program_clock, True
    before = len(CAPTURES)
    walls = []
    try:  # on through the timed steps too: a program rebuilt there (a recompile) is clocked
        step, title = training_step(model, "fuser", batch, seq, "cuda" if cuda else "cpu")
        for _ in range(max(warmup, 1)):  # the first step builds the programs, unclocked
            step()
        programs = programs_of(CAPTURES[before:])
        for p in programs:
            if p is not None and p.clock is not None:
                p.clock.reset()
        for _ in range(steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
        programs = programs_of(CAPTURES[before:])
    finally:
        config.program_clock = saved
    wall = sum(walls) / len(walls)
    return f"{title}\n{host_table(programs, steps, wall)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fuser.dynamo.program.census", description=__doc__)
    ap.add_argument("models", nargs="*", default=["suite:t5-tiny", "suite:bert-tiny", "gpt2-tiny"])
    ap.add_argument("--top", type=int, default=0, help="rows printed (0: all)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU's own plans)")
    ap.add_argument("--clock", action="store_true", help="host time by kind of step instead")
    ap.add_argument("--batch", type=int, default=None, help="--clock: batch (default: model's)")
    ap.add_argument("--seq", type=int, default=None, help="--clock: sequence length")
    ap.add_argument("--warmup", type=int, default=3, help="--clock: untimed steps first")
    ap.add_argument("--steps", type=int, default=10, help="--clock: timed steps")
    args = ap.parse_args(argv)
    if args.clock:
        for m in args.models:
            print(model_clock(m, args.batch, args.seq, args.warmup, args.steps))
        return 0
    columns = {m.removeprefix("suite:"): model_census(m, device=args.device) for m in args.models}
    print(table(columns, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
