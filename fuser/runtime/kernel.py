"""A compiled kernel: its spec, schedule and source, how to launch it, what it costs."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from fuser.backends.registry import get_backend
from fuser.errors import InputError
from fuser.explanation import Explanation
from fuser.frontend.inputs import describe
from fuser.ir.dtypes import DType, accumulator
from fuser.plan.build import make_plan
from fuser.plan.kernel_plan import KernelPlan
from fuser.runtime import timing
from fuser.runtime.checks import check_args, raise_claimed
from fuser.runtime.launchers import direct_launch
from fuser.runtime.timing import KernelTime
from fuser.runtime.triton_backend import TRITON_OPTIONS, WARMED, load_module
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import Arg, KernelSpec


def accumulator_dtype(dtype: DType) -> torch.dtype:
    """The dtype reductions accumulate in, as a torch dtype."""
    return accumulator(dtype).torch


def raw_stream(index: int) -> int:
    """torch's current stream on device `index`, as the raw handle launchers take."""
    return torch._C._cuda_getCurrentRawStream(index)


_runtime_knobs: Any = None  # triton.knobs.runtime, once Triton has compiled a kernel


def launch_hooked() -> bool:
    """Whether something (a profiler such as proton) hooked Triton's launches: then they
    go through Triton's own wrapper, which calls the hooks. Triton 3.6 keeps the hooks in
    HookChain objects (never None; empty when nothing is hooked), older versions None."""
    global _runtime_knobs
    if _runtime_knobs is None:
        from triton import knobs

        _runtime_knobs = knobs.runtime
    enter, leave = _runtime_knobs.launch_enter_hook, _runtime_knobs.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def _direct_launches(
    first: Any, grid3: tuple, fin: Any, fin_grid3: tuple, nargs: int
) -> list | None:
    """The DirectLaunch (runtime/launchers.py) of a compiled kernel and of its finalize
    pass, called with `nargs` arguments. None when this Triton's CompiledKernel does not
    have what they need (Triton's launch wrapper is used then)."""
    global _runtime_knobs
    try:
        from triton import knobs

        _runtime_knobs = knobs.runtime
        out = [direct_launch(first, nargs, grid3)]
        if fin is not None:
            out.append(direct_launch(fin, nargs, fin_grid3))
        return out
    except AttributeError:
        return None


def _jit_cache_size(kernel: Any) -> int:
    """How many specialisations Triton's JIT holds compiled for `kernel` on the current
    device (its per-device cache; 0 where this Triton keeps it elsewhere)."""
    try:
        caches = kernel.device_caches
        device = torch.cuda.current_device()
        return len(caches[device][0]) if device in caches else 0
    except (AttributeError, IndexError, TypeError):
        return 0


def device_problem(backend: str, device_type: str) -> str | None:
    """Why this process cannot run `backend`'s kernels on tensors of `device_type`, or None."""
    return get_backend(backend).device_problem(device_type)


def _arg_problem(a: Arg, shape: list[int], t: Any, first: torch.Tensor) -> str | None:
    """What is wrong with `t` as kernel argument `a` (None: nothing); `first` is argument
    0, already checked."""
    want = f"a {a.dtype.torch} tensor of shape {shape}"
    if not isinstance(t, torch.Tensor):
        return f"is {describe(t)}, not a tensor; expected {want}"
    if t.layout != torch.strided or t.dtype != a.dtype.torch or list(t.shape) != shape:
        return f"is {describe(t)}; expected {want}"
    if t.is_meta:
        return "is on the meta device, which holds no data"
    if t.device != first.device:
        return f"is on {t.device} but argument 0 is on {first.device}; expected one device"
    ptr = t.data_ptr()
    if ptr and ptr & -ptr < a.align:
        return (
            f"is aligned to {ptr & -ptr} bytes; the kernel was compiled for {a.align} "
            "(its vector accesses need them)"
        )
    if a.is_output and not t.is_contiguous():
        return "is not contiguous; the kernel writes its outputs contiguous"
    return None


