"""A compile worker: a plain Python process that compiles Triton kernels into Triton's disk
cache for its parent (runtime/compile_pool.py starts it, runtime/precompile.py asks it).

It runs as a script, `python .../fuser/runtime/compile_worker.py`, and imports Triton
alone: not torch and not the fuser package (torch's import alone is ~3 s, fuser's ~5 s; a
worker is ready in ~0.3 s). Generated kernel sources import only Triton, and the
arguments arrive as dtype names. It never touches a GPU: Triton's driver answers the
parent's target, device 0 and stream 0, so no CUDA context is made (a CPU machine
compiles too).

Protocol: each message is a pickled object behind its byte length (8 bytes, little
endian). A job is (module, function, arguments); the answer is None, or the error's text
when the function raised. The worker's own jobs are this module's `setup` and `warm`
(imported as `compile_worker`: the script's folder leads sys.path). stdout belongs to
the protocol: anything a job prints goes to stderr.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import struct
import sys
from typing import Any, BinaryIO

_HEADER = struct.Struct("<Q")


def send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def receive(stream: BinaryIO) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("the compile worker exited")
    (size,) = _HEADER.unpack(head)
    return pickle.loads(stream.read(size))


class _TargetOnly:
    """Triton's driver as a worker needs it: the parent's target, device 0, stream 0."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, *_: Any) -> int:
        return 0


def setup(target: tuple) -> None:
    """Run once, ahead of the jobs: Triton's driver answers `target` (backend, arch,
    warp size) without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(_TargetOnly(GPUTarget(*target)))
    # a first compilation sets up Triton's compiler (MLIR, the backend, ptxas's version)
    # here, while the parent traces, instead of in the first job
    try:
        _first_kernel().warmup(_arguments([("dtype", "float32")])[0], 16, BLOCK=128, grid=(1,))
    except Exception:
        pass


def _first_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def fuser_worker_first(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n)
        tl.store(x_ptr + offsets, x + 1, mask=offsets < n)

    return fuser_worker_first


class _DtypeName:
    """A torch dtype as Triton's specialization reads it (its text), without torch."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


# one stand-in per name, kept for the process's life: Triton's specialization remembers
# a dtype object's text by the object's identity, as torch's dtypes (singletons) allow; a
# fresh stand-in per call could take a dead one's address and be read as its dtype
_dtypes: dict[str, _DtypeName] = {}


def _arguments(args: list) -> list:
    """("dtype", "float16") -> a stand-in tensor of that dtype, as Triton's warmup makes
    of a torch dtype; other arguments as they are."""
    from triton.runtime.jit import MockTensor

    def dtype(name: str) -> _DtypeName:
        return _dtypes.setdefault(name, _DtypeName(name))

    return [
        MockTensor(dtype(a[1])) if isinstance(a, tuple) and a[:1] == ("dtype",) else a for a in args
    ]


_modules: dict[str, Any] = {}


def _module(path: str) -> Any:
    if path not in _modules:
        spec = importlib.util.spec_from_file_location(f"fuser_worker_{len(_modules)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[path] = module
    return _modules[path]


def warm(path: str, calls: list, args: list, options: dict) -> None:
    """Compile the functions of the generated source file at `path` that `calls` names,
    as (function, grid, warps), for `args`, as the parent's warm-up will, then build each
    one's C launcher; both land in Triton's disk cache."""
    module, args = _module(path), _arguments(args)
    compiled = [
        getattr(module, fn).warmup(*args, grid=grid, num_warps=warps, **options)
        for fn, grid, warps in calls
    ]
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        for c in compiled:
            CudaLauncher(c.src, c.metadata)
    except Exception:  # no CUDA driver library here (a CPU machine): the parent builds them
        pass


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Run each job, answer None or the error's text; return when stdin closes."""
    while True:
        try:
            module, function, args = receive(stdin)
        except EOFError:
            return
        try:
            getattr(importlib.import_module(module), function)(*args)
            answer = None
        except BaseException as e:  # answered, not raised: the parent compiles it itself
            answer = f"{type(e).__name__}: {e}"
        send(stdout, answer)


if __name__ == "__main__":
    # a worker only fills a cache: the parent (tracing, lowering, its own warm-up) is
    # never kept waiting for a core by one
    try:
        os.nice(int(os.environ.get("FUSER_COMPILE_NICE", "10")))
    except (OSError, ValueError, AttributeError):
        pass
    out = sys.stdout.buffer
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, out)
