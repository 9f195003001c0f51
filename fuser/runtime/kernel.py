"""A compiled kernel: its spec, schedule and source, how to launch it, what it costs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fuser.codegen.triton.kernels import workspaces
from fuser.ir.dtypes import DType
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec


def accumulator_dtype(dtype: DType) -> torch.dtype:
    """The dtype reductions accumulate in (the generated kernels' _acc_dtype)."""
    if dtype == DType.float64:
        return torch.float64
    return torch.float32 if dtype.is_float else torch.int64


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
            self._compiled[self._grid3](*args)
            if self._finalize is not None:
                self._finalize[(self._grid3[0], 1, 1)](*args)
            return
        from fuser.runtime.triton_backend import load_module

        s = self.schedule
        interp = tensors[0].device.type != "cuda"
        if self._module is None:
            self._module = load_module(self.source, interp)
        first = getattr(self._module, self.name)[s.grid](*args, num_warps=s.num_warps)
        fin = None
        if self.workspaces:
            fin = getattr(self._module, self.name + "_finalize")[(s.grid[0],)](*args, num_warps=4)
        if not interp and first is not None:
            self._compiled, self._finalize = first, fin

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
