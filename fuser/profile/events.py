"""Read a torch.profiler (Kineto) Chrome trace into the GPU activities of each step.

A trace holds CPU events (ATen ops `cpu_op`, `record_function` annotations
`user_annotation`), the CUDA API calls that launched work (`cuda_runtime`, `cuda_driver`)
and the GPU activities (`kernel`, `gpu_memcpy`, `gpu_memset`). A GPU activity is tied to
the API call that launched it by its `correlation` id; the CPU events enclosing that call
on its thread (found by nesting of time intervals) say which ATen op, optimizer step or
fused region launched it. Steps are time windows on the trace's clock (`ts`, µs), given
by the caller: capture.py stamps them with the wall clock, which Kineto's `ts` follows
(`ts` + `baseTimeNanoseconds` / 1000 is Unix time in µs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CPU_CATS = ("cpu_op", "user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# ATen ops that launch no kernel on a GPU (views, metadata, allocation): left out of the
# structure of a step recorded without one
NO_KERNEL_OPS = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "alias",
    "detach", "detach_", "split", "split_with_sizes", "unbind", "slice", "select",
    "squeeze", "unsqueeze", "as_strided", "empty", "empty_strided", "empty_like",
    "resolve_conj", "resolve_neg", "lift_fresh", "set_", "resize_", "item", "to",
    "_local_scalar_dense", "narrow", "chunk", "contiguous", "_reshape_alias", "flatten",
    "result_type", "size", "stride", "numel", "is_nonzero", "type_as", "view_as",
}  # fmt: skip
# the args of a CPU event that the report reads (the rest is left out of trimmed traces)
KEPT_ARGS = ("Input Dims", "Input type", "Concrete Inputs", "kernel_num_gb", "External id")


@dataclass(frozen=True)
class CpuEvent:
    name: str
    cat: str
    ts: float
    dur: float
    args: dict[str, Any]
    thread: int = 0


@dataclass
class Activity:
    """One kernel, memcpy or memset on the GPU (or, with no GPU, one ATen op or fused
    kernel of the step's structure, with no time)."""

    name: str
    kind: str  # kernel | memcpy | memset | op (structure only, no GPU)
    start: float | None  # µs on the trace clock
    dur: float | None  # µs
    stream: int = 0
    launch_end: float | None = None  # end of the CUDA API call that launched it
    ancestors: tuple[CpuEvent, ...] = ()  # enclosing CPU events, outermost first
    nbytes: int | None = None  # memcpy/memset: bytes the activity reports
    op_id: int = -1  # identity of the innermost ATen op (kernels of one op share it)
    launch_thread: int = -1  # the CPU thread that launched it (an index within the trace)

    @property
    def end(self) -> float | None:
        return None if self.start is None or self.dur is None else self.start + self.dur

    def innermost(self, prefix: str = "aten::") -> CpuEvent | None:
        """The innermost enclosing CPU event whose name starts with `prefix` (an ATen op,
        or a mark such as fuser's region marks)."""
        for e in reversed(self.ancestors):
            if e.name.startswith(prefix):
                return e
        return None


@dataclass
class StepEvents:
    """The GPU activities of one step window, in GPU order, and its launch facts."""

    start: float
    end: float
    activities: list[Activity] = field(default_factory=list)
    last_launch: float | None = None  # end of the last launch call of the step
    launches: int = 0

    @property
    def window(self) -> float:
        return self.end - self.start


def events_of(trace: dict | list) -> list[dict]:
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def base_us(trace: dict | list) -> float | None:
    """Unix time (µs) of the trace clock's zero, when the trace says it."""
    if isinstance(trace, dict) and "baseTimeNanoseconds" in trace:
        return trace["baseTimeNanoseconds"] / 1e3
    return None


class _Nesting:
    """CPU events per thread with their parents (by interval nesting)."""

    def __init__(self, events: list[dict]):
        self.nodes: list[CpuEvent] = []
        self.parent: list[int] = []
        # correlation -> (parent node, launch call start, launch call end)
        self.launch_parent: dict[int, tuple[int, float, float]] = {}
        self.external: dict[int, int] = {}  # a CPU event's "External id" -> node
        self.launch_thread: dict[int, int] = {}  # correlation -> thread index
        per_tid: dict[Any, list[dict]] = {}
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in (*CPU_CATS, *LAUNCH_CATS):
                per_tid.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        for thread, evs in enumerate(per_tid.values()):
            self._walk(sorted(evs, key=lambda e: (e["ts"], -e.get("dur", 0))), thread)

    def _walk(self, evs: list[dict], thread: int) -> None:
        stack: list[int] = []
        for e in evs:
            ts, dur = e["ts"], e.get("dur", 0)
            while stack and self.nodes[stack[-1]].ts + self.nodes[stack[-1]].dur <= ts:
                stack.pop()
            top = stack[-1] if stack else -1
            args = e.get("args", {})
            if e["cat"] in LAUNCH_CATS:
                if "correlation" in args:
                    self.launch_parent[args["correlation"]] = (top, ts, ts + dur)
                    self.launch_thread[args["correlation"]] = thread
                continue
            kept = {k: args[k] for k in KEPT_ARGS if k in args}
            if "External id" in args:
                self.external.setdefault(args["External id"], len(self.nodes))
            self.nodes.append(CpuEvent(e["name"], e["cat"], ts, dur, kept, thread))
            self.parent.append(top)
            stack.append(len(self.nodes) - 1)

    def launcher(self, args: dict) -> tuple[int, float | None, float | None]:
        """(innermost CPU event, launch start, launch end) of a GPU activity: through the
        launch call it is correlated with, else (no launch call recorded) through the
        "External id" of the CPU op that was open when it was launched."""
        found = self.launch_parent.get(args.get("correlation"))
        if found is not None:
            return found
        return self.external.get(args.get("External id"), -1), None, None

    def chain(self, i: int) -> tuple[tuple[CpuEvent, ...], int]:
        """Ancestors of node i (outermost first, i included) and the innermost ATen op."""
        out, op = [], -1
        while i >= 0:
            out.append(self.nodes[i])
            if op < 0 and self.nodes[i].name.startswith("aten::"):
                op = i
            i = self.parent[i]
        return tuple(reversed(out)), op


def gpu_activities(trace: dict | list) -> list[Activity]:
    """Every GPU activity of the trace with the CPU events that launched it, GPU order."""
    events = events_of(trace)
    nest = _Nesting(events)
    out = []
    for e in events:
        kind = GPU_CATS.get(e.get("cat", ""))
        if kind is None or e.get("ph") != "X":
            continue
        args = e.get("args", {})
        parent, _, launch_end = nest.launcher(args)
        ancestors, op = nest.chain(parent) if parent >= 0 else ((), -1)
        out.append(
            Activity(
                e["name"],
                kind,
                float(e["ts"]),
                float(e.get("dur", 0.0)),
                _stream(args, e),
                launch_end,
                ancestors,
                args.get("bytes"),
                op,
                nest.launch_thread.get(args.get("correlation"), -1),
            )
        )
    out.sort(key=lambda a: (a.start, a.stream))
    return out


def _stream(args: dict, e: dict) -> int:
    """The stream of a GPU activity (its args; Kineto's tid for it reads "stream 7")."""
    for v in (args.get("stream"), str(e.get("tid", "")).removeprefix("stream ")):
        try:
            return int(v)
        except (TypeError, ValueError):
            continue
    return 0


def split_steps(activities: list[Activity], windows: list[tuple[float, float]]) -> list[StepEvents]:
    """The activities of each window: launched inside it (or, with no launch known,
    started inside it)."""
    steps = [StepEvents(s, e) for s, e in windows]
    for a in activities:
        t = a.launch_end if a.launch_end is not None else a.start
        for st in steps:
            if t is not None and st.start <= t <= st.end:
                st.activities.append(a)
                if a.launch_end is not None:
                    st.launches += 1
                    st.last_launch = max(st.last_launch or a.launch_end, a.launch_end)
                break
    return steps


def cpu_structure(trace: dict | list, windows: list[tuple[float, float]]) -> list[StepEvents]:
    """With no GPU: per window, the outermost ATen ops (those inside no other ATen op)
    and the fuser regions as activities with no time, in CPU order. Ops inside a fuser
    region (its kernels ran under Triton's interpreter) are left out: the region stands
    for them."""
    nest = _Nesting(events_of(trace))
    steps = [StepEvents(s, e) for s, e in windows]
    for i, k in _structure(nest, windows):
        ancestors, op = nest.chain(i)
        act = Activity(ancestors[-1].name, "op", None, None, 0, None, ancestors, None, op)
        steps[k].activities.append(act)
    for st in steps:
        st.activities.sort(key=lambda a: a.ancestors[-1].ts)
    return steps


def _structure(nest: _Nesting, windows: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """(node, window) of each outermost ATen op that would launch work, and of each fuser
    region mark, that starts inside a window."""
    out = []
    for i, ev in enumerate(nest.nodes):
        if not ev.name.startswith(("aten::", "fuser.region#")):
            continue
        if ev.name.removeprefix("aten::").split(".")[0] in NO_KERNEL_OPS:
            continue
        j, outer = nest.parent[i], False
        while j >= 0 and not outer:
            outer = nest.nodes[j].name.startswith(("aten::", "fuser.region#"))
            j = nest.parent[j]
        if outer:
            continue
        k = next((k for k, (s, e) in enumerate(windows) if s <= ev.ts <= e), None)
        if k is not None:
            out.append((i, k))
    return out


def trim(trace: dict | list, windows: list[tuple[float, float]]) -> dict:
    """A small trace of the windows alone: their GPU activities, the launch calls of
    those, and the CPU events that enclose the launches (with only the args the report
    reads). Times are shifted so the first window starts at 0 (`baseTimeNanoseconds`
    moves with them). What a checked-in fixture holds."""
    events = events_of(trace)
    nest = _Nesting(events)
    t0 = min(s for s, _ in windows) if windows else 0.0
    keep: set[int] = set()
    out: list[dict] = []

    def inside(t: float | None) -> bool:
        return t is not None and any(s <= t <= e for s, e in windows)

    for e in events:
        if GPU_CATS.get(e.get("cat", "")) is None or e.get("ph") != "X":
            continue
        args = e.get("args", {})
        corr = args.get("correlation")
        parent, l_ts, l_end = nest.launcher(args)
        if not inside(l_end if l_end is not None else e["ts"]):
            continue
        gpu_args = {
            k: args[k] for k in ("correlation", "stream", "bytes", "External id") if k in args
        }
        out.append({**_shifted(e, t0), "args": gpu_args})
        if l_ts is not None:
            thread = nest.launch_thread.get(corr, -1)
            launch = {"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": 0}
            launch.update(tid=thread, ts=_r(l_ts - t0), dur=_r(l_end - l_ts))
            out.append({**launch, "args": {"correlation": corr}})
        while parent >= 0 and parent not in keep:
            keep.add(parent)
            parent = nest.parent[parent]
    if not out:  # no GPU: the step's structure
        for i, _ in _structure(nest, windows):
            while i >= 0 and i not in keep:
                keep.add(i)
                i = nest.parent[i]
    for i in sorted(keep):
        n = nest.nodes[i]
        ev = {"ph": "X", "cat": n.cat, "name": n.name, "pid": 0, "tid": n.thread}
        ev.update(ts=_r(n.ts - t0), dur=_r(n.dur), args=n.args)
        out.append(ev)
    base = base_us(trace)
    result: dict[str, Any] = {"traceEvents": out}
    if base is not None:
        result["baseTimeNanoseconds"] = round((base + t0) * 1e3)
    return result


def _r(t: float) -> float:
    return round(t, 3)


def _shifted(e: dict, t0: float) -> dict:
    out = {k: e[k] for k in ("ph", "cat", "name") if k in e}
    out.update(pid=0, tid=e.get("tid", 0), ts=_r(e["ts"] - t0), dur=_r(e.get("dur", 0.0)))
    return out
