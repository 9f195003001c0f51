"""`fuser.profile(step_fn)`: where the milliseconds of a training step go.

    import fuser
    def step():                       # one whole training step, any model, any backend
        loss = compiled(x, y)[1]; loss.backward(); opt.step(); opt.zero_grad()
    p = fuser.profile(step)           # a StepProfile
    print(p.table())                  # budget, categories, every kernel of one step
    cmp = fuser.profile(step, compare=inductor_step)   # both, lined up (a Comparison)

A run can be saved (`save_run`: the two passes' traces trimmed to the profiled windows,
fuser's region table, the measured times) and analysed again later or elsewhere
(`load_run`), which is what the CPU tests do with a step recorded on an H100.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fuser.bench.measure import copy_gbps as measure_copy
from fuser.dynamo import CAPTURES
from fuser.profile.analyse import analyse, budget, join
from fuser.profile.capture import Capture, Pass, capture, environment
from fuser.profile.compare import Comparison, compare
from fuser.profile.events import cpu_structure, gpu_activities, split_steps, trim
from fuser.profile.plot import plot
from fuser.profile.regions import region_table
from fuser.profile.report import StepProfile, dumps


def steps_of(cap: Capture) -> tuple[list, list[str]]:
    """The profiled steps' activities, each with its launch context; notes on how."""
    notes: list[str] = []
    attrs = cap.attributes
    if not cap.cuda:
        return cpu_structure(attrs.trace, attrs.windows), notes
    a_steps = split_steps(gpu_activities(attrs.trace), attrs.windows)
    if cap.timing is None:
        return a_steps, notes
    t_steps = split_steps(gpu_activities(cap.timing.trace), cap.timing.windows)
    if a_steps:
        for st in t_steps:
            joined = join(st.activities, a_steps[0].activities)
            if joined < len(st.activities):
                notes.append(
                    f"{len(st.activities) - joined} of {len(st.activities)} timed kernels had "
                    "no twin in the attributes pass: classified by name"
                )
    if t_steps and all(st.last_launch is None for st in t_steps) and a_steps:
        host = budget(a_steps)["host_ms"]
        for st in t_steps:  # host time from the attributes pass (CPU ops recorded)
            st.last_launch = None if host is None else st.start + host * 1e3
        notes.append("host time from the attributes pass (its CPU op records included)")
    return t_steps, notes


def build(
    cap: Capture,
    regions: dict[str, dict],
    *,
    env: dict[str, Any],
    copy_gbps: float | None,
    title: str = "",
) -> StepProfile:
    steps, notes = steps_of(cap)
    return analyse(
        cap.name,
        steps,
        regions,
        env=env,
        timing=cap.timing_info(),
        copy_gbps=copy_gbps,
        title=title,
        notes=cap.notes + notes,
    )


def profile(
    step_fn: Callable[[], Any],
    *,
    compare: Callable[[], Any] | None = None,
    name: str = "fuser",
    compare_name: str = "inductor",
    steps: int = 5,
    warmup: int = 2,
    timed: int = 10,
    title: str = "",
    copy_gbps: float | None = None,
    out: str | Path | None = None,
) -> StepProfile | Comparison:
    """Profile `step_fn` (one whole training step: forward, backward, optimizer) and report
    where its time goes. With `compare`, a second step function (the same step compiled
    another way) is profiled after it in the same process and the two are lined up.

    `steps` profiled steps follow `warmup` steps and `timed` unprofiled ones; on a CPU
    the kernels run under Triton's interpreter, so only the structure is reported.
    `out`: a folder for the JSON reports, the tables, the saved runs and the plot."""
    cuda = torch.cuda.is_available()
    if copy_gbps is None and cuda:
        copy_gbps = measure_copy()
    env = environment()
    results = []
    for fn, nm in ((step_fn, name), (compare, compare_name)):
        if fn is None:
            continue
        cap = capture(fn, nm, steps=steps, warmup=warmup, timed=timed, captures=CAPTURES)
        regions = region_table(CAPTURES)
        results.append(build(cap, regions, env=env, copy_gbps=copy_gbps, title=title))
        if out is not None:
            used = used_regions(regions, cap)
            save_run(cap, used, env, copy_gbps, Path(out) / f"run-{nm}.json.gz", title)
    result: StepProfile | Comparison = (
        compare_profiles(*results) if len(results) == 2 else results[0]
    )
    if out is not None:
        write(result, Path(out))
    return result


