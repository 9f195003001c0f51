"""From a FusionDefinition and its inputs to launched kernels, cached per input signature."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from fuser.backends.registry import get_backend
from fuser.config import config, debug_print
from fuser.errors import InputError
from fuser.ir.evaluate import constant_ids, eval_node, evaluate
from fuser.ir.graph import Graph
from fuser.passes import Pipeline, run_pipeline
from fuser.plan.build import make_plan
from fuser.runtime import plan_cache, timing
from fuser.runtime.buffers import empty_whole
from fuser.runtime.checks import poll
from fuser.runtime.kernel import Kernel, device_problem
from fuser.runtime.specs import build_specs, planned_alignment, shape_of
from fuser.schedulers.choose import choose_schedule
from fuser.schedulers.device import Device, get_device
from fuser.schedulers.inner_outer import InnerOuterSplit
from fuser.schedulers.spec import KernelSpec
from fuser.segmenter import Segment, segment


@dataclass
class CompiledFusion:
    """The plan for one input signature: passes, segments, kernels (or ATen fallbacks)."""

    pipeline: Pipeline
    segments: list[Segment]
    kernels: dict[int, Kernel]
    device: Device
    backend: str
    notes: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    # (segment, value) pairs passed as contiguous copies: per segment, since the same
    # tensor may be a 2D view in one kernel's layout and not in another's
    copied: set[tuple[int, int]] = field(default_factory=set)
    # value id -> the strides its kernel allocates it with, when not the contiguous ones:
    # a fusion output the definition asks in another layout (fd.output_strides), written
    # in place by its kernel through row_dims
    alloc_strides: dict[int, tuple[int, ...]] = field(default_factory=dict)
    from_disk: bool = False  # read from the plan cache (runtime/plan_cache.py)

    def __post_init__(self) -> None:
        # read on every call: derived once here
        final = self.pipeline.final
        self._input_ids = [v.id for v in final.inputs]
        self._output_ids = [v.id for v in final.outputs]
        self._constants = constant_ids(final)
        self._direct = self._direct_plan()

    def _direct_plan(self) -> tuple | None:
        """For the common plan, one kernel and nothing else: (kernel, per kernel argument
        the input position it comes from or -1 for an output to allocate, with shape and
        dtype, and each fusion output's argument position). run() then skips the
        value-id bookkeeping. None for any other plan."""
        if len(self.segments) != 1 or self.copied:
            return None
        kernel = self.kernels.get(self.segments[0].index)
        if kernel is None:
            return None
        position = {vid: i for i, vid in enumerate(self._input_ids)}
        args, produced = [], {}
        for i, (is_output, vid, shape, dtype) in enumerate(kernel.arg_plan):
            if is_output:
                produced[vid] = i
                args.append((-1, shape, dtype, self.alloc_strides.get(vid)))
            elif vid in position:
                args.append((position[vid], None, None, None))
            else:
                return None
        if not all(vid in produced for vid in self._output_ids):
            return None
        return kernel, tuple(args), tuple(produced[vid] for vid in self._output_ids)

    @property
    def graph(self) -> Graph:
        return self.pipeline.final

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        poll()  # a bad index a GPU kernel reported since the last call (runtime/checks.py)
        dev = inputs[0].device if inputs else torch.device("cpu")
        if self._direct is not None:
            kernel, plan, outs = self._direct
            args = [
                inputs[src] if src >= 0 else _empty(shape, stride, dtype, dev)
                for src, shape, dtype, stride in plan
            ]
            kernel.launch_unchecked(args)
            return [args[i] for i in outs]
        env: dict[int, torch.Tensor] = dict(zip(self._input_ids, inputs))
        copied = self.copied
        for seg in self.segments:
            kernel = self.kernels.get(seg.index)
            if kernel is None:
                for n in seg.nodes:
                    args = [env[v.id] for v in n.inputs]
                    outs = eval_node(n, args, dev, self._constants, asynchronous=True)
                    for v, t in zip(n.outputs, outs):
                        env[v.id] = t
                continue
            args = []
            for is_output, vid, shape, dtype in kernel.arg_plan:
                if is_output:
                    stride = self.alloc_strides.get(vid)
                    t = env[vid] = _empty(shape, stride, dtype, dev)
                else:
                    t = env[vid]
                    if copied and (seg.index, vid) in copied:  # planned as a copy
                        t = t.contiguous()
                args.append(t)
            kernel.launch_unchecked(args)
        return [env[i] for i in self._output_ids]

    def explain(self) -> str:
        lines = [
            f"fusion: {len(self.segments)} segment(s) on {self.device.name} "
            f"[{self.backend}], "
            + ("read from the plan cache" if self.from_disk else "planned")
            + f" in {self.compile_seconds * 1e3:.0f} ms"
        ]
        lines += [f"note: {n}" for n in self.notes]
        for seg in self.segments:
            k = self.kernels.get(seg.index)
            if k is not None:
                lines.append(k.explain())
            else:
                lines.append(
                    f"ATen fallback (segment {seg.index}): {seg.ops_summary()}\n"
                    f"  why: {seg.reason or 'not fused'}"
                )
        return "\n".join(lines)


def _empty(shape: Any, stride: Any, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    if stride is None:
        return torch.empty(shape, dtype=dtype, device=dev)
    return empty_whole(shape, stride, dtype, dev)  # rows with gaps span whole rows


def plan(
    graph: Graph,
    inputs: list[Any],
    name: str,
    backend: str,
    device: Device,
    relaxed: bool = False,
    out_strides: dict[int, tuple[int, ...]] | None = None,
) -> CompiledFusion:
    t0 = time.perf_counter()
    if not plan_cache.enabled():  # no "plan cache" phase in the first-step report then
        cf = _plan(graph, inputs, name, backend, device, relaxed, out_strides)
        cf.compile_seconds = time.perf_counter() - t0
        return cf
    with timing.phase("plan cache"):  # the key (a pickle of the graph) and the read
        key = plan_cache.plan_key(
            graph, inputs, name, backend, device, relaxed, out_strides, planned_alignment
        )
        cached = plan_cache.load(key, CompiledFusion)
    if cached is not None:  # a new object: its fields are this call's to set
        cached.from_disk = True
        cached.compile_seconds = time.perf_counter() - t0
        return cached
    cf = _plan(graph, inputs, name, backend, device, relaxed, out_strides)
    cf.compile_seconds = time.perf_counter() - t0
    with timing.phase("plan cache"):  # the plan pickled and written
        plan_cache.store(key, cf)
    return cf


def _plan(
    graph: Graph,
    inputs: list[Any],
    name: str,
    backend: str,
    device: Device,
    relaxed: bool,
    out_strides: dict[int, tuple[int, ...]] | None,
) -> CompiledFusion:
    with timing.phase("passes"):
        pipeline = run_pipeline(graph, relaxed)
    final = pipeline.final
    notes = []
    if any(math.prod(shape_of(v)) == 0 for v in final.values()):
        seg = Segment(
            0, final.nodes, final.inputs, final.outputs, None, "empty tensors: evaluated with ATen"
        )
        return CompiledFusion(pipeline, [seg], {}, device, backend, ["empty tensors"])
    alloc: dict[int, tuple[int, ...]] = {}
    segments, specs, schedules, copied, notes = _schedules(
        final, inputs, name, backend, device, out_strides, alloc
    )
    kernels = {}
    for idx, s in schedules.items():
        with timing.phase("rendering"):
            kernels[idx] = render_kernel(specs[idx], s, backend)
    if copied:
        notes.append(
            "inputs " + ", ".join(f"t{i}" for i in sorted({v for _, v in copied})) + " are not 2D "
            "views (their row dims do not collapse); they are passed as contiguous copies"
        )
    return CompiledFusion(
        pipeline, segments, kernels, device, backend, notes, copied=copied, alloc_strides=alloc
    )


def _schedules(
    final: Graph,
    inputs: list[Any],
    name: str,
    backend: str,
    device: Device,
    out_strides: dict[int, tuple[int, ...]] | None = None,
    alloc: dict[int, tuple[int, ...]] | None = None,
) -> tuple:
    """(segments, specs, schedules, copied inputs, notes) of `final`. A kernel with row and
    column reductions whose row does not fit registers (InnerOuterSplit) is segmented
    again without that merge: an inner kernel and column-reduction kernels, each of which
    says why in its schedule's reasons."""
    split: dict[int, str] = {}  # column reductions' value ids -> why they were split off
    while True:
        with timing.phase("segmenting"):
            segments = segment(final, frozenset(split))
            copied: set[tuple[int, int]] = set()
            notes: list[str] = []
            specs = build_specs(final, segments, inputs, name, copied, notes, out_strides, alloc)
        schedules, again = {}, False
        for idx, spec in specs.items():
            try:
                with timing.phase("scheduling"):
                    schedules[idx] = choose_schedule(spec, device, backend)
            except InnerOuterSplit as e:
                group = {v.id for n in spec.nodes for v in n.outputs}
                split.update({vid: str(e) for vid in group})
                again = True
        if not again:
            break
    for idx, spec in specs.items():
        why = {split[v.id] for n in spec.nodes for v in n.outputs if v.id in split}
        if why:
            s = schedules[idx]
            schedules[idx] = replace(s, reasons=(*s.reasons, *sorted(why)))
            notes.append(f"{spec.name}: {min(why)}")
    return segments, specs, schedules, copied, notes


def render_kernel(spec: KernelSpec, schedule: Any, backend: str) -> Kernel:
    """The schedule's plan, printed by the backend."""
    b = get_backend(backend)
    plan = make_plan(spec, schedule)
    return Kernel(spec, schedule, b.render(plan), b.name, plan=plan)


def _check_runnable(graph: Graph, first: torch.Tensor, backend: str) -> None:
    """An InputError unless this process can run `backend`'s kernels on the inputs'
    device (bind has checked they share one)."""
    problem = device_problem(backend, first.device.type)
    if problem:
        raise InputError(
            f"execute: input 0 ({graph.inputs[0].name}) is on {first.device}, and {problem}"
        )


def signature(inputs: list[torch.Tensor]) -> tuple:
    """What a plan is specialized to: shapes, strides, dtypes, device and each pointer's
    alignment. The device, not get_device(), which is -1 on meta tensors too: a meta
    tensor must not find a CPU plan. Raises (AttributeError, RuntimeError...) on a
    non-tensor or a sparse tensor: the caller lets bind name the input then."""
    return tuple([(t.shape, t.stride(), t.dtype, t.device, planned_alignment(t)) for t in inputs])


class FusionExecutor:
    """Per-FusionDefinition cache of plans, keyed by input signature and backend."""

    def __init__(self, fd: Any):
        self.fd = fd
        self.cache: dict[tuple, CompiledFusion] = {}
        self.last: CompiledFusion | None = None
        self._lock = threading.Lock()

    def _get(self, inputs: list[Any], backend: str | None, device: Device | None) -> CompiledFusion:
        """The plan for `inputs`; `device` is None for execute (plan for the inputs' own
        device and check that this process can run the backend there)."""
        backend = backend or config.backend
        get_backend(backend)  # a FuserError naming the known ones
        entry = "execute" if device is None else "compile"
        try:
            key = (signature(inputs), backend, device.name if device else None)
        except Exception:
            self.fd.bind(inputs, entry)  # not a tensor, sparse...: bind names the input
            raise
        cf = self.cache.get(key)
        if cf is None and device is None:
            cf = self._planned_ahead(key, inputs, backend)
        if cf is None:
            with self._lock:
                cf = self.cache.get(key)
                if cf is None:
                    graph = self.fd.bind(inputs, entry)
                    if device is None and inputs:
                        _check_runnable(graph, inputs[0], backend)
                    cf = plan(
                        graph,
                        inputs,
                        self.fd.name,
                        backend,
                        device or get_device(None),
                        self.fd.relaxed_precision,
                        getattr(self.fd, "output_strides", None),
                    )
                    self.cache[key] = cf
                    _debug(cf, self.fd.name)
        self.last = cf
        return cf

    def _planned_ahead(self, key: tuple, inputs: list[Any], backend: str) -> CompiledFusion | None:
        """The plan compile() made ahead for meta tensors shaped, strided, typed and aligned
        as `inputs` are, for the device execute() would plan for (torch.compile plans each
        region so at lowering; its first call then does not plan it again), or None. Stored
        under `key` too, after the checks execute() makes of a fresh plan's inputs."""
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            return None
        # bind's device checks, which a fresh plan makes (meta tensors hold no data; one
        # device for all inputs): a call failing them plans afresh, and bind says why
        dev = inputs[0].device
        if dev.type == "meta" or any(t.device != dev for t in inputs):
            return None
        meta = torch.device("meta")
        ahead = (
            tuple((*sig[:3], meta, *sig[4:]) for sig in key[0]),
            backend,
            get_device(None).name,
        )
        cf = self.cache.get(ahead)
        if cf is None:
            return None
        _check_runnable(cf.pipeline.stages[0], inputs[0], backend)
        self.cache[key] = cf
        return cf

    def execute(self, inputs: list[torch.Tensor], backend: str | None) -> list[torch.Tensor]:
        cf = self._get(inputs, backend, None)
        return cf.run(inputs)

    def compile(self, inputs: list[Any], backend: str | None, device: str | None) -> list[Kernel]:
        return list(self._get(inputs, backend, get_device(device)).kernels.values())

    def last_kernels(self) -> list[Kernel]:
        return list(self.last.kernels.values()) if self.last else []

    def explain(self) -> str:
        if self.last is None:
            return "nothing compiled yet: call fd.execute(inputs) or fd.compile(inputs)"
        return self.last.explain()


def _debug(cf: CompiledFusion, name: str) -> None:
    debug_print(
        1,
        f"[fuser] {name}: {len(cf.kernels)} kernel(s), "
        f"{sum(1 for s in cf.segments if not s.fused)} ATen segment(s)",
    )
    debug_print(3, str(cf.pipeline))
    debug_print(2, cf.explain())
    if config.debug >= 4:
        for k in cf.kernels.values():
            print(k.source)


__all__ = ["FusionExecutor", "evaluate"]
