"""A compiled kernel: its spec, schedule and source, how to launch it, what it costs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fuser.codegen.triton.kernels import workspaces
from fuser.schedulers.schedule import Schedule
from fuser.schedulers.spec import KernelSpec


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

    @property
    def shapes(self) -> list[list[int]]:
        """The logical shape of every argument (outputs are allocated with these)."""
        if not hasattr(self, "_shapes"):
            self._shapes = [[int(d) for d in a.value.shape] for a in self.spec.args]
        return self._shapes

    @property
    def workspaces(self) -> list[str]:
        return workspaces(self.spec, self.schedule)

    def launch(self, tensors: list[torch.Tensor]) -> None:
        """Run on `tensors` (the spec's args, in order) on torch's current stream."""
        if self.backend == "cuda":
            from fuser.runtime.cuda_backend import launch_cuda

            launch_cuda(self, tensors)
            return
        from fuser.runtime.triton_backend import load_module

        s = self.schedule
        args = [*tensors, *self._workspace_tensors(tensors[0].device), self.spec.rows]
        if self._compiled is not None:
            # the plan is specific to shapes, strides and alignment, so Triton's compiled
            # kernel for the first launch fits every later one: skip the JIT's re-binding
            # a compiled kernel's launcher wants all three grid dimensions
            self._compiled[(*s.grid, 1, 1)[:3]](*args)
            if self._finalize is not None:
                self._finalize[(s.grid[0], 1, 1)](*args)
            return
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
        out = []
        for red in self.spec.reductions if self.workspaces else ():
            x = red.inputs[0].dtype
            dt = (
                torch.float64
                if x.value == "float64"
                else torch.float32
                if x.is_float
                else torch.int64
            )
            out.append(
                torch.empty(self.schedule.split_rows * self.spec.cols, dtype=dt, device=device)
            )
        return out

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
                f"(estimate {self.schedule.estimate.registers}), "
                f"stack {r['stack']} B, spills {r['spill_bytes']} B, shared {r['shared']} B"
            )
        return "\n".join(lines)
