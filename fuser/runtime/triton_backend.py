"""Load generated Triton source as a module and launch its kernels.

The source is written to the cache folder (Triton's JIT needs a real file to read the
function from) under a name that hashes the source, then imported. For CPU tensors its
jit functions are made Triton's interpreted ones (see _interpreted), so the same kernels
run in Triton's interpreter.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from fuser.config import config, use_interpreter
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
# sources whose kernels precompile.py warmed up (their first launch finds them compiled)
WARMED: set[str] = set()


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
            with _interpreter_lock, _library_interpreted(), _unsanitized():
                with np.errstate(**_fp_errors()):
                    return launch(*args, **kwargs)

        return run


@contextmanager
def _unsanitized() -> Iterator[None]:
    """Without Triton's integer-overflow checks while an interpreted kernel runs. The
    interpreter makes them by default (sanitize_overflow): each 32-bit integer add, sub
    or mul is done again in int64 and compared with the type's range, for a device_assert
    that does nothing unless the kernel runs with debug=True (it never does here, nor on
    a GPU). That was a third of an interpreted bf16 kernel's time: bf16_rne rounds with
    integer adds. With debug on, the checks stay."""
    builder = interpreter.interpreter_builder
    saved = builder.options
    if not saved.debug:
        builder.options = dataclasses.replace(saved, sanitize_overflow=False)
    try:
        yield
    finally:
        builder.options = saved


def _fp_errors() -> dict[str, str]:
    """numpy's floating-point error handling while an interpreted kernel runs. Silent by
    default: eager torch and a GPU compute inf - inf, 0 / 0 or an overflow in the user's data
    without a word, and so does fuser. The test suite sets config.fp_warnings: with data
    that eager computes no inf or NaN from, neither may a kernel, masked-off lanes included
    (numpy's default, underflow silent)."""
    if config.fp_warnings:
        return {"over": "warn", "invalid": "warn", "divide": "warn", "under": "ignore"}
    return {"all": "ignore"}


class _ModuleFunction(InterpretedFunction):
    """An interpreted jit function of a generated module. Launched (`fn[grid](...)`) it runs
    as Triton's own; called from a kernel of its module (a helper: bf16_rne, tanh_, ...)
    it skips the interpreter's per-call patching of triton.language, which the launch
    running it already made for these same module globals (~1 ms a call, more than a
    bf16_rne's own work; an interpreted bf16 kernel calls one per op)."""

    def __init__(self, fn: Any) -> None:
        super().__init__(fn)
        self.numpy_reduce = _NUMPY_REDUCE.get(fn.__name__)  # see _numpy_nan_reductions

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e


# The interpreter is chosen per module, not by TRITON_INTERPRET: Triton reads that as each
# @triton.jit function is made, and torch.compile imports Triton (making triton.language's
# own jit functions, tl.sum, tl.max, tl.sigmoid...) before the "fuser" entry point can
# import fuser. Without these two steps that order left every region ATen on CPU.
def _interpreted(module: ModuleType) -> None:
    """The @triton.jit functions of `module` as Triton's interpreter runs them (already so
    when TRITON_INTERPRET=1 was set before they were made)."""
    for name, fn in list(vars(module).items()):
        if isinstance(fn, (JITFunction, InterpretedFunction)):
            setattr(module, name, _ModuleFunction(fn.fn))


def _scalar_index_fix() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with int() of its
    one-element array, which numpy 2.4 refuses (only 0-d arrays convert): a loop with a
    run-time bound, `for i in range(lo, hi, BLOCK)` (the attention template's walks), fails.
    Its tensor patches are made per launch by _patch_lang_tensor; this adds, in the same
    scope (restored after the launch), an __index__ that reads the one element."""
    original = interpreter._patch_lang_tensor
    if getattr(original, "fuser_fixed", False):
        return

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.fuser_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


_scalar_index_fix()

# fuser's NaN-keeping float max/min combines (codegen's max_nan, min_nan helpers) as the
# numpy reductions that fold the same way: np.max and np.min keep a NaN, as
# tl.maximum(propagate_nan=ALL) does
_NUMPY_REDUCE = {"max_nan": np.max, "min_nan": np.min}


def _numpy_nan_reductions() -> None:
    """Triton's interpreter reduces with a combine it does not know (not tl.max's, tl.sum's)
    element by element in Python, calling the combine once per element: a float max or
    min over a tile took ~20 ms. A generated module's max_nan / min_nan combine carries
    its numpy reduction (`_ModuleFunction.numpy_reduce`) and is reduced with it."""
    original = interpreter.ReduceOps.apply_impl
    if getattr(original, "fuser_fixed", False):
        return

    def apply_impl(self: Any, input: Any) -> Any:
        reduce = getattr(self.combine_fn, "numpy_reduce", None)
        if reduce is not None and len(input) == 1:
            return self.min_max(input[0], val_reduce_op=reduce)
        return original(self, input)

    apply_impl.fuser_fixed = True  # type: ignore[attr-defined]
    interpreter.ReduceOps.apply_impl = apply_impl


_numpy_nan_reductions()


# id -> the jit function (kept, so its id stays its own) and its interpreted twin; by id
# because a JITFunction hashes its cache key, which walks its source
_library: dict[int, tuple[JITFunction, InterpretedFunction]] = {}


# the modules a Triton library function's interpreted call patches (its globals' tl and
# tl.core; tl.math comes with tl), patched once per launch by _library_interpreted
_LANG = SimpleNamespace(__globals__={"tl": tl, "core": tl.core})


def _call_interpreted(self: JITFunction, *args: Any, **kwargs: Any) -> Any:
    known = _library.get(id(self))
    if known is None:
        known = _library[id(self)] = (self, InterpretedFunction(self.fn))
    try:  # InterpretedFunction.__call__ less its patching: the launch's covers it
        return known[1].rewrite()(*args, **kwargs)
    except Exception as e:
        raise interpreter.InterpreterError(repr(e)) from e


@contextmanager
def _library_interpreted() -> Iterator[None]:
    """While an interpreted kernel runs (under _interpreter_lock), a call to one of Triton's
    compiled-mode jit functions runs it in the interpreter too, as it would have run had
    Triton been imported with TRITON_INTERPRET=1 (outside a kernel such a call raises,
    so nothing else changes meaning). triton.language is patched for them once, here,
    around the launch (whose own patches go on top and come off first), not at each call
    as Triton does (~1 ms a call of tl.sum, tl.zeros_like...; and Triton's per-call
    patches were never undone)."""
    saved = JITFunction.__call__
    JITFunction.__call__ = _call_interpreted  # type: ignore[method-assign]
    scope = interpreter._patch_lang(_LANG)
    try:
        yield
    finally:
        scope.restore()
        JITFunction.__call__ = saved  # type: ignore[method-assign]


def _holds(path: Path, data: bytes) -> bool:
    """Whether the file at `path` holds exactly `data` (bytes: a corrupt file need not
    even be UTF-8)."""
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def device_problem(device_type: str) -> str | None:
    """Why this process cannot run Triton kernels on tensors of `device_type`, or None.
    Each process runs fuser's Triton kernels one way: in the CPU interpreter
    (TRITON_INTERPRET=1, or no CUDA GPU) or through the GPU compiler (config.use_interpreter)."""
    on_gpu = device_type == "cuda"
    if on_gpu != use_interpreter():
        return None
    if on_gpu:
        return (
            "this process runs Triton's CPU interpreter (TRITON_INTERPRET=1 is set), which "
            "takes CPU tensors. Move the inputs with .cpu(), or start the process without "
            "TRITON_INTERPRET."
        )
    return (
        f"{device_type.upper()} tensors run through Triton's interpreter, and this process has "
        "a GPU, so it runs Triton on the GPU. Move the inputs to the GPU, or start the process "
        "with TRITON_INTERPRET=1."
    )


def source_file(source: str) -> Path:
    """The cache folder's file holding generated `source` (written if missing, truncated
    or corrupt): Triton's JIT reads a kernel's source from its file."""
    path = Path(cache_root()) / "triton" / f"k_{digest(source)}.py"
    if not _holds(path, source.encode()):
        atomic_write(path, source.encode())
    return path


def load_module(source: str, interpret: bool) -> Any:
    """The module of generated `source` (interpreted launches serialized, see above)."""
    key = (digest(source), interpret)
    with _lock:
        if key in _modules:
            return _modules[key]
        path = source_file(source)
        name = f"fuser_generated_{key[0]}_{'interp' if interpret else 'jit'}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        if interpret != use_interpreter():
            raise FuserError(device_problem("cpu" if interpret else "cuda"))
        # compiled from the source in hand, not through the import system: its
        # __pycache__ .pyc is trusted once its header matches, and a corrupt body then
        # fails every later load ("bad marshal data"); Triton reads the file for the source
        exec(compile(source, str(path), "exec"), module.__dict__)
        if interpret:
            _interpreted(module)
        _modules[key] = _TakingTurns(module) if interpret else module
        return _modules[key]
