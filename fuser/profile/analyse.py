"""From the profiled steps to a StepProfile: who each activity is, its time, its bytes.

Two passes feed it (capture.py): the timing pass (CUDA activities only, the least
overhead) gives every kernel's time; the attributes pass (CPU ops with their shapes and
fuser's region marks, one step) says what launched each kernel. They are joined kernel by
kernel: the same step launches the same kernels in the same order (when it does not, by
name and occurrence).
"""

from __future__ import annotations

import re
from typing import Any

from fuser.profile import classify
from fuser.profile.classify import ATTENTION, COPIES, FUSED, GEMM, IDLE, OTHER
from fuser.profile.events import Activity, StepEvents
from fuser.profile.regions import REGION_MARK, kernel_index
from fuser.profile.report import Row, StepProfile


def join(timing: list[Activity], attrs: list[Activity]) -> int:
    """Give each timed activity the launch context of its twin in the attributes pass;
    returns how many found one."""
    if [a.name for a in timing] == [a.name for a in attrs]:
        pairs = list(zip(timing, attrs))
    else:
        seen: dict[str, list[Activity]] = {}
        for a in attrs:
            seen.setdefault(a.name, []).append(a)
        count: dict[str, int] = {}
        pairs = []
        for t in timing:
            i = count.get(t.name, 0)
            count[t.name] = i + 1
            if i < len(seen.get(t.name, [])):
                pairs.append((t, seen[t.name][i]))
    for t, a in pairs:
        t.ancestors, t.op_id = a.ancestors, a.op_id
    return len(pairs)


def _attributed(step: StepEvents) -> list[float]:
    """Each activity's time not already covered by an earlier one (µs), in the window."""
    out, cursor = [], step.start
    for a in step.activities:
        s, e = max(a.start, cursor), min(a.end, step.end)
        out.append(max(0.0, e - s))
        cursor = max(cursor, e)
    return out


def budget(steps: list[StepEvents]) -> dict[str, Any]:
    """Mean per step, in ms: window, GPU busy and idle (head, gaps, tail), host time."""
    n = len(steps) or 1
    acc = dict(window=0.0, busy=0.0, head=0.0, tail=0.0, host=0.0, launches=0.0)
    host_known = all(s.last_launch is not None for s in steps)
    for st in steps:
        busy = sum(_attributed(st))
        acc["window"] += st.window
        acc["busy"] += busy
        if st.activities:
            acc["head"] += max(0.0, st.activities[0].start - st.start)
            acc["tail"] += max(0.0, st.end - max(a.end for a in st.activities))
        if host_known:
            acc["host"] += st.last_launch - st.start
        acc["launches"] += st.launches
    ms = {k: v / n / 1e3 for k, v in acc.items()}
    idle = ms["window"] - ms["busy"]
    out = {
        "window_ms": ms["window"],
        "busy_ms": ms["busy"],
        "idle_ms": idle,
        "idle_head_ms": ms["head"],
        "idle_tail_ms": ms["tail"],
        "idle_gaps_ms": max(0.0, idle - ms["head"] - ms["tail"]),
        "host_ms": ms["host"] if host_known else None,
        "launches": acc["launches"] / n,
    }
    if steps and host_known:
        out["launch_phases"] = phases(steps[0])
        out["gaps"] = gaps(median_step(steps)[0])
    return out


GAP_US = 20.0  # idle stretches shorter than this are launch latency, not listed