@dataclass
class Kernel:
    """One generated kernel: what `fd.kernels` lists and `fd.compile` returns. Its repr is
    one line; the source is `.source`, the schedule's reasons `.explain()`.

    Attributes:
        spec: the KernelSpec it was generated for: the segment (its ops and [rows, cols]
            layout) and, per argument, the value, kind, 2D strides and pointer alignment
            the kernel is specialized to.
        schedule: the Schedule chosen for it; `schedule.kind` names the scheduler
            (pointwise, inner_persistent, inner_looped, outer_reduction).
        source: the generated Triton or CUDA C++ source, with a header saying why.
        backend: "triton" or "cuda".
        name: the kernel's function name in the source.
        shapes: per argument, in `spec.args` order (inputs, then outputs), its shape.
        arg_plan: per argument, (is_output, value id, shape, torch dtype): what launch
            takes, outputs included (allocate them contiguous).
        workspaces: the scratch buffers a split outer reduction needs (launch allocates
            them); empty otherwise.
        workspace_dtypes: their dtypes.
    """

    spec: KernelSpec
    schedule: Schedule
    source: str
    backend: str
    plan: KernelPlan | None = field(default=None, repr=False)  # what the source prints
    _module: Any = field(default=None, repr=False)
    _resources: dict = field(default_factory=dict, repr=False)
    _compiled: Any = field(default=None, repr=False)
    _finalize: Any = field(default=None, repr=False)
    _cuda_launchers: dict = field(default_factory=dict, repr=False)  # per device index
    _fast: Any = field(default=None, repr=False)  # Triton's launcher, called directly
    _records: dict = field(default_factory=dict, repr=False)  # per device: check_args

    @property
    def name(self) -> str:
        """The kernel's function name in the source (the fusion's name, _k, the segment)."""
        return self.spec.name

    def __repr__(self) -> str:
        return (
            f"<Kernel {self.name} [{self.backend}] {self.schedule.short()}, "
            f"domain {self.spec.rows} x {self.spec.cols}>"
        )

    def __post_init__(self) -> None:
        # derived once here, not per launch: the hot path only reads them
        self.shapes = [[int(d) for d in a.value.shape] for a in self.spec.args]
        self.arg_plan = [
            (a.is_output, a.value.id, shape, a.dtype.torch)
            for a, shape in zip(self.spec.args, self.shapes)
        ]
        if self.plan is None:
            self.plan = make_plan(self.spec, self.schedule)
        self.workspaces = [ws.name for ws in self.plan.workspaces]
        # a compiled kernel's launcher wants all three grid dimensions
        self._grid3 = (*self.plan.grid, 1, 1)[:3]
        self._fin_grid3 = (*self.plan.finalize_grid, 1, 1)[:3]
        self.workspace_dtypes = [
            accumulator_dtype(ws.reduction.inputs[0].dtype) for ws in self.plan.workspaces
        ]

    def launch(self, tensors: list[torch.Tensor]) -> None:
        """Run on `tensors`, the spec's args in order (inputs, then the outputs it writes),
        on torch's current stream. Their types, dtypes, shapes, device and alignment are
        checked first (an InputError names the argument); input strides are not: pass
        inputs laid out as the ones the kernel was compiled from."""
        self._check_args(tensors)
        self.launch_unchecked(tensors)

    def _check_args(self, tensors: Any) -> None:
        args = self.spec.args
        if not isinstance(tensors, (list, tuple)) or len(tensors) != len(args):
            names = ", ".join(f"{a.name} ({'out' if a.is_output else 'in'})" for a in args)
            got = len(tensors) if isinstance(tensors, (list, tuple)) else describe(tensors)
            raise InputError(
                f"kernel {self.name}: launch takes a list of {len(args)} tensors ({names}), "
                f"got {got}"
            )
        for i, (a, shape, t) in enumerate(zip(args, self.shapes, tensors)):
            problem = _arg_problem(a, shape, t, tensors[0])
            if problem:
                role = "output" if a.is_output else "input"
                raise InputError(f"kernel {self.name}: argument {i} ({a.name}, {role}) {problem}")
        problem = device_problem(self.backend, tensors[0].device.type) if tensors else None
        if problem:
            raise InputError(
                f"kernel {self.name}: the arguments are on {tensors[0].device}, and {problem}"
            )

    def launch_unchecked(self, tensors: list[torch.Tensor]) -> None:
        """launch without the argument checks: for the executor, whose plan built
        `tensors`. A kernel with check_index nodes also takes its error record and the
        flag (fuser/runtime/checks.py); on CPU it has finished here, and a bad index
        raises at once."""
        checks = check_args(self, tensors[0].device) if self.spec.checks else []
        get_backend(self.backend).launch(self, tensors, checks)
        if checks and tensors[0].device.type != "cuda":
            raise_claimed(self, checks[0])

    def _launch_triton(self, tensors: list[torch.Tensor], checks: list[torch.Tensor]) -> None:
        if self.workspaces:
            work = self._workspace_tensors(tensors[0].device)
            args = [*tensors, *work, *checks, self.spec.rows]
        else:
            args = [*tensors, *checks, self.spec.rows]
        if self._compiled is not None:
            # the plan is specific to shapes, strides and alignment, so Triton's compiled
            # kernel for the first launch fits every later one: skip the JIT's re-binding
            # and, unless a profiler hooked Triton's launches, its launch wrapper too
            if self._fast is not None and not launch_hooked():
                stream = raw_stream(tensors[0].get_device())
                for launch in self._fast:
                    launch(stream, args)
                return
            self._compiled[self._grid3](*args)
            if self._finalize is not None:
                self._finalize[self._fin_grid3](*args)
            return
        s = self.plan
        interp = tensors[0].device.type != "cuda"
        if self._module is None:
            self._module = load_module(self.source, interp)
        # the JIT compiles and loads for the current device, and later calls use the
        # tensors' device's stream: make them the same device
        on_device = torch.cuda.device(tensors[0].device) if not interp else nullcontext()
        t0 = time.perf_counter()
        with on_device:
            kernel = getattr(self._module, self.name)
            compiled_before = _jit_cache_size(kernel)
            first = kernel[s.grid](*args, num_warps=s.num_warps, **TRITON_OPTIONS)
            fin = None
            if self.workspaces:
                finalize = getattr(self._module, self.name + "_finalize")
                fin = finalize[self._fin_grid3](
                    *args, num_warps=self.plan.finalize_warps, **TRITON_OPTIONS
                )
        if not interp:  # the JIT compiled it here, unless precompile.py warmed it up
            origin = "warmed up" if self.source in WARMED else "JIT (Triton's cache or compiled)"
            if self.source in WARMED and _jit_cache_size(kernel) > compiled_before:
                # the warm-up compiled another specialisation (an argument's alignment or
                # an integer's divisibility differed): this launch compiled its own
                origin = "warmed up, but compiled again at its first launch"
            timing.kernel(KernelTime(self.name, "triton", origin, time.perf_counter() - t0))
        if not interp and first is not None:
            self._compiled, self._finalize = first, fin
            self._fast = _direct_launches(first, self._grid3, fin, self._fin_grid3, len(args))

    def _workspace_tensors(self, device: torch.device) -> list[torch.Tensor]:
        n = self.plan.split_rows * self.spec.cols
        return [torch.empty(n, dtype=dt, device=device) for dt in self.workspace_dtypes]

    def resources(self, arch: str = "sm_90") -> dict:
        """Registers, spill/stack bytes and shared memory the real compiler reports."""
        if arch not in self._resources:
            self._resources[arch] = get_backend(self.backend).resources(self, arch)
        return self._resources[arch]

    def explain(self) -> Explanation:
        """Its ops, domain, bytes moved, schedule with reasons and estimate, and the
        compiler's figures for each architecture resources() was asked for."""
        lines = [
            f"kernel {self.name} [{self.backend}] {self.spec.segment.ops_summary()}",
            f"  domain {self.spec.rows} x {self.spec.cols}, "
            f"{self.spec.bytes_moved() / 1e6:.2f} MB moved",
        ]
        lines += ["  " + ln for ln in self.schedule.explain().splitlines()]
        if self.plan is not None:
            lines += ["  " + ln for ln in self.plan.text().splitlines()]
        for arch, r in self._resources.items():
            lines.append(
                f"  compiler ({arch}): {r['registers']} registers "
                f"(estimate {r.get('estimate', self.schedule.estimate.registers)}), "
                f"stack {r['stack']} B, spills {r['spill_bytes']} B, shared {r['shared']} B"
            )
        return Explanation("\n".join(lines))
