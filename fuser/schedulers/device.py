"""What the schedulers know about a GPU, and the occupancy calculation.

Presets let a user choose and read schedules for a GPU they do not have; `current()`
reads the real one through torch when a GPU is present.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fuser.errors import FuserError


@dataclass(frozen=True)
class Device:
    name: str
    arch: int  # compute capability as 90, 80, ...
    sms: int
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024
    l2_bytes: int = 50 * 1024 * 1024
    warp_size: int = 32
    # registers are handed out per warp in units of 256 (CUDA occupancy calculator)
    reg_alloc_unit: int = 256
    dram_gbps: float = 3350.0

    def blocks_per_sm(self, threads: int, regs: int, smem: int = 0) -> int:
        """Resident blocks per SM for a kernel of `threads` threads using `regs` each."""
        warps = -(-threads // self.warp_size)
        regs_per_warp = (
            -(-max(regs, 1) * self.warp_size // self.reg_alloc_unit) * self.reg_alloc_unit
        )
        by_regs = self.regs_per_sm // (regs_per_warp * warps)
        by_threads = self.max_threads_per_sm // (warps * self.warp_size)
        by_smem = self.smem_per_sm // smem if smem else self.max_blocks_per_sm
        return max(0, min(by_regs, by_threads, by_smem, self.max_blocks_per_sm))

    def warps_per_sm(self, threads: int, regs: int, smem: int = 0) -> int:
        return self.blocks_per_sm(threads, regs, smem) * -(-threads // self.warp_size)


PRESETS = {
    "h100": Device("NVIDIA H100 80GB HBM3", 90, 132, l2_bytes=50 * 2**20, dram_gbps=3350.0),
    "h200": Device("NVIDIA H200", 90, 132, l2_bytes=60 * 2**20, dram_gbps=4800.0),
    "a100": Device(
        "NVIDIA A100-SXM4-80GB",
        80,
        108,
        smem_per_sm=164 * 1024,
        smem_per_block=163 * 1024,
        l2_bytes=40 * 2**20,
        dram_gbps=2039.0,
    ),
}


def current() -> Device:
    """The GPU torch sees, or the h100 preset when there is none (CPU interpreter runs)."""
    import torch

    if not torch.cuda.is_available():
        return replace(
            PRESETS["h100"], name="h100 preset (no GPU here: kernels run in Triton's interpreter)"
        )
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    base = PRESETS["h200" if "H200" in p.name else "h100" if p.major >= 9 else "a100"]
    return replace(
        base,
        name=p.name,
        arch=p.major * 10 + p.minor,
        sms=p.multi_processor_count,
        regs_per_sm=getattr(p, "regs_per_multiprocessor", base.regs_per_sm),
        max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", base.max_threads_per_sm),
        l2_bytes=getattr(p, "L2_cache_size", base.l2_bytes),
    )


def get_device(name: str | Device | None) -> Device:
    if isinstance(name, Device):
        return name
    if name is None:
        return current()
    key = name.lower()
    if key not in PRESETS:
        raise FuserError(f"unknown device preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[key]
