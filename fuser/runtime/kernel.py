"""A compiled kernel: its spec, schedule and source, how to launch it, what it costs."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from fuser.codegen.triton.kernels import workspaces
from fuser.ir.dtypes import DType, accumulator
from fuser.runtime.triton_backend import TRITON_OPTIONS
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec


def accumulator_dtype(dtype: DType) -> torch.dtype:
    """The dtype reductions accumulate in, as a torch dtype."""
    return accumulator(dtype).torch


def _raw_stream(index: int) -> int:
    """torch's current stream on device `index`, as the raw handle launchers take."""
    return torch._C._cuda_getCurrentRawStream(index)


_runtime_knobs: Any = None  # triton.knobs.runtime, once Triton has compiled a kernel


def _launch_hooked() -> bool:
    """Whether something (a profiler such as proton) hooked Triton's launches: then they
    go through Triton's own wrapper, which calls the hooks. Triton 3.6 keeps the hooks in
    HookChain objects (never None; empty when nothing is hooked), older versions None."""
    enter, leave = _runtime_knobs.launch_enter_hook, _runtime_knobs.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def _direct_launches(first: Any, grid3: tuple, fin: Any) -> list[tuple] | None:
    """(launcher, function, packed metadata, grid) of a compiled kernel and its finalize
    pass: what Triton's own launch wrapper passes to the launcher on every call. None
    when this Triton's CompiledKernel does not have them (the wrapper is used then)."""
    global _runtime_knobs
    try:
        from triton import knobs

        _runtime_knobs = knobs.runtime
        out = [(first.run, first.function, first.packed_metadata, grid3)]
        if fin is not None:
            out.append((fin.run, fin.function, fin.packed_metadata, (grid3[0], 1, 1)))
        return out
    except AttributeError:
        return None


@dataclass
class Kernel:
    spec: KernelSpec
    schedule: Schedule
    source: str
    backend: str
    _module: Any = field(default=None, repr=False)
    _resources: dict = field(default_factory=dict, repr=False)
    _compiled: Any = field(default=None, repr=False)
    _finalize: Any = field(default=None, repr=False)
    _cuda_launchers: dict = field(default_factory=dict, repr=False)  # per device index
    _fast: Any = field(default=None, repr=False)  # Triton's launcher, called directly

    @property
    def name(self) -> str:
        return self.spec.name

    def __post_init__(self) -> None:
        # derived once here, not per launch: the hot path only reads them
        self.shapes = [[int(d) for d in a.value.shape] for a in self.spec.args]
        self.arg_plan = [
            (a.is_output, a.value.id, shape, a.dtype.torch)
            for a, shape in zip(self.spec.args, self.shapes)
        ]
        self.workspaces = workspaces(self.spec, self.schedule)
        # a compiled kernel's launcher wants all three grid dimensions
        self._grid3 = (*self.schedule.grid, 1, 1)[:3]
        self.workspace_dtypes = (
            [accumulator_dtype(n.inputs[0].dtype) for n in self.spec.reductions]
            if self.workspaces
            else []
        )

    def launch(self, tensors: list[torch.Tensor]) -> None:
        """Run on `tensors` (the spec's args, in order) on torch's current stream."""
        if self.backend == "cuda":
            from fuser.runtime.cuda_backend import launch_cuda

            launch_cuda(self, tensors)  # allocates its own workspaces
            return
        if self.workspaces:
            args = [*tensors, *self._workspace_tensors(tensors[0].device), self.spec.rows]
        else:
            args = [*tensors, self.spec.rows]
        if self._compiled is not None:
            # the plan is specific to shapes, strides and alignment, so Triton's compiled
            # kernel for the first launch fits every later one: skip the JIT's re-binding
            # and, unless a profiler hooked Triton's launches, its launch wrapper too
            if self._fast is not None and not _launch_hooked():
                stream = _raw_stream(tensors[0].get_device())
                for run, function, packed, (gx, gy, gz) in self._fast:
                    run(gx, gy, gz, stream, function, packed, None, None, None, *args)
                return
            self._compiled[self._grid3](*args)
            if self._finalize is not None:
                self._finalize[(self._grid3[0], 1, 1)](*args)
            return
        from fuser.runtime.triton_backend import load_module

        s = self.schedule
        interp = tensors[0].device.type != "cuda"
        if self._module is None:
            self._module = load_module(self.source, interp)
        # the JIT compiles and loads for the current device, and later calls use the
        # tensors' device's stream: make them the same device
        on_device = torch.cuda.device(tensors[0].device) if not interp else nullcontext()
        with on_device:
            kernel = getattr(self._module, self.name)
            first = kernel[s.grid](*args, num_warps=s.num_warps, **TRITON_OPTIONS)
            fin = None
            if self.workspaces:
                finalize = getattr(self._module, self.name + "_finalize")
                fin = finalize[(s.grid[0],)](*args, num_warps=4, **TRITON_OPTIONS)
        if not interp and first is not None:
            self._compiled, self._finalize = first, fin
            self._fast = _direct_launches(first, self._grid3, fin)

    def _workspace_tensors(self, device: torch.device) -> list[torch.Tensor]:
        n = self.schedule.split_rows * self.spec.cols
        return [torch.empty(n, dtype=dt, device=device) for dt in self.workspace_dtypes]

    def resources(self, arch: str = "sm_90") -> dict:
        """Registers, spill/stack bytes and shared memory the real compiler reports."""
        if arch not in self._resources:
            from fuser.runtime.resources import kernel_resources

            self._resources[arch] = kernel_resources(self, arch)
        return self._resources[arch]

    def explain(self) -> str:
        lines = [
            f"kernel {self.name} [{self.backend}] {self.spec.segment.ops_summary()}",
            f"  domain {self.spec.rows} x {self.spec.cols}, "
            f"{self.spec.bytes_moved() / 1e6:.2f} MB moved",
        ]
        lines += ["  " + ln for ln in self.schedule.explain().splitlines()]
        for arch, r in self._resources.items():
            lines.append(
                f"  compiler ({arch}): {r['registers']} registers "
                f"(estimate {r.get('estimate', self.schedule.estimate.registers)}), "
                f"stack {r['stack']} B, spills {r['spill_bytes']} B, shared {r['shared']} B"
            )
        return "\n".join(lines)
