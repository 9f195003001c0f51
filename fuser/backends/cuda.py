"""The CUDA C++ backend: CUDA source compiled by NVRTC (or run in the g++ emulator)."""

from __future__ import annotations

from typing import Any

from fuser.backends.base import Backend, Limits
from fuser.codegen.cuda.source import render_cuda
from fuser.plan.kernel_plan import KernelPlan
from fuser.runtime import cuda_backend, resources
from fuser.schedulers.registers import cuda_registers


class CudaBackend(Backend):
    name = "cuda"
    extension = "cu"
    ahead_of_time = "threads"  # NVRTC releases the GIL
    # the CUDA split reduction moves whole vectors of partial sums (no masked tail)
    # prefetching is considered up to 2 blocks/SM (the CUDA model's 90% margin puts
    # 8192x20480 there, where prefetching measured 0.355 -> 0.27 ms on the H100) and taken
    # only where it costs no resident block (heuristics.schedule_inner)
    # aligned_walk: ptxas (sm_90) compiled the cross-entropy bf16 50257 walk within the
    # estimate's tolerance (est. 78, tests/test_online.py), and the emulator checks every
    # packed access of it for alignment
    limits = Limits(
        masked_outer_tail=False, prefetch=True, prefetch_max_blocks_per_sm=2, aligned_walk=True
    )

    def render(self, plan: KernelPlan) -> str:
        return render_cuda(plan)

    def estimate(self, plan: KernelPlan) -> int:
        return cuda_registers(plan)

    def compile(self, source: str, name: str, arch: str = "sm_90") -> bytes:
        """The cubin, through NVRTC (cached on disk)."""
        return cuda_backend.compile_cubin(source, name, arch)

    def resources(self, kernel: Any, arch: str = "sm_90") -> dict:
        return {**resources.cuda_resources(kernel, arch), "estimate": self.estimate(kernel.plan)}

    def sass(self, kernel: Any, arch: str = "sm_90") -> str:
        return resources.cuda_sass(kernel, arch)

    def launch(self, kernel: Any, tensors: list[Any], checks: list[Any]) -> None:
        cuda_backend.launch_cuda(kernel, tensors, checks)  # allocates its own workspaces

    def device_problem(self, device_type: str) -> str | None:
        return cuda_backend.device_problem(device_type)

    def per_thread_preference(self, per_thread: int, threads_per_row: int) -> float:
        # CUDA sweep (h100-2026-11-22): 12-32 elements per thread best on short rows; 40
        # (five 16-byte vectors, 64 threads a row) 10-16% slower at 1280 and 2560, 8 about
        # 6% slower at 1024 and 2048; rows of 512+ threads take 40 well (20480)
        if per_thread < 12:
            return 0.93
        if per_thread > 32 and threads_per_row < 256:
            return 0.85
        return 1.0
