"""Launching fuser's own Triton kernels that run outside a call program's inlined regions
(the scatter-adds of runtime/scatter.py, the cross-entropy scale of dynamo/ce_scale.py)
through their compiled binaries.

Triton's JIT binds and specializes every argument at every call: ~50-80 us of host time
a launch on an H200 host (`.gpu/scatter_host.py` in benchmarks/results/
h200x2-2026-11-28-session15/f: the embedding backward 230 us a call, the scale 51 us),
where a direct launch (runtime/launchers.py) costs ~6 us. `launch` calls the JIT the first
time it sees a specialization, keeps that compiled kernel's direct launch, and takes it
for every later call with the same one: the device, grid, warps, constexprs, and what the
JIT specializes on (each tensor's dtype and 16-byte alignment, each integer's being 1,
its divisibility by 16 and its width). A profiler that hooks Triton's launches
(launch_hooked) gets them all through the JIT. On a CPU (the interpreter) it is the JIT.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Any

import torch

from fuser.runtime.kernel import _direct_launches, launch_hooked, raw_stream

# JITFunction -> {key: (its direct launch, the constexpr values after the positional args)}
_FAST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _spec(a: Any) -> tuple:
    """What Triton's JIT specializes an argument on (a tensor's data pointer as well)."""
    if isinstance(a, torch.Tensor):
        return ("t", a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):  # Triton's widths: i32, i64, and u64 from 2**63 on
        width = 32 if -(2**31) <= a < 2**31 else 64 if a < 2**63 else "u64"
        return ("i", a == 1, a % 16 == 0, width)
    if isinstance(a, float):
        return ("f",)
    return ("o", type(a).__name__, a if a is None else id(a))


def launch(
    kernel: Any, grid: tuple, *args: Any, num_warps: int | None = None, **consts: Any
) -> None:
    """kernel[grid](*args, num_warps=num_warps, **consts), through its compiled binary
    once this specialization has been launched (see the module docstring). `consts`:
    the kernel's constexpr parameters by name."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    opts = {} if num_warps is None else {"num_warps": num_warps}
    if first is None or first.device.type != "cuda":
        kernel[grid](*args, **opts, **consts)
        return
    index = first.get_device()
    grid3 = tuple((*grid, 1, 1)[:3])
    key = (index, grid3, num_warps, tuple(sorted(consts.items())), tuple(map(_spec, args)))
    table = _FAST.setdefault(kernel, {})
    fast = table.get(key)
    if fast is not None and not launch_hooked():
        direct, tail = fast  # the constexprs' values follow the positional arguments
        ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        direct(raw_stream(index), ptrs + tail)
        return
    with torch.cuda.device(index) if torch.cuda.current_device() != index else nullcontext():
        compiled = kernel[grid](*args, **opts, **consts)
    if compiled is None or not _orderable(kernel, len(args), consts) or fast is not None:
        return  # parameters it cannot order or key (or a hooked launch): the JIT every time
    names = kernel.arg_names
    made = _direct_launches(compiled, grid3, None, (1, 1, 1), len(names))
    if made:
        table[key] = (made[0], [consts[n] for n in names[len(args) :]])


def _orderable(kernel: Any, nargs: int, consts: dict) -> bool:
    """Whether `nargs` positional arguments and the constexprs `consts` by name are every
    parameter of `kernel`, in order, with no constexpr among the positional ones (the key
    holds a positional argument's _spec, not its value: BLOCK=64 and BLOCK=128 would
    share one binary)."""
    names = list(getattr(kernel, "arg_names", ()))
    params = getattr(kernel, "params", ())
    if not names or set(names[nargs:]) != set(consts) or len(params) != len(names):
        return False
    return not any(p.is_constexpr for p in params[:nargs])
