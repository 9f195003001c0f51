"""How a compiled Triton kernel is launched without Triton's Python wrappers.

A kernel's plan fixes its grid, its arguments' layouts and its compiled binary, so the
per-launch work Triton's JIT does (binding arguments, looking up the specialization,
then `CudaLauncher.__call__`, a Python frame that builds two scratch buffers) is known
in advance. Three ways to launch, decided once per compiled kernel (`direct_launch`):

- "triton-c" (the default): Triton's own compiled launcher (`CudaLauncher.launch`, C),
  called without its Python `__call__` frame.
- "static": torch's C++ launcher, `torch._C._StaticCudaLauncher._launch_kernel` (the one
  Inductor's generated code uses). It takes the function handle Triton already loaded,
  the grid, warps, shared memory, a string of argument types and the arguments.
- "python": `CudaLauncher.__call__`, Triton's Python launcher, as its JIT calls it (the
  fallback).

The first two skip Triton's scratch allocation, so they are used only for kernels that
need none (fuser's kernels never ask for it; a kernel that does falls back). Every way
takes a tensor's pointer as a plain int, which the call programs pass (`t.data_ptr()`):
given the tensor, a launcher calls data_ptr itself and asks the driver whether it is a
device pointer. Measured on an H200 host (benchmarks/launch_cost.py, a 3-tensor kernel):
a bare cuLaunchKernel through cuda.bindings 5.68 us; with tensors passed, "triton-c"
6.36, "static" 7.63, "python" 8.00; with pointers passed, "triton-c" 5.78 and "static"
5.71. `FUSER_LAUNCHER` picks one for an A/B; where the way asked for cannot launch a
kernel, the next that can does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fuser.config import config

# Triton signature type -> the static launcher's one-character code (torch's encoding)
_STATIC_TYPES = {
    "i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
    "u1": "I", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
    "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d",
}  # fmt: skip
WAYS = ("triton-c", "static", "python")


@dataclass(frozen=True)
class DirectLaunch:
    """One compiled kernel's launch, everything but its arguments fixed.

    Attributes:
        way: one of WAYS.
        call: the function called per launch.
        function: the CUfunction handle Triton loaded.
        grid: (x, y, z).
        keep: indices of the call's arguments the launcher takes (a constexpr is dropped
            for "static"; every argument for the Triton launchers, which skip them).
        types: "static" only: the launcher's argument type string (two trailing "O" for
            the scratch pointers every Triton 3.x CUDA kernel takes, passed as None).
        packed: "python"/"triton-c": Triton's packed metadata (warps, CTAs, shared).
        num_warps, shared: "static" only.
    """

    way: str
    call: Any
    function: int
    grid: tuple[int, int, int]
    keep: tuple[int, ...]
    types: str = ""
    packed: Any = None
    num_warps: int = 0
    shared: int = 0

    def __call__(self, stream: int, args: list) -> None:
        """Launch on `args` (the kernel's arguments in order, constexprs included)."""
        gx, gy, gz = self.grid
        if self.way == "static":
            kept = tuple(args[i] for i in self.keep) + (None, None)
            self.call(
                self.function, gx, gy, gz, self.num_warps, self.shared, self.types, kept, stream
            )
        elif self.way == "triton-c":
            f, m = self.function, self.packed
            self.call(gx, gy, gz, stream, f, 0, 0, None, None, m, None, None, None, *args)
        else:
            self.call(gx, gy, gz, stream, self.function, self.packed, None, None, None, *args)


def _wanted() -> str | None:
    way = config.launcher or None
    if way is not None and way not in WAYS:
        raise ValueError(f"FUSER_LAUNCHER={way!r}: choose one of {', '.join(WAYS)}")
    return way


def _plain(compiled: Any) -> str | None:
    """Why `compiled` needs Triton's full launcher (None: it does not)."""
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        return "it needs Triton's scratch memory"
    if getattr(meta, "launch_cooperative_grid", False) or getattr(meta, "launch_pdl", False):
        return "it is a cooperative or programmatic-dependent launch"
    if getattr(meta, "num_ctas", 1) != 1:
        return "it is a cluster launch"
    if any(str(t).startswith("tensordesc") for t in compiled.src.signature.values()):
        return "it takes tensor descriptors"
    return None


def _static(compiled: Any, nargs: int, grid: tuple) -> DirectLaunch | None:
    try:
        from torch._C import _StaticCudaLauncher
    except ImportError:
        return None
    sig = list(compiled.src.signature.values())
    if len(sig) != nargs:
        return None
    keep, types = [], []
    for i, ty in enumerate(sig):
        if ty == "constexpr":
            continue
        code = "O" if str(ty).startswith("*") else _STATIC_TYPES.get(str(ty))
        if code is None:
            return None
        keep.append(i)
        types.append(code)
    return DirectLaunch(
        "static", _StaticCudaLauncher._launch_kernel, compiled.function, grid, tuple(keep),
        types="".join(types) + "OO", num_warps=compiled.metadata.num_warps,
        shared=compiled.metadata.shared,
    )  # fmt: skip


def direct_launch(compiled: Any, nargs: int, grid: tuple, way: str | None = None) -> DirectLaunch:
    """The launch of Triton's CompiledKernel `compiled` (loaded: it launched once) on
    `nargs` arguments over `grid`, the fastest `way` allowed (FUSER_LAUNCHER's, or the
    first of WAYS this kernel and process can take)."""
    way = way or _wanted()
    grid3 = tuple((*grid, 1, 1)[:3])
    run = compiled.run
    every = tuple(range(nargs))
    packed = compiled.packed_metadata
    fallback = DirectLaunch("python", run, compiled.function, grid3, every, packed=packed)
    if way == "python" or _plain(compiled) is not None:
        return fallback
    launch = getattr(run, "launch", None)
    triton_c = None
    if launch is not None:
        triton_c = DirectLaunch("triton-c", launch, compiled.function, grid3, every, packed=packed)
    if way == "static" or (way is None and triton_c is None):
        return _static(compiled, nargs, grid3) or triton_c or fallback
    return triton_c or fallback
