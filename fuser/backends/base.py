"""What a backend is: the stages after the plan (render -> compile -> launch), the
register estimate the schedulers choose with, and the limits they respect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fuser.plan.kernel_plan import KernelPlan


@dataclass(frozen=True)
class OuterModel:
    """The outer (column) reduction's cost model constants for one backend's kernels
    (fuser.schedulers.outer.cost). The main pass streams its bytes in

        memory = bytes / (copy_fraction x DRAM bandwidth x min(1, F / in_flight_kb) ** in_flight_exp
                                                        x min(1, W / warps) ** warps_exp)

    (F: KB of loads and stores in flight a SM, W: resident warps a SM) and, where
    `overlap` is set, issues its instructions in

        math = covered elements x instructions an element
               / (SMs x issue_per_us x min(1, W / math_warps) ** math_warps_exp)

    (outer.math_per_element: the producer's ops, the loads and stores, the accumulate;
    masked lanes and rows issue too), the two overlapping as (memory^p + math^p)^(1/p),
    p = `overlap`. Plus `combine_us` a wave of blocks for each halving of the block's
    thread rows and each row a thread accumulates (the epilogue's cross-thread combine of
    its fp32 tile), `launch_us` for the main launch's ramp and `finalize_us` for a split's
    second launch.

    The defaults are fitted to the CUDA kernels' H100 sweep
    (benchmarks/results/h100-2026-11-25-outer-sweep/sweep.jsonl, 445 timed schedules of
    dy.float().sum(0) at 8192x768, 8192x3072, 32768x3072): the model's choice is within
    4% of the fastest measured schedule at each shape (the sweep's run-to-run noise is
    ~5%). They leave the math unpriced (overlap 0): no CUDA kernel with a producer's math
    has been swept (benchmarks/outer_fit.py reports the fit)."""

    copy_fraction: float = 0.9  # the copy ceiling: 3029 of 3350 GB/s measured
    in_flight_kb: float = 32.0
    in_flight_exp: float = 0.35
    warps: float = 16.0
    warps_exp: float = 0.3
    combine_us: float = 0.0  # CUDA combines thread rows with warp shuffles: lost in noise
    launch_us: float = 5.0
    finalize_us: float = 2.0
    # lane instructions a SM issues a microsecond: an H100 SM's 4 schedulers x 32 lanes
    # x 1.755 GHz (its clock under load)
    issue_per_us: float = 224.6e3
    math_warps: float = 20.0
    math_warps_exp: float = 0.6
    overlap: float = 0.0  # 0: the math is not priced


@dataclass(frozen=True)
class Limits:
    """What a backend's kernels can do, for the schedulers."""

    max_threads: int = 1024
    vector_bytes: int = 16  # widest access per thread
    # a split column reduction may mask the row's last partial vector (False: the vector
    # must divide the columns)
    masked_outer_tail: bool = True
    # the renderer writes the prefetching row loop (Schedule.programs), and the heuristic
    # may choose it where at most this many blocks of the row kernel fit on an SM
    prefetch: bool = True
    prefetch_max_blocks_per_sm: int = 1
    # the outer reduction's cost model (its docstring cites the measurements)
    outer: OuterModel = OuterModel()
    # the looped renderer walks rows that start unaligned from an aligned column
    # (Schedule.align_walk) at registers the estimate predicts
    aligned_walk: bool = False
    # chunks an iteration of that walk (0: the looped heuristic's), and whether it is taken
    # only where every full argument, outputs too, starts at the walk's shift
    aligned_walk_unroll: int = 0
    aligned_walk_all_args: bool = False
    # the looped renderer pipelines a row walk's loads through shared memory (cp.async,
    # plan.walk_stages), which takes accesses of 4 bytes and up
    staged_walks: bool = False
    # a looped kernel reading its row twice may take more warps a block so that its
    # resident rows fit in the L2 (heuristics._l2_warps). Off until the looped register
    # estimate is calibrated at 16 and 32 warps: ptxas (sm_90) gave softmax bf16 50257 at
    # 32 warps 44 registers (CUDA, est. 30: 1 block/SM, not 2) and cross-entropy bf16
    # 128256 at 16 warps 64 (CUDA, est. 78) / 102 (Triton, est. 82)
    l2_rows_cap: bool = False
    # the looped renderer gives a walk's loads L2 hints (KernelPlan.walk_evict), so a row
    # read twice comes from L2 the second time: a persistent row that fits one block a SM
    # is walked instead (heuristics.schedule_inner)
    looped_l2_hints: bool = False


class Backend:
    """One code generator. Subclasses set `name`, `extension`, `limits` and implement the
    stages; schedulers ask the object, nothing compares backend names."""

    name: str = ""
    extension: str = ""  # of its source files
    limits: Limits = Limits()
    # how a graph's kernels are compiled before its first call (fuser/runtime/precompile.py):
    # "threads": compile() in a pool of threads (the compiler releases the GIL);
    # "warmup": Triton's JIT warm-up under its async compile mode; "": at first launch
    ahead_of_time: str = ""
    # whether it renders the GEMM template (fuser/schedulers/gemm.py); without one,
    # matmuls go to cuBLAS (fuser/dynamo/gemm.py)
    gemm_template: bool = False
    # whether the call program may launch its lone casts together in one Triton kernel
    # (fuser/runtime/cast_group.py, fuser/dynamo/program/casts.py): a backend whose
    # kernels are Triton's, launched on the same stream
    cast_groups: bool = False

    def render(self, plan: KernelPlan) -> str:
        """The kernel's source (with its finalize kernel, if the plan has one)."""
        raise NotImplementedError

    def estimate(self, plan: KernelPlan) -> int:
        """Registers per thread the compiled kernel is expected to use."""
        raise NotImplementedError

    def compile(self, source: str, name: str, arch: str = "sm_90") -> Any:
        """The source compiled (or loaded) for `arch`."""
        raise NotImplementedError

    def resources(self, kernel: Any, arch: str = "sm_90") -> dict:
        """Registers, stack, spill and shared-memory bytes the real compiler reports for a
        rendered Kernel, and this backend's estimate beside them; no GPU needed."""
        raise NotImplementedError

    def sass(self, kernel: Any, arch: str = "sm_90") -> str:
        """A rendered Kernel's machine code for `arch`; no GPU needed."""
        raise NotImplementedError

    def launch(self, kernel: Any, tensors: list[Any], checks: list[Any]) -> None:
        """Run a rendered Kernel on `tensors` on torch's current stream."""
        raise NotImplementedError

    def device_problem(self, device_type: str) -> str | None:
        """Why this process cannot run this backend's kernels on `device_type`, or None."""
        raise NotImplementedError

    def per_thread_preference(self, per_thread: int, threads_per_row: int) -> float:
        """Relative throughput of a persistent row with `per_thread` elements a thread,
        as measured for this backend's kernels (1.0: no preference)."""
        return 1.0

    def __repr__(self) -> str:
        return f"<backend {self.name}>"
