"""Load generated Triton source as a module and launch its kernels.

The source is written to the cache folder (Triton's JIT needs a real file to read the
function from) under a name that hashes the source, then imported. On CPU tensors the
module is imported with TRITON_INTERPRET=1, so the same kernels run in Triton's
interpreter.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from fuser.config import use_interpreter
from fuser.errors import FuserError
from fuser.runtime.cache import atomic_write, cache_root, digest

# Compile options of every generated kernel. No floating-point contraction: LLVM would fuse
# a multiply into a later add or subtract across ops eager rounds one by one (x*y - x*y
# gave the product's rounding error instead of 0; max(v, x*v) - x*v gave +-60 at 1e9).
TRITON_OPTIONS = {"enable_fp_fusion": False}

_lock = threading.Lock()
_modules: dict[tuple[str, bool], Any] = {}
# Triton's interpreter keeps the running grid (its size, the program ids) and its patches
# of triton.language in module globals: two threads launching at once read each other's
# program ids (wrong results, or "x >= grid_dim[0]"). Interpreted launches take turns.
_interpreter_lock = threading.RLock()


class _TakingTurns:
    """A module whose kernels, launched as `module.kernel[grid](*args)`, hold
    `_interpreter_lock` while they run (the module's own globals are untouched, so the
    kernels still call their helpers directly)."""

    def __init__(self, module: ModuleType):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._module, name)
        return _TakingTurnsKernel(fn) if hasattr(fn, "__getitem__") else fn


class _TakingTurnsKernel:
    def __init__(self, fn: Any):
        self._fn = fn

    def __getitem__(self, grid: Any) -> Any:
        launch = self._fn[grid]

        def run(*args: Any, **kwargs: Any) -> Any:
            with _interpreter_lock:
                return launch(*args, **kwargs)

        return run


def _holds(path: Path, data: bytes) -> bool:
    """Whether the file at `path` holds exactly `data` (bytes: a corrupt file need not
    even be UTF-8)."""
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def load_module(source: str, interpret: bool) -> Any:
    """The module of generated `source` (interpreted launches serialized, see above)."""
    key = (digest(source), interpret)
    with _lock:
        if key in _modules:
            return _modules[key]
        path = Path(cache_root()) / "triton" / f"k_{key[0]}.py"
        if not _holds(path, source.encode()):  # missing, truncated or corrupt: rebuild
            atomic_write(path, source.encode())
        name = f"fuser_generated_{key[0]}_{'interp' if interpret else 'jit'}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        if interpret != use_interpreter():
            raise FuserError(
                "CPU tensors run through Triton's interpreter, which is chosen when Triton is "
                "first imported (TRITON_INTERPRET=1); this process runs Triton on the GPU. "
                "Move the inputs to the GPU, or start the process with TRITON_INTERPRET=1."
            )
        # compiled from the source in hand, not through the import system: its
        # __pycache__ .pyc is trusted once its header matches, and a corrupt body then
        # fails every later load ("bad marshal data"); Triton reads the file for the source
        exec(compile(source, str(path), "exec"), module.__dict__)
        _modules[key] = _TakingTurns(module) if interpret else module
        return _modules[key]
