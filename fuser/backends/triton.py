"""The Triton backend: Triton source, compiled by Triton's JIT (or its CPU interpreter)."""

from __future__ import annotations

import math
from typing import Any

from fuser.backends.base import Backend, Limits, OuterModel
from fuser.codegen.triton.source import render_triton
from fuser.config import use_interpreter
from fuser.plan.kernel_plan import KernelPlan
from fuser.runtime import resources, triton_backend
from fuser.schedulers.registers import triton_registers


class TritonBackend(Backend):
    name = "triton"
    extension = "py"
    ahead_of_time = "warmup"
    gemm_template = True
    cast_groups = True
    # prefetching lost 5-7% at 2+ blocks/SM (12288, 16384) and won 12% at 1 (20480)
    # outer reductions, fitted (benchmarks/outer_fit.py) to two H100 sweeps: dy.float().sum(0)
    # at 8192x768, 8192x3072, 32768x3072 (benchmarks/results/h100-2026-11-25-outer-sweep/
    # sweep.jsonl; its kernels had no staged row loop yet) and the GELU backward's bias
    # gradient at 8192x768, 8192x3072, 16384x3072, 32768x3072 (benchmarks/results/
    # h100-2026-11-28-session12/1-gelu-bias-sweep). The column sum wants bytes in flight
    # and more warps than CUDA's stream (warps_exp), 4 rows a thread and one thread row
    # (tl.sum over a taller tile costs a shared-memory round trip a halving of thread rows
    # and a row a thread, combine_us). The GELU backward, ~55 instructions an element
    # against the column sum's ~8, wants warps to hide its math (32 a SM: 8 blocks of 4
    # warps at one row a thread, whose registers leave no more) and no masked lanes (768
    # columns in 1024-wide tiles issue a third more). Its choices come within 1.6-5.2% of
    # the fastest measured (median 2.2%; the constants before: 6.6-23.7%), the column
    # sum's are unchanged (0-6.5%), and none moves when any one constant moves by 25%
    # aligned_walk: one chunk an iteration (8 bf16 a thread), its head and tail loading
    # whole vectors (render._whole_vectors), and only where every full argument takes
    # whole vectors. H200 (benchmarks/results/h200-2026-11-28-session17/c, e), the one-pass
    # cross-entropy at 8192 x 50257 bf16 with the gradient in the logits' layout (what
    # torch.compile gives logits that are a graph input): 1764 -> 1986 GB/s (32768 rows
    # 1874 -> 2080, 32001 columns 1872 -> 2109); softmax bf16 8192 x 50257 / 32001 /
    # 20001: 1744 / 1831 / 1968 -> 1844 / 2086 / 2082. With an aligned gradient (element
    # stores at the true column) it lost, 2093 -> 1863; at 2 chunks an iteration (80
    # registers) it lost everywhere: cross-entropy 1926 against 2092, softmax 1635 against 1745
    limits = Limits(
        aligned_walk=True,
        aligned_walk_unroll=1,
        aligned_walk_all_args=True,
        staged_walks=True,
        masked_outer_tail=True,
        prefetch=True,
        prefetch_max_blocks_per_sm=1,
        looped_l2_hints=True,
        outer=OuterModel(
            in_flight_exp=0.25, warps=12.0, warps_exp=0.5, combine_us=0.25, overlap=6.0
        ),
    )

    def render(self, plan: KernelPlan) -> str:
        return render_triton(plan)

    def estimate(self, plan: KernelPlan) -> int:
        return triton_registers(plan)

    def compile(self, source: str, name: str, arch: str = "sm_90") -> Any:
        """The module holding the @triton.jit kernel; Triton compiles it at first launch."""
        return triton_backend.load_module(source, use_interpreter())

    def resources(self, kernel: Any, arch: str = "sm_90") -> dict:
        return {**resources.triton_resources(kernel, arch), "estimate": self.estimate(kernel.plan)}

    def sass(self, kernel: Any, arch: str = "sm_90") -> str:
        return resources.triton_sass(kernel, arch)

    def launch(self, kernel: Any, tensors: list[Any], checks: list[Any]) -> None:
        kernel._launch_triton(tensors, checks)

    def device_problem(self, device_type: str) -> str | None:
        return triton_backend.device_problem(device_type)

    def per_thread_preference(self, per_thread: int, threads_per_row: int) -> float:
        # H100 sweep of the seed fusion (benchmarks/results/h100-2026-11-21-sweep1): 8-32
        # elements a thread best; fewer leave loads unoverlapped, more grow registers
        if per_thread < 8:
            return 0.9
        if per_thread > 32:
            return 0.97 ** math.log2(per_thread / 32)
        return 1.0