def gaps(step: StepEvents, top: int = 8) -> dict[str, Any]:
    """The GPU's idle stretches between kernels of one step: their total by cause and the
    `top` longest, each with the kernels around it. A stretch is the host's ("host late")
    where the kernel after it was launched only after the GPU had gone idle (the Python
    launching it was behind the GPU), else the GPU's own (a dependency across streams, a
    synchronization, a copy's latency)."""
    acts = sorted((a for a in step.activities if a.end is not None), key=lambda a: a.start)
    found, cursor, before = [], None, None
    for a in acts:
        if cursor is not None and a.start - cursor > GAP_US:
            late = a.launch_end is not None and a.launch_end > cursor
            found.append(
                {
                    "us": a.start - cursor,
                    "at_ms": (cursor - step.start) / 1e3,
                    "host_late": late,
                    "before": _short(before.name),
                    "after": _short(a.name),
                }
            )
        if cursor is None or a.end > cursor:
            cursor, before = a.end, a
    host = sum(g["us"] for g in found if g["host_late"]) / 1e3
    other = sum(g["us"] for g in found if not g["host_late"]) / 1e3
    longest = sorted(found, key=lambda g: -g["us"])[:top]
    return {
        "count": len(found),
        "min_us": GAP_US,
        "host_late_ms": host,
        "other_ms": other,
        "longest": longest,
    }


def phases(step: StepEvents) -> list[dict[str, Any]]:
    """The step's launches in runs by launching thread (a training step: the forward on
    the caller's thread, the backward on autograd's, then the optimizer on the caller's):
    when each run starts and ends (ms from the step's start) and how many it launched."""
    runs: list[dict[str, Any]] = []
    launched = [a for a in step.activities if a.launch_end is not None]
    for a in sorted(launched, key=lambda a: a.launch_end):
        t = (a.launch_end - step.start) / 1e3
        if runs and runs[-1]["thread"] == a.launch_thread:
            runs[-1]["end_ms"], runs[-1]["launches"] = t, runs[-1]["launches"] + 1
        else:
            runs.append({"thread": a.launch_thread, "start_ms": t, "end_ms": t, "launches": 1})
    return runs