def compare_profiles(a: StepProfile, b: StepProfile) -> Comparison:
    return compare(a, b)


def used_regions(regions: dict[str, dict], cap: Capture) -> dict[str, dict]:
    """The regions whose kernels (or marks) occur in the capture's traces."""
    names = set()
    for p in (cap.timing, cap.attributes):
        for e in p.trace.get("traceEvents", []) if p is not None else ():
            names.add(str(e.get("name", "")).removeprefix("fuser.region#"))
    return {
        r: v
        for r, v in regions.items()
        if r in names or any(k["kernel"] in names for k in v["kernels"])
    }


def _saved_pass(p: Pass | None, keep: int | None) -> dict | None:
    if p is None:
        return None
    windows = p.windows[:keep] if keep is not None else p.windows
    t0 = min((s for s, _ in windows), default=0.0)
    return {
        "trace": trim(p.trace, windows),
        "windows": [(s - t0, e - t0) for s, e in windows],
        "step_ms": p.step_ms[:keep],
    }


def save_run(
    cap: Capture,
    regions: dict[str, dict],
    env: dict[str, Any],
    copy_gbps: float | None,
    path: Path,
    title: str = "",
    keep: int | None = None,
) -> Path:
    """The run, trimmed to its first `keep` profiled steps (all by default), as gzipped
    JSON (load_run reads it)."""
    data = {
        "name": cap.name,
        "title": title,
        "cuda": cap.cuda,
        "env": env,
        "copy_gbps": copy_gbps,
        "unprofiled_ms": cap.unprofiled_ms,
        "unprofiled_after": cap.unprofiled_after,
        "gc_ms": cap.gc_ms,
        "first_step_s": cap.first_step_s,
        "notes": cap.notes,
        "regions": regions,
        "timing": _saved_pass(cap.timing, keep),
        "attributes": _saved_pass(cap.attributes, 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(data, f, separators=(",", ":"))
    return path


def one_step(src: str | Path, dst: str | Path) -> Path:
    """A copy of a saved run that keeps only its median timed step (and the attributes
    step): how tests/fixtures/profile/ was cut from a GPU run."""
    with gzip.open(src, "rt") as f:
        d = json.load(f)
    t = d["timing"]
    if t is not None and len(t["windows"]) > 1:
        order = sorted(range(len(t["windows"])), key=lambda i: t["step_ms"][i])
        i = order[(len(order) - 1) // 2]
        w = t["windows"][i]
        trace = trim(t["trace"], [tuple(w)])
        d["timing"] = {
            "trace": trace,
            "windows": [(0.0, w[1] - w[0])],
            "step_ms": [t["step_ms"][i]],
        }
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt") as f:
        json.dump(d, f, separators=(",", ":"))
    return dst


def load_run(path: str | Path) -> StepProfile:
    """Analyse a run saved by save_run again (no GPU needed)."""
    with gzip.open(path, "rt") as f:
        d = json.load(f)

    def as_pass(p: dict | None) -> Pass | None:
        if p is None:
            return None
        return Pass(p["trace"], [tuple(w) for w in p["windows"]], p["step_ms"])

    cap = Capture(
        d["name"], d["cuda"], as_pass(d["timing"]), as_pass(d["attributes"]),
        d["unprofiled_ms"], d["first_step_s"], d.get("notes", []),
        d.get("unprofiled_after", []), d.get("gc_ms"),
    )  # fmt: skip
    return build(cap, d["regions"], env=d["env"], copy_gbps=d["copy_gbps"], title=d["title"])


def write(result: StepProfile | Comparison, out: Path) -> None:
    """JSON for machines, tables for people and the stacked bars, into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    profiles = [result.a, result.b] if isinstance(result, Comparison) else [result]
    for p in profiles:
        (out / f"profile-{p.name}.json").write_text(dumps(p.to_json()))
        text = p.table(top=None) + "\n\n" + p.table(top=None, grouped=True).split("\n\n")[-1]
        (out / f"table-{p.name}.txt").write_text(text + "\n")
    if isinstance(result, Comparison):
        (out / "comparison.json").write_text(dumps(result.to_json()))
        (out / "comparison.txt").write_text(result.table(top=None) + "\n")
    plot(profiles, out / "step-budget.png", title=profiles[0].title)
