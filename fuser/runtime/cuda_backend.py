"""Compile generated CUDA C++ with NVRTC, cache the cubin, launch it on torch's stream.

NVRTC comes from NVIDIA's cuda-python (`cuda.core`, else `cuda.bindings.nvrtc`) and the
`nvidia-cuda-nvrtc` wheel, so compiling needs no CUDA toolkit and no GPU: that is how
`Kernel.resources()` reads registers on a CPU machine. Cubins are cached in memory and on
disk (under fuser.config's cache dir), keyed by the source, the architecture and the
compiler's version; a corrupt or foreign entry is rebuilt.

Launching needs an NVIDIA GPU. The kernel runs on torch's current stream, with the
tensors' data pointers (storage offset included) as arguments.
"""

from __future__ import annotations

import base64
import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

from fuser.errors import CompileError, FuserError
from fuser.runtime import timing
from fuser.runtime.cache import digest, load_entry, store_entry, versions
from fuser.runtime.cuda_emulator import emulate
from fuser.runtime.timing import KernelTime

# "auto" and "bindings" launch through a prepared cuda.bindings driver call (fast);
# "core" through cuda.core's general launch (tests compare the two)
LAUNCHER = "auto"
COMPILER = "auto"
# CPU tensors run through the g++ emulator (fuser/codegen/cuda/emulate.py) when set;
# otherwise backend="cuda" on a machine without a GPU is an error
EMULATE_ON_CPU = False

# kernels name every schedule number as a constexpr, used or not: no warning for those
UNUSED_VARIABLE = 177

_lock = threading.Lock()
_cubins: dict[str, bytes] = {}
_functions: dict[tuple[str, int, str], Any] = {}
_streams: dict[int, Any] = {}


@dataclass(frozen=True)
class CompileStats:
    """Where a cubin came from and how long that took (the benchmark reports it)."""

    source: str  # "nvrtc" | "disk" | "memory"
    seconds: float


last_compile: dict[str, CompileStats] = {}


def numbered(source: str) -> str:
    """The source with line numbers, as compile errors show it."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i + 1:>{width}} | {line}" for i, line in enumerate(lines))


_INSTALL = "pip install cuda-core cuda-bindings nvidia-cuda-nvrtc (or fuser[cuda])"


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise FuserError(
            f"backend='cuda' needs NVRTC through cuda-python: {_INSTALL} ({e})"
        ) from None
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise FuserError(f"NVRTC is not usable here: nvrtcVersion() returned {err}")
    return f"{major}.{minor}"


def _options(arch: str) -> list[str]:
    # --fmad=false: no multiply-add contraction across ops eager rounds one by one (see
    # triton_backend.TRITON_OPTIONS); _nvrtc_core passes the same as fma=False
    return [f"-arch={arch}", "-std=c++17", "--fmad=false", f"-diag-suppress={UNUSED_VARIABLE}"]


def _core_options(arch: str) -> dict[str, Any]:
    """cuda.core's ProgramOptions for what `_options` says to the bindings path."""
    return {
        "arch": arch,
        "std": "c++17",
        "diag_suppress": [UNUSED_VARIABLE],
        "fma": False,  # as --fmad=false in _options: NVRTC contracts by default
    }


def _nvrtc_core(source: str, name: str, arch: str) -> bytes:
    from cuda.core import Program, ProgramOptions

    opts = ProgramOptions(name=f"{name}.cu", **_core_options(arch))
    try:
        return bytes(Program(source, "c++", opts).compile("cubin").code)
    except Exception as e:  # cuda.core raises its own NVRTCError carrying the log
        if "NVRTC_ERROR_COMPILATION" in str(e) or "compilation log" in str(e):
            raise _compile_error(name, arch, source, str(e)) from None
        raise