def median_step(steps: list[StepEvents]) -> tuple[StepEvents, int]:
    """The step whose window is the median of the profiled steps (one slow step, a
    collection or a page fault, does not move the report), and its index."""
    order = sorted(range(len(steps)), key=lambda i: steps[i].window)
    i = order[(len(order) - 1) // 2]
    return steps[i], i


def _short(kernel: str) -> str:
    """A kernel's name without 'void', anonymous namespaces and its parameter list, cut
    to 90 characters."""
    name, depth = kernel.removeprefix("void ").replace("(anonymous namespace)::", ""), 0
    for i, ch in enumerate(name):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return name if len(name) <= 90 else name[:87] + "..."


class _Labeller:
    """Which fused region launched each activity, and its label."""

    def __init__(self, regions: dict[str, dict]):
        self.regions = regions
        self.by_kernel = kernel_index(regions)

    def fused(self, a: Activity) -> tuple[dict | None, dict | None, str]:
        """(fuser's kernel entry, its region, the region's label) of an activity; a
        kernel known only by name gets the first region that launches it."""
        mark = a.innermost(REGION_MARK)
        if mark is not None:
            region = self.regions.get(mark.name.removeprefix(REGION_MARK))
            for k in region["kernels"] if region is not None else ():
                if k["kernel"] == a.name:
                    return k, region, region["label"]
        entry = self.by_kernel.get(a.name)
        if entry is None:
            return None, None, ""
        region = self.regions[entry["regions"][0]]
        n = len(entry["regions"])
        more = f" (or {n - 1} more regions: no region marks)" if n > 1 else ""
        return entry, region, region["label"] + more

    def label(self, a: Activity, fused: dict | None, region_label: str) -> str:
        if fused is not None:
            parts = a.name.rsplit("_k", 1)
            suffix = "k" + parts[-1].replace("_finalize", " finalize") if len(parts) > 1 else ""
            return f"{region_label} · {suffix}" if suffix else region_label
        op = a.innermost()
        if classify.inductor_ops(a.name) is not None or op is None:
            return _short(a.name)
        # the op and the one it ran inside, if any (aten::constant_pad_nd > aten::copy_)
        ops = " > ".join([e.name for e in a.ancestors if e.name.startswith("aten::")][-2:])
        text = ops if a.kind == "op" else f"{ops} · {_short(a.name)}"
        mark = a.innermost(REGION_MARK)  # an ATen op a fused region ran (a restride...)
        region = self.regions.get(mark.name.removeprefix(REGION_MARK)) if mark else None
        return f"{text} (in {region['label']})" if region else text


def _split(acts: list[tuple[Activity, float, str]], value: Any) -> dict[int, float]:
    """An op's bytes or FLOPs shared by its kernels in proportion to their durations."""
    total = sum(a.dur or 0.0 for a, _, _ in acts)
    if not total:
        return {id(a): value / len(acts) for a, _, _ in acts}
    return {id(a): value * (a.dur or 0.0) / total for a, _, _ in acts}


def rows_of(steps: list[StepEvents], regions: dict[str, dict]) -> tuple[list[Row], list[dict]]:
    """Rows per step (summed over the steps, then divided by their count) and the first
    step's memory-bound units (for lining two profiles up kernel by kernel)."""
    lab = _Labeller(regions)
    rows: dict[tuple[str, str], Row] = {}
    units: list[dict] = []
    # a profile with no compiled graph (eager, or fusions run by hand) has no "outside"
    graphs = any(classify.in_compiled_graph(a) for st in steps for a in st.activities)
    for si, st in enumerate(steps):
        acts = _expand(st.activities, regions)
        timed = bool(acts) and acts[0].start is not None
        times: list[float | None] = list(_attributed(st)) if timed else [None] * len(acts)
        info = []
        for a, t in zip(acts, times):
            fused, region, region_label = lab.fused(a)
            cat = classify.category(a, fused)
            info.append((a, t, cat, fused, region, lab.label(a, fused, region_label)))
        values = _values(info)
        for a, t, cat, fused, region, label in info:
            row = rows.setdefault(
                (cat, label),
                Row(cat, label, _short(a.name), generated=classify.generated(a, fused)),
            )
            row.calls += 1
            if t is not None:
                row.ms = (row.ms or 0.0) + t / 1e3
                row.kernel_ms = (row.kernel_ms or 0.0) + (a.dur or 0.0) / 1e3
                if graphs:
                    eager = classify.in_compiled_graph(a) is False
                    row.outside_ms = (row.outside_ms or 0.0) + (t / 1e3 if eager else 0.0)
            nbytes, flops, source, detail = values[id(a)]
            if nbytes is not None:
                row.bytes = (row.bytes or 0.0) + nbytes
                row.bytes_from = source
            if flops is not None:
                row.flops = (row.flops or 0.0) + flops
            row.detail = detail or row.detail
            if si == 0 and cat in (FUSED, COPIES):
                _unit(units, a, t, cat, region, label)
    n = len(steps) or 1
    for r in rows.values():
        r.calls /= n
        for f in ("ms", "kernel_ms", "bytes", "flops", "outside_ms"):
            if getattr(r, f) is not None:
                setattr(r, f, getattr(r, f) / n)
    return list(rows.values()), units


def _expand(acts: list[Activity], regions: dict[str, dict]) -> list[Activity]:
    """With no GPU, a fuser region's mark stands for the kernels its plan launches."""
    out = []
    for a in acts:
        if a.kind == "op" and a.name.startswith(REGION_MARK):
            region = regions.get(a.name.removeprefix(REGION_MARK), {"kernels": []})
            for k in region["kernels"]:
                out.append(Activity(k["kernel"], "op", None, None, 0, None, a.ancestors))
            continue
        out.append(a)
    return out


def _values(info: list) -> dict[int, tuple]:
    """(bytes, FLOPs, where the bytes came from, detail) of every activity."""
    out: dict[int, tuple] = {}
    per_op: dict[tuple[int, str], list] = {}
    for a, t, cat, fused, _, _ in info:
        if fused is not None:
            detail = f"{fused['scheduler']}: {fused['ops']}"
            out[id(a)] = (fused["bytes"], None, "fuser plan", detail)
            continue
        op = a.innermost()
        if op is not None and a.op_id >= 0 and a.kind != "memcpy" and a.kind != "memset":
            if not (a.ancestors and a.ancestors[-1].name == a.name and a.kind == "kernel"):
                per_op.setdefault((a.op_id, cat), []).append((a, t, cat))
                continue
        nbytes, source = classify.activity_bytes(a)
        out[id(a)] = (nbytes if cat not in (GEMM, ATTENTION) else None, None, source, "")
    for (_, cat), acts in per_op.items():
        op = acts[0][0].innermost()
        flops = classify.op_flops(op) if cat in (GEMM, ATTENTION) else None
        kernels = " ".join(a.name for a, _, _ in acts)
        nbytes = classify.op_bytes(op, kernels) if cat not in (GEMM, ATTENTION) else None
        fl = _split(acts, flops) if flops else {}
        nb = _split(acts, nbytes) if nbytes is not None else {}
        shapes = [s for s in op.args.get("Input Dims", []) if s][:3]
        detail = f"{op.name} {shapes}"[:120] if shapes else op.name
        for a, _, _ in acts:
            out[id(a)] = (nb.get(id(a)), fl.get(id(a)), "op shapes" if nb else "", detail)
    return out


def _unit(units: list, a: Activity, t: float | None, cat: str, region: Any, label: str) -> None:
    """Consecutive kernels of one region call are one unit; each Inductor kernel is one."""
    ms = (t or 0.0) / 1e3
    if region is not None:
        mark = a.innermost(REGION_MARK)
        key = f"{mark.name}@{mark.ts}" if mark is not None else a.name.rsplit("_k", 1)[0]
        if units and units[-1]["key"] == key:
            units[-1]["ms"] += ms
            return
        ops = classify.op_set(re.sub(r" x\d+", "", region["ops"]).split(", "))
        name = re.sub(r"(?<=\.)\d+(?=[.\s]|$)", "*", label.rsplit(" · k", 1)[0])
        units.append({"key": key, "label": name, "ops": sorted(ops), "ms": ms, "category": cat})
        return
    ops = classify.inductor_ops(a.name)
    if ops is not None:
        unit = {"key": a.name, "label": _short(a.name), "ops": sorted(classify.op_set(ops))}
        units.append({**unit, "ms": ms, "category": cat})


def categories(rows: list[Row], budget_: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for c in (*classify.CATEGORIES, IDLE):
        vals = [r.ms for r in rows if r.category == c]
        out[c] = sum(v for v in vals if v is not None) if vals else 0.0
    if budget_.get("window_ms") is None:
        return {c: None for c in out}
    out[IDLE] = budget_["idle_ms"]
    if not out[OTHER]:
        out.pop(OTHER)
    return out


def analyse(
    name: str,
    steps: list[StepEvents],
    regions: dict[str, dict],
    *,
    env: dict[str, Any],
    timing: dict[str, Any],
    copy_gbps: float | None = None,
    title: str = "",
    notes: list[str] | None = None,
) -> StepProfile:
    peak, peak_from = classify.peak_flops(env.get("device", ""))
    timed = any(a.start is not None for st in steps for a in st.activities)
    timing = dict(timing)
    if timed and len(steps) > 1:
        step, i = median_step(steps)
        timing["profiled_windows_ms"] = [st.window / 1e3 for st in steps]
        timing["reported_step"] = f"step {i} of {len(steps)} profiled (the median window)"
        steps = [step]
    rows, units = rows_of(steps, regions)
    b = budget(steps) if timed else {"window_ms": None}
    if not timed and steps:
        b["host_ms"] = sum(st.window for st in steps) / len(steps) / 1e3
    for r in rows:
        r.rates(copy_gbps, peak)
    rows.sort(key=lambda r: (-(r.ms or 0.0), -r.calls, r.label))
    p = StepProfile(name, env, len(steps), rows, categories(rows, b), b, timing, copy_gbps)
    p.peak_flops, p.peak_from, p.units, p.title = peak, peak_from, units, title
    p.notes = list(notes or [])
    return p
