"""A profiled step as data (StepProfile, one Row per kernel group) and as text and JSON.

Times are per step (the mean over the profiled steps). The time budget: the step's wall
time (from its start, the GPU idle, to the end of the synchronize that ends it) is GPU
busy (the union of its kernels' intervals) plus GPU idle (before the first kernel, between
kernels, after the last). Host time is the CPU time from the step's start to the end of
its last launch call: Python, Dynamo's guards, fuser's or Inductor's call program and the
launches themselves. Each kernel's time is its own interval less any part already covered
by an earlier one (streams overlapping), so the categories and idle add up to the window.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from fuser.explanation import Explanation
from fuser.profile.classify import (
    ATTENTION,
    CATEGORIES,
    COPIES,
    FUSED,
    GEMM,
    IDLE,
    OTHER,
    UNFUSED,
)

TARGET_SUM = 0.03  # categories (idle included) vs the unprofiled step time
TARGET_OVERHEAD = 0.05  # profiled vs unprofiled step time


@dataclass
class Row:
    """One kind of kernel of the step: the same label and category (per step)."""

    category: str
    label: str
    kernel: str
    calls: float = 0.0
    ms: float | None = None  # attributed time (overlaps counted once)
    kernel_ms: float | None = None  # the kernels' own durations
    bytes: float | None = None
    bytes_from: str = ""
    flops: float | None = None
    detail: str = ""
    gbps: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    pct_peak: float | None = None
    # a kernel the compiler wrote (fuser's or Inductor's), not an ATen one: its copies
    # and casts count in copies/fills, and as its own kernels in coverage()
    generated: bool = False
    # attributed time of this row's activities that no compiled graph launched (eager
    # code between graphs); None where the profile saw no compiled graph at all
    outside_ms: float | None = None

    def rates(self, copy_gbps: float | None, peak: float | None) -> None:
        t = self.kernel_ms
        if self.bytes and t:
            self.gbps = self.bytes / t / 1e6
            self.pct_copy = 100 * self.gbps / copy_gbps if copy_gbps else None
        if self.flops and t:
            self.tflops = self.flops / t / 1e9
            self.pct_peak = 100 * self.tflops * 1e12 / peak if peak else None


@dataclass
class StepProfile:
    """One step function profiled: its kernels, categories, time budget and checks."""

    name: str
    env: dict[str, Any]
    steps: int
    rows: list[Row]
    categories: dict[str, float | None]  # ms per step, idle included
    budget: dict[str, Any]
    timing: dict[str, Any]
    copy_gbps: float | None = None
    peak_flops: float | None = None
    peak_from: str = ""
    units: list[dict] = field(default_factory=list)  # memory-bound kernels, step order
    notes: list[str] = field(default_factory=list)
    title: str = ""

    @property
    def has_time(self) -> bool:
        return self.budget.get("window_ms") is not None

    def groups(self) -> list[Row]:
        """Rows whose labels differ only in a block index merged (h.3 and h.4 -> h.*)."""
        out: dict[tuple[str, str], Row] = {}
        for r in self.rows:
            key = (r.category, re.sub(r"(?<=\.)\d+(?=[.\s]|$)", "*", r.label))
            g = out.get(key)
            if g is None:
                out[key] = g = Row(
                    r.category, key[1], r.kernel, detail=r.detail, generated=r.generated
                )
                g.bytes_from = r.bytes_from
            g.calls += r.calls
            for f in ("ms", "kernel_ms", "bytes", "flops", "outside_ms"):
                v = getattr(r, f)
                if v is not None:
                    setattr(g, f, (getattr(g, f) or 0.0) + v)
        rows = list(out.values())
        for g in rows:
            g.rates(self.copy_gbps, self.peak_flops)
        return _sorted(rows)

    @property
    def idle_unprofiled_ms(self) -> float | None:
        """GPU idle if the step took its unprofiled time: that time less the kernels' busy
        time measured in the profile (kernel durations do not move with the profiler's
        host overhead; idle does, where the host is the bottleneck)."""
        base, busy = self.timing.get("unprofiled_ms"), self.budget.get("busy_ms")
        return None if base is None or busy is None else base - busy

    def coverage(self) -> dict[str, float] | None:
        """Fused-op coverage: the share of the step's memory-bound GPU time spent in fused
        kernels (fuser's, or Inductor's for its run). Memory-bound time is every kernel
        but GEMMs, attention and the optimizer (which runs outside the compiled graph):
        the fused kernels, the unfused ATen ones, copies/fills and unclassified ones.
        None where the profile has no times (a CPU run)."""
        if not self.has_time:
            return None
        ms = {c: self.categories.get(c) or 0.0 for c in (FUSED, UNFUSED, COPIES, OTHER)}
        total = sum(ms.values())
        share = ms[FUSED] / total if total else float("nan")
        # issue 21's measure: the share in the compiler's own kernels, its copy and cast
        # kernels included (ATen's copies, fills and unfused kernels are what is left)
        own = ms[FUSED] + sum(
            r.ms or 0.0 for r in self.rows if r.category == COPIES and r.generated
        )
        out = {
            "fused_ms": ms[FUSED],
            "memory_bound_ms": total,
            "share": share,
            "own_ms": own,
            "own_share": own / total if total else float("nan"),
        }
        # memory-bound time no compiled graph launched: eager code that no backend was
        # handed (graph breaks, frames past Dynamo's recompile limit)
        outside = [r.outside_ms for r in self.rows if r.category in ms]
        if any(v is not None for v in outside):
            eager = sum(v or 0.0 for v in outside)
            inside = total - eager
            out["outside_graphs_ms"] = eager
            out["own_share_in_graphs"] = own / inside if inside > 0 else float("nan")
        return out

    def checks(self) -> dict[str, Any]:
        t, out = self.timing, {}
        base = t.get("unprofiled_ms")
        total = sum(v for v in self.categories.values() if v is not None)
        if base and self.has_time:
            out["categories_sum_ms"] = total
            out["categories_vs_step"] = total / base - 1
            out["categories_within_3pct"] = abs(total / base - 1) <= TARGET_SUM
        if base and t.get("profiled_ms"):
            out["profiled_vs_unprofiled"] = t["profiled_ms"] / base - 1
            out["profiled_within_5pct"] = abs(t["profiled_ms"] / base - 1) <= TARGET_OVERHEAD
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "env": self.env,
            "steps": self.steps,
            "copy_gbps": self.copy_gbps,
            "peak_bf16_flops": self.peak_flops,
            "peak_from": self.peak_from,
            "timing": self.timing,
            "budget": {**self.budget, "idle_at_unprofiled_step_ms": self.idle_unprofiled_ms},
            "categories_ms": self.categories,
            "coverage": self.coverage(),
            "checks": self.checks(),
            "notes": self.notes,
            "groups": [_row_json(r) for r in self.groups()],
            "kernels": [_row_json(r) for r in self.rows],
            "units": self.units,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> StepProfile:
        rows = [Row(**{k: v for k, v in r.items() if k != "share"}) for r in d["kernels"]]
        return StepProfile(
            d["name"], d["env"], d["steps"], rows, d["categories_ms"], d["budget"],
            d["timing"], d["copy_gbps"], d["peak_bf16_flops"], d.get("peak_from", ""),
            d.get("units", []), d.get("notes", []), d.get("title", ""),
        )  # fmt: skip

    def table(self, top: int | None = 40, grouped: bool = False) -> Explanation:
        """The report for people: header, time budget, categories, then the kernels."""
        lines = header(self) + [""] + budget_lines(self) + [""] + category_lines(self)
        rows = self.groups() if grouped else self.rows
        what = "kernel groups (blocks merged)" if grouped else "kernels of one step"
        shown = rows if top is None else rows[:top]
        more = f", top {len(shown)} of {len(rows)}" if len(shown) < len(rows) else ""
        lines += ["", f"{what}, by time{more}:"] + kernel_lines(self, shown)
        lines += [f"note: {n}" for n in self.notes]
        return Explanation("\n".join(lines))

    def __str__(self) -> str:
        return self.table()


def _row_json(r: Row) -> dict[str, Any]:
    out = {}
    for k, v in asdict(r).items():
        if v is None or v == "":
            continue
        out[k] = float(f"{v:.5g}") if isinstance(v, float) else v
    return out


def dumps(obj: dict[str, Any]) -> str:
    """JSON with one line per top-level key and per element of a top-level list (rows
    stay readable, and a diff of two runs shows which rows moved)."""
    lines = []
    for k, v in obj.items():
        if isinstance(v, list) and v:
            inner = ",\n".join("  " + json.dumps(x, separators=(",", ":")) for x in v)
            lines.append(f"{json.dumps(k)}: [\n{inner}\n]")
        else:
            lines.append(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _sorted(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (-(r.ms or 0.0), -r.calls, r.label))


def _ms(v: float | None, width: int = 8) -> str:
    return f"{v:{width}.2f}" if v is not None else " " * (width - 1) + "-"


def header(p: StepProfile) -> list[str]:
    env, t = p.env, p.timing
    dev = env.get("device", "?")
    lines = [f"{p.name}: {p.title} on {dev}".rstrip()]
    lines.append(
        f"  torch {env.get('torch', '?')}, triton {env.get('triton', '?')}, "
        f"fuser {env.get('fuser', '?')}, {env.get('date', '')}"
    )
    if t.get("unprofiled_ms"):
        n = len(t.get("unprofiled", [])) + len(t.get("unprofiled_after", []))
        s = f"  step {t['unprofiled_ms']:.2f} ms (median of {n} unprofiled steps)"
        if t.get("profiled_ms"):
            rel = t["profiled_ms"] / t["unprofiled_ms"] - 1
            s += f"; profiled {t['profiled_ms']:.2f} ms ({rel:+.1%}, CUDA activities only)"
        lines.append(s)
    if t.get("attributes_pass_ms") and t.get("profiled_ms"):
        lines.append(
            f"  attributes pass (CPU ops, shapes, region marks): {t['attributes_pass_ms']:.2f} "
            "ms, used for what launched each kernel, not for time"
        )
    if t.get("reported_step"):
        lines.append(f"  reported: {t['reported_step']}")
    if t.get("gc_ms_per_step"):
        lines.append(
            f"  Python garbage collection: {t['gc_ms_per_step']:.2f} ms per unprofiled step"
        )
    if t.get("first_step_s") is not None:
        lines.append(f"  first step {t['first_step_s']:.1f} s (compilation included)")
    if p.copy_gbps:
        lines.append(f"  copy ceiling {p.copy_gbps:.0f} GB/s (1 GiB device copy, this run)")
    if p.peak_flops:
        peak = f"{p.peak_flops / 1e12:.0f} TFLOP/s (table entry {p.peak_from!r})"
        lines.append(f"  dense bf16 peak {peak}")
    return lines


def budget_lines(p: StepProfile) -> list[str]:
    b = p.budget
    if not p.has_time:
        return ["time budget: no GPU timing (kernels ran on the CPU); structure only"]
    w = b["window_ms"]

    def pct(v: float) -> str:
        return f"{100 * v / w:5.1f}%" if w else ""

    lines = [
        "time budget per step (ms):",
        f"  step (profiled wall)  {w:8.2f}",
        f"  GPU busy              {b['busy_ms']:8.2f}  {pct(b['busy_ms'])}",
        f"  GPU idle              {b['idle_ms']:8.2f}  {pct(b['idle_ms'])}  "
        f"({b['idle_head_ms']:.2f} before the first kernel, {b['idle_gaps_ms']:.2f} "
        f"between kernels, {b['idle_tail_ms']:.2f} after the last)",
    ]
    if b.get("host_ms") is not None:
        lines.append(
            f"  host                  {b['host_ms']:8.2f}  {pct(b['host_ms'])}  (step start to "
            f"the end of its last launch: Python, guards, launches; {b['launches']:.0f} launches)"
        )
    g = b.get("gaps")
    if g and g["count"]:
        lines.append(
            f"  idle stretches > {g['min_us']:.0f} us between kernels (the median step): "
            f"{g['count']}, "
            f"{g['host_late_ms']:.2f} ms host late (launched after the GPU went idle), "
            f"{g['other_ms']:.2f} ms other; the longest:"
        )
        for x in g["longest"]:
            why = "host late" if x["host_late"] else "other"
            lines.append(
                f"    {x['us']:7.0f} us at {x['at_ms']:6.2f} ms ({why}): after "
                f"{x['before'][:50]} / before {x['after'][:50]}"
            )
    runs = b.get("launch_phases") or []
    if len(runs) > 1:
        threads: dict[int, str] = {}
        for r in runs:  # the caller's thread first seen, then autograd's
            threads.setdefault(r["thread"], "caller" if not threads else f"thread {len(threads)}")
        parts = [
            f"{r['start_ms']:.1f}-{r['end_ms']:.1f} ms {threads[r['thread']]} ({r['launches']})"
            for r in runs[:6]
        ]
        lines.append("  launches by thread: " + ", ".join(parts))
    return lines


def category_lines(p: StepProfile) -> list[str]:
    rate: dict[str, str] = {}
    for c in CATEGORIES:
        rows = [r for r in p.rows if r.category == c]
        kms = sum(r.kernel_ms or 0 for r in rows)
        if c in (GEMM, ATTENTION):
            fl = sum(r.flops or 0 for r in rows)
            if fl and kms:
                tf = fl / kms / 1e9
                peak = f" ({100 * tf * 1e12 / p.peak_flops:.0f}% of peak)" if p.peak_flops else ""
                rate[c] = f"{tf:7.0f} TFLOP/s{peak}"
            continue
        known = [r for r in rows if r.bytes is not None and r.kernel_ms]
        nb, t = sum(r.bytes for r in known), sum(r.kernel_ms for r in known)
        if nb and t:
            gb = nb / t / 1e6
            pc = f" ({100 * gb / p.copy_gbps:.0f}% of copy)" if p.copy_gbps else ""
            cover = sum(r.kernel_ms for r in known) / kms if kms else 0
            rate[c] = f"{gb:7.0f} GB/s{pc}, bytes known for {cover:.0%} of its time"
    calls = {c: sum(r.calls for r in p.rows if r.category == c) for c in CATEGORIES}
    lines = ["by category (ms per step):"]
    window = p.budget.get("window_ms")
    for c in (*CATEGORIES, IDLE):
        v = p.categories.get(c)
        if v is None and not calls.get(c):
            continue
        share = f"{100 * v / window:5.1f}%" if v is not None and window else "      "
        n = f"{calls.get(c, 0):6.0f} calls" if c != IDLE else " " * 12
        lines.append(f"  {c:22s}{_ms(v)}  {share}  {n}  {rate.get(c, '')}".rstrip())
    if p.has_time:
        total = sum(v for v in p.categories.values() if v is not None)
        ck = p.checks()
        s = f"  {'total':22s}{_ms(total)}"
        if "categories_vs_step" in ck:
            s += f"  vs unprofiled step {ck['categories_vs_step']:+.1%}"
        lines.append(s)
        idle = p.idle_unprofiled_ms
        if idle is not None:
            base = p.timing["unprofiled_ms"]
            lines.append(
                f"  at the unprofiled step ({base:.2f} ms) the GPU is idle {idle:.2f} ms "
                f"({100 * idle / base:.1f}%): that step less the kernels' time"
            )
        cov = p.coverage()
        if cov and cov["memory_bound_ms"]:
            lines.append(
                f"  fused-op coverage {cov['share']:.0%}: fused kernels {cov['fused_ms']:.2f} "
                f"of {cov['memory_bound_ms']:.2f} ms memory-bound (all but GEMMs, attention, "
                "optimizer)"
            )
            if "own_ms" in cov:
                lines.append(
                    f"  in the compiler's own kernels {cov['own_share']:.0%}: "
                    f"{cov['own_ms']:.2f} ms, its copy and cast kernels included (the rest: "
                    "ATen's kernels)"
                )
            if (cov.get("outside_graphs_ms") or 0.0) >= 0.005:  # under that: launch noise
                lines.append(
                    f"  outside every compiled graph (eager: graph breaks, frames past "
                    f"Dynamo's recompile limit): {cov['outside_graphs_ms']:.2f} ms of it; "
                    f"own kernels {cov['own_share_in_graphs']:.0%} of the time inside graphs"
                )
    return lines


def kernel_lines(p: StepProfile, rows: list[Row]) -> list[str]:
    window = p.budget.get("window_ms")
    out = [f"  {'ms':>7s} {'share':>6s} {'calls':>5s}  {'category':20s} {'rate':>22s}  what"]
    for r in rows:
        share = f"{100 * r.ms / window:5.1f}%" if r.ms is not None and window else "     -"
        if r.tflops is not None:
            pk = f" {r.pct_peak:3.0f}%pk" if r.pct_peak is not None else ""
            rate = f"{r.tflops:6.0f} TFLOP/s{pk}"
        elif r.gbps is not None:
            pc = f" {r.pct_copy:3.0f}%cp" if r.pct_copy is not None else ""
            rate = f"{r.gbps:6.0f} GB/s{pc}"
        elif r.bytes:
            rate = f"{r.bytes / r.calls / 1e6:8.2f} MB/call"
        else:
            rate = ""
        out.append(
            f"  {_ms(r.ms, 7)} {share:>6s} {r.calls:5.0f}  {r.category:20s} {rate:>22s}  {r.label}"
        )
    return out