def _nvrtc_bindings(source: str, name: str, arch: str) -> bytes:
    from cuda.bindings import nvrtc

    def check(result: tuple) -> Any:
        err, *rest = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise FuserError(f"NVRTC failed ({err}) while compiling {name}")
        return rest[0] if len(rest) == 1 else rest

    prog = check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []))
    try:
        opts = [o.encode() for o in _options(arch)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = check(nvrtc.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            check(nvrtc.nvrtcGetProgramLog(prog, log))
            raise _compile_error(name, arch, source, log.decode(errors="replace"))
        size = check(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin))
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_error(name: str, arch: str, source: str, log: str) -> CompileError:
    return CompileError(
        f"NVRTC could not compile kernel {name} for {arch}:\n{log.strip(chr(0)).strip()}\n\n"
        f"generated source:\n{numbered(source)}"
    )


def _nvrtc(source: str, name: str, arch: str) -> bytes:
    if COMPILER in ("auto", "core"):
        try:
            return _nvrtc_core(source, name, arch)
        except (ImportError, AttributeError, TypeError):
            # cuda.core missing, or a version with another API: the plain bindings do it
            if COMPILER == "core":
                raise
    return _nvrtc_bindings(source, name, arch)


def cubin_key(source: str, arch: str) -> str:
    """The cache key of a cubin: everything that changes the binary. The source, the
    architecture (the device's capability), NVRTC's version (the CUDA version compiling),
    the compiler path and its options (a cubin made with others, FMA contraction, is
    stale) and the versions of fuser, torch and Triton (cache.versions; load_entry also
    rejects an entry written under others)."""
    core = sorted(_core_options(arch).items())
    return digest(source, arch, nvrtc_version(), COMPILER, _options(arch), core, versions())


def compile_cubin(source: str, name: str, arch: str) -> bytes:
    """The cubin of `source` for `arch` ("sm_90"), from memory, disk or NVRTC."""
    t0 = time.perf_counter()
    key = cubin_key(source, arch)
    with _lock:
        cubin = _cubins.get(key)
    if cubin is not None:
        last_compile[name] = CompileStats("memory", time.perf_counter() - t0)
        return cubin
    entry = load_entry("cuda", key)
    origin = "disk"
    cubin = None
    if entry is not None:
        try:
            cubin = base64.b64decode(entry["cubin"], validate=True)
        except (KeyError, ValueError, TypeError):
            cubin = None
    if cubin is None:
        origin = "nvrtc"
        cubin = _nvrtc(source, name, arch)
        store_entry(
            "cuda", key, {"name": name, "arch": arch, "cubin": base64.b64encode(cubin).decode()}
        )
    with _lock:
        _cubins[key] = cubin
    stats = last_compile[name] = CompileStats(origin, time.perf_counter() - t0)
    timing.kernel(KernelTime(name, "cuda", _ORIGIN[origin], stats.seconds))
    return cubin


_ORIGIN = {"nvrtc": "compiled", "disk": "disk", "memory": "memory"}


def clear_memory_cache() -> None:
    """Forget compiled cubins and loaded functions (the disk cache stays)."""
    with _lock:
        _cubins.clear()
        _functions.clear()


# -- launching ---------------------------------------------------------------------------------
def device_arch(device: Any) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _no_gpu() -> str:
    import torch

    return (
        "backend='cuda' cannot run here: torch sees no CUDA GPU "
        f"(torch {torch.__version__}, torch.cuda.is_available() is False). The kernels "
        "still render and compile: use fd.compile(inputs, backend='cuda', device='h100') "
        "and kernel.resources(), or run with backend='triton' (Triton's interpreter)."
    )


def device_problem(device_type: str) -> str | None:
    """Why this process cannot run CUDA kernels on tensors of `device_type`, or None."""
    import torch

    if device_type == "cuda" or (device_type == "cpu" and EMULATE_ON_CPU):
        return None
    if not torch.cuda.is_available():
        return _no_gpu()
    return f"backend='cuda' runs on CUDA tensors, not {device_type} ones. Move them with .cuda()."


def _require_gpu(tensors: list[Any]) -> Any:
    import torch

    if not torch.cuda.is_available():
        raise FuserError(_no_gpu())
    devices = {t.device for t in tensors}
    if any(d.type != "cuda" for d in devices):
        raise FuserError(
            "backend='cuda' runs on CUDA tensors; got tensors on "
            f"{sorted(str(d) for d in devices)}. Move the inputs with .cuda()."
        )
    return tensors[0].device


class _TorchStream:
    """torch's stream as the `__cuda_stream__` protocol cuda.core accepts."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _use_core() -> bool:
    """Whether to launch through cuda.core: only when asked (LAUNCHER="core"); "auto"
    and "bindings" take the prepared driver-API path (cuda.bindings ships with cuda.core)."""
    return LAUNCHER == "core"


def _function(cubin: bytes, key: str, name: str, device_index: int, core: bool) -> Any:
    fkey = (key, device_index, name + (":core" if core else ":bindings"))
    fn = _functions.get(fkey)
    if fn is not None:
        return fn
    with _lock:
        fn = _functions.get(fkey)
        if fn is None:
            fn = _load_core(cubin, name, device_index) if core else _load_bindings(cubin, name)
            _functions[fkey] = fn
    return fn


def _load_core(cubin: bytes, name: str, device_index: int) -> Any:
    from cuda.core import Device, ObjectCode

    Device(device_index).set_current()
    return ObjectCode.from_cubin(cubin).get_kernel(name)


def _driver_check(result: Any, what: str) -> Any:
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise FuserError(f"CUDA driver call {what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def _current_context() -> None:
    """Make torch's (primary) context current on this thread for the driver API."""
    import torch
    from cuda.bindings import driver

    _driver_check(driver.cuInit(0), "cuInit")
    ctx = _driver_check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if not int(ctx):
        dev = _driver_check(driver.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
        ctx = _driver_check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _driver_check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _load_bindings(cubin: bytes, name: str) -> Any:
    from cuda.bindings import driver

    _current_context()
    module = _driver_check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
    return (module, _driver_check(driver.cuModuleGetFunction(module, name.encode()), name))


def _launch(fn: Any, core: bool, grid: tuple[int, ...], block: int, args: list[int]) -> None:
    """One launch through cuda.core (the slow, general path; LAUNCHER="core")."""
    import torch

    handle = torch.cuda.current_stream().cuda_stream
    grid3 = (*grid, 1, 1)[:3]
    from cuda.core import Device, LaunchConfig, launch

    stream = _streams.get(handle)
    if stream is None:
        stream = Device().create_stream(_TorchStream(handle))
        _streams[handle] = stream
    launch(stream, LaunchConfig(grid=grid3, block=(block, 1, 1)), fn, *args)


class _Launcher:
    """A kernel's launches on one device, prepared once: the driver function handles,
    the grids, and a parameter block whose pointer slots each call overwrites.

    cuLaunchKernel copies the parameters when it is called, so one block per kernel is
    enough; the lock keeps two threads from writing it at once. A cached call then costs
    a few microseconds of Python instead of cuda.core's general argument handling.
    """

    def __init__(self, launches: list[tuple[Any, tuple[int, int, int], int]], nargs: int):
        import ctypes

        from cuda.bindings.driver import CUresult, cuLaunchKernel

        self.ok, self.launch = CUresult.CUDA_SUCCESS, cuLaunchKernel

        self.launches = launches
        self.values = (ctypes.c_void_p * nargs)()
        base, width = ctypes.addressof(self.values), ctypes.sizeof(ctypes.c_void_p)
        self.params = (ctypes.c_void_p * nargs)(*[base + i * width for i in range(nargs)])
        self.params_at = ctypes.addressof(self.params)
        self.lock = threading.Lock()

    def __call__(self, pointers: list[int], stream: int) -> None:
        with self.lock:
            self.values[:] = pointers
            for fn, (gx, gy, gz), block in self.launches:
                (err,) = self.launch(fn, gx, gy, gz, block, 1, 1, 0, stream, self.params_at, 0)
                if err != self.ok:
                    raise FuserError(f"CUDA driver call cuLaunchKernel failed: {err!r}")


def _launch_plan(kernel: Any, index: int) -> tuple[bytes, str, list[tuple[str, tuple, int]]]:
    """(cubin, its cache key, [(function name, grid, threads)]) of `kernel` on device
    `index`: the kernel, then its finalize pass when it has workspaces."""
    s = kernel.plan
    arch = device_arch(index)
    cubin = compile_cubin(kernel.source, kernel.name, arch)
    plan = [(kernel.name, s.grid, s.threads)]
    if kernel.workspaces:
        fin = kernel.plan
        plan.append((kernel.name + "_finalize", fin.finalize_grid, fin.finalize_threads))
    return cubin, digest(kernel.source, arch), plan


def _launcher(kernel: Any, index: int, nargs: int) -> _Launcher:
    """The prepared launcher of `kernel` on device `index` (built on first use)."""
    got = kernel._cuda_launchers.get(index)
    if got is None:
        cubin, key, plan = _launch_plan(kernel, index)
        launches = [
            (_function(cubin, key, name, index, False)[1], (*grid, 1, 1)[:3], threads)
            for name, grid, threads in plan
        ]
        kernel._cuda_launchers[index] = got = _Launcher(launches, nargs)
    return got


def direct_launcher(kernel: Any, device: Any) -> _Launcher | None:
    """The prepared launcher a call program may call itself, `launcher(pointers, stream)`
    with the pointers of `kernel`'s tensors, then its workspaces, then its error record
    and flag: launch_cuda's order. None where it goes launch_cuda's general way (not on
    a CUDA device, cuda.core asked for, or not launched on that device yet)."""
    if getattr(device, "type", None) != "cuda" or device.index is None or _use_core():
        return None
    return kernel._cuda_launchers.get(device.index)


def launch_cuda(kernel: Any, tensors: list[Any], checks: list[Any] = ()) -> None:
    """Run `kernel` on `tensors` (its spec's args, in order) on torch's current stream;
    `checks`: its error record and flag when it has check_index nodes."""
    import torch

    if EMULATE_ON_CPU and all(t.device.type == "cpu" for t in tensors):
        emulate(kernel, tensors, checks)
        return
    if not tensors or any(t.device.type != "cuda" for t in tensors):
        _require_gpu(tensors)  # raises, naming the problem
    device = tensors[0].device
    index = device.index if device.index is not None else torch.cuda.current_device()
    work = kernel._workspace_tensors(device)
    pointers = [t.data_ptr() for t in tensors]
    if work:
        pointers += [t.data_ptr() for t in work]
    if checks:  # the flag is pinned host memory: its host pointer is valid on the GPU too
        pointers += [t.data_ptr() for t in checks]
    if _use_core():
        _launch_core(kernel, index, pointers)
        return
    stream = torch._C._cuda_getCurrentRawStream(index)
    if index == torch.cuda.current_device():
        _launcher(kernel, index, len(pointers))(pointers, stream)
    else:
        # the module is loaded into, and launched in, device index's context
        with torch.cuda.device(index):
            _launcher(kernel, index, len(pointers))(pointers, stream)


def _launch_core(kernel: Any, index: int, pointers: list[int]) -> None:
    """Launch through cuda.core (LAUNCHER="core"): the general path, kept to check the
    fast one against."""
    import torch

    cubin, key, plan = _launch_plan(kernel, index)
    with torch.cuda.device(index):
        for name, grid, threads in plan:
            _launch(_function(cubin, key, name, index, True), True, grid, threads, pointers)
