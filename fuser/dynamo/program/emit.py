"""Print the call program: steps and memory plan -> Python source -> a function.

The source is meant to be read (explain shows it): one line per launch, ATen call or
view, `del` where a buffer dies, a comment where a buffer is taken over.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fuser.dynamo.program.memory import MemoryPlan
from fuser.dynamo.program.step import Step
from fuser.dynamo.program.steps import Names
from fuser.runtime.buffers import empty_whole, has_gap, whole_extent
from fuser.runtime.checks import poll
from fuser.runtime.kernel import launch_hooked


@dataclass
class Emitted:
    source: str
    fn: Callable[[list], Any]


def _lines(code: str) -> list[str]:
    return code.splitlines()


def _fast_empty() -> Callable | None:
    """torch's allocation without the dispatcher, for the current CUDA device (what
    Inductor's wrapper code calls): ~3 us a buffer less than torch.empty_strided, and a
    step allocates hundreds. None where this torch has none."""
    guards = getattr(torch._C, "_dynamo", None)
    return getattr(getattr(guards, "guards", None), "_empty_strided_cuda", None)


def _alloc(s: Step, names: Names, reused: str | None, fast_device: Any = None) -> list[str]:
    name = s.defines[0]
    shape, stride, dtype, device = s.alloc  # type: ignore[misc]
    if reused is not None:
        return [f"{name} = {reused}  # takes over the dead {reused}'s memory", f"del {reused}"]
    dt = names.bind(dtype, str(dtype).removeprefix("torch."))
    fast = _fast_empty()
    gap = has_gap(shape, stride)  # rows further apart than their width: whole rows
    if fast is not None and fast_device is not None and device == fast_device:
        # the call checked that fast_device is the current device
        empty = names.bind(fast, "empty_cuda")
        if not gap:
            return [f"{name} = {empty}({shape}, {stride}, {dt})"]
        # the storage of whole rows (runtime/buffers.py), the layout set on it (no view)
        on = names.bind(torch._C._dynamo.guards._reinterpret_tensor, "reinterpret")
        whole = f"{empty}(({whole_extent(shape, stride)},), (1,), {dt})"
        return [f"{name} = {on}({whole}, {shape}, {stride}, 0)  # whole rows"]
    # each buffer on its region's device: a graph may hold tensors of several (a CPU
    # scalar tensor beside CUDA activations)
    dv = "dev" if device == names.globals.get("dev") else names.bind(device, f"dev_{device}")
    if gap:
        whole = names.bind(empty_whole, "empty_whole")
        return [f"{name} = {whole}({shape}, {stride}, {dt}, {dv})  # runtime/buffers.py"]
    empty = names.bind(torch.empty_strided, "empty_strided")
    return [f"{name} = {empty}({shape}, {stride}, dtype={dt}, device={dv})"]


def emit_program(
    func: str,
    steps: list[Step],
    memory: MemoryPlan,
    names: Names,
    inputs: list[str],
    result: str,
    checked: dict[str, int],
    device: torch.device | None,
    fallback: Callable[[list], Any],
    strides: dict[str, tuple[int | None, ...]] | None = None,
    metas: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None,
    clock: Any = None,
) -> Emitted:
    """The function `func(args)` running `steps` (boxed: it clears `args`). `checked`:
    inputs whose pointer alignment (ptr & 15) the kernels were specialized to; a call
    with another alignment runs `fallback`, the old path, which plans for it. `strides`:
    inputs whose strides no guard fixes, with those the steps were made for (None: any,
    a dim of size 1); `metas`: inputs whose shape and dtype no guard fixes, with those
    the steps were made for. A call with others runs `fallback` too. `clock` (a StepClock,
    clock.py): each step's host time is added to it."""
    g = names.globals
    fast = any(s.on_stream for s in steps)
    launched = {s.device for s in steps if s.kind == "launch" and s.device is not None}
    if fast:
        # one `stream` per call, the current stream of the launches' device
        cuda = {d for d in launched if d.type == "cuda"}
        if len(cuda) > 1:
            raise NotImplementedError(f"kernels on several devices ({sorted(map(str, cuda))})")
        device = next(iter(cuda), device)
    elif len(launched) == 1:
        device = next(iter(launched))
    g["dev"] = device
    body = [f"{names.bind(poll, 'poll')}()  # a bad index a kernel reported since the last call"]
    if inputs:
        body.append(f"{', '.join(inputs)}, = args")
    if checked or strides or metas:
        fb = names.bind(fallback, "old_path")
        # shapes first: a stride test of a tensor of fewer dims would raise
        tests = [_meta_test(n, shape, dt, names) for n, (shape, dt) in (metas or {}).items()]
        tests += [f"{n}.data_ptr() & 15" + (f" != {a}" if a else "") for n, a in checked.items()]
        tests += [_stride_test(n, st) for n, st in (strides or {}).items()]
        if strides is not None and fast and device is not None and device.type == "cuda":
            # a backward's inputs have no Dynamo guard, and the launches pass pointers: a
            # tensor on another device goes the old way, whose launches check them
            tests += [f"{n}.get_device() != {device.index or 0}" for n in checked]
        body += [
            "# the kernels are specialized to their pointers' alignment, which Dynamo's",
            "# guards do not fix, and views and launches to the strides the first call",
            "# saw, which saved-tensor hooks may change (a backward's saved tensors come",
            "# back from torch.autograd.graph.save_on_cpu contiguous; a hook may even",
            "# change their shape or dtype): another alignment, shape, dtype, other",
            "# strides or another device go the old way, which plans for them",
            "if (",
            *[f"    {t}" + (" or" if i < len(tests) - 1 else "") for i, t in enumerate(tests)],
            "):",
            f"    return {fb}(args)",
        ]
    if fast:
        hooked = names.bind(launch_hooked, "launch_hooked")
        body += [
            "# a profiler that hooks Triton's launches gets them through Triton's wrapper",
            f"if {hooked}():",
            f"    return {names.bind(fallback, 'old_path')}(args)",
        ]
    # buffers of the launches' CUDA device come from torch's allocator directly, which
    # allocates on the current device: a call made under another current device goes
    # the old way
    fast_device = None
    allocs = {s.alloc[3] for s in steps if s.kind == "alloc"}  # type: ignore[index]
    on_gpu = device is not None and device.type == "cuda" and device.index is not None
    if fast and on_gpu and device in allocs and _fast_empty() is not None:
        fast_device = device
        here = names.bind(torch.cuda.current_device, "current_device")
        body += [
            f"if {here}() != {device.index or 0}:",
            f"    return {names.bind(fallback, 'old_path')}(args)",
        ]
    if inputs:
        body.append("args.clear()  # each input is freed after its last use")
    if fast:
        raw = names.bind(torch._C._cuda_getCurrentRawStream, "raw_stream")
        body.append(f"stream = {raw}({device.index if device and device.index else 0})")
    body += _free(memory, -1)
    tick = None
    if clock is not None:
        tick = names.bind(clock.tick, "tick")
        body.append(f"{names.bind(clock.start, 'clock_start')}()  # FUSER_PROGRAM_CLOCK")
    for i, s in enumerate(steps):
        if s.kind == "alloc":
            body += _alloc(s, names, memory.reuse.get(i), fast_device)
        else:
            body += _lines(s.code)
        body += _free(memory, i)
        if tick is not None:
            body.append(f"{tick}({i})")
    body.append(f"return {result}")
    source = f"def {func}(args):\n" + "\n".join("    " + line for line in body) + "\n"
    filename = f"<fuser call program {func}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), g)
    return Emitted(source, g[func])


def _meta_test(name: str, shape: tuple[int, ...], dtype: torch.dtype, names: Names) -> str:
    """`name`'s shape or dtype differs from `shape`, `dtype`."""
    dt = names.bind(dtype, str(dtype).removeprefix("torch."))
    return f"{name}.shape != {tuple(shape)} or {name}.dtype is not {dt}"


def _stride_test(name: str, stride: tuple[int | None, ...]) -> str:
    """`name`'s strides differ from `stride` (its None dims not compared)."""
    if None not in stride:
        return f"{name}.stride() != {tuple(stride)}"
    dims = [i for i, st in enumerate(stride) if st is not None]
    got = ", ".join(f"{name}.stride({i})" for i in dims)
    want = ", ".join(str(stride[i]) for i in dims)
    return f"({got},) != ({want},)"


def _free(memory: MemoryPlan, i: int) -> list[str]:
    dead = memory.free_after.get(i)
    return [f"del {', '.join(dead)}"] if dead else []
