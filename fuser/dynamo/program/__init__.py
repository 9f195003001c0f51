"""The call program: one generated Python function per lowered AOTAutograd graph.

The graph's first call runs the old way, watched (observe.py); from what it saw the
program is built in three stages, each printable: steps (steps.py, regions.py: FX nodes
to launches, ATen calls and views), a memory plan (memory.py), source (emit.py). Every
later call runs the generated function, which launches the kernels with their arguments
and grids fixed, calls ATen ops directly, resolves views once and frees each buffer
after its last use. config.call_program (FUSER_CALL_PROGRAM=0) turns it off, at any
call: the old path (the rewritten FX graph, a module per region) is always kept, and
runs any call made while config.backend is not the one the program was built under.

What each call still checks, and why: a bad index reported by a kernel (one poll), the
alignment of the inputs whose data reaches a kernel (kernels are specialized to it and
Dynamo's guards do not fix it), whether a profiler hooked Triton's launches, and in a
backward graph the shapes, dtypes and strides of its inputs: AOTAutograd gives the
backward its tangents in the traced layout, but its saved tensors come back through any
saved-tensor hooks, which may return them in other strides (torch.autograd.graph.
save_on_cpu returns them contiguous, a gradient saved with padded rows among them), or
even in another shape or dtype (eager then raises or promotes; the kernels would read
them as the first call's). In a forward graph none of these is checked: Dynamo's guards
fix the shapes, dtypes, strides and devices of its inputs (dynamic=False; a graph with
symbolic sizes gets a program per concrete signature, lower.py); every other value is
made by the program from those.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import fx

from fuser.config import config, debug_print
from fuser.dynamo.program.casts import group_casts
from fuser.dynamo.program.clock import StepClock
from fuser.dynamo.program.copies import elide_clones
from fuser.dynamo.program.emit import emit_program
from fuser.dynamo.program.fold import fold_views
from fuser.dynamo.program.memory import MemoryPlan, plan_memory, storage_roots
from fuser.dynamo.program.observe import watch_first_call
from fuser.dynamo.program.pointers import pointer_views
from fuser.dynamo.program.step import Step
from fuser.dynamo.program.steps import StepBuilder
from fuser.runtime import timing

# give a dead kernel output's memory to the next kernel output of its size (memory.py)
REUSE = True


class CallProgram:
    """The boxed callable lower_graph returns: the old path on the first call (and
    whenever config.call_program is off), the generated program after it."""

    def __init__(
        self, gm: fx.GraphModule, name: str, old: Any, strict: bool, check_strides: bool = False
    ):
        self._boxed_call = True  # an instance attribute: wrappers copy __dict__
        self.gm, self.name, self.old, self.strict = gm, name, old, strict
        self.check_strides = check_strides  # a backward's inputs: see the module docstring
        self.fn: Any = None
        self.source = ""
        self.steps: list[Step] = []
        self.returned: list[str] = []  # the names the program returns
        self.memory = MemoryPlan()
        self.inlined: list[Any] = []  # records of the regions whose kernels it launches
        self.note = ""  # why there is no program, when there is none
        self.calls = 0
        self.backend = config.backend  # fd.execute's default backend the plans were made for
        # calls the program handed to the old path (another alignment, another backend)
        self.declined = 0
        self.ledger: timing.Ledger | None = None  # the capture's first-step ledger
        self.clock: StepClock | None = None  # host time per step (config.program_clock)

    def __call__(self, args: list) -> Any:
        if self.fn is not None and config.call_program:
            if config.backend != self.backend:
                # the kernels were chosen for another backend: the old path plans for
                # this one, as fd.execute does (an A/B of backends in one process)
                return self._decline(args)
            self.calls += 1
            return self.fn(args)
        if self.fn is None and not self.note and config.call_program:
            self.backend = config.backend
            with timing.collecting(self.ledger), timing.phase("first calls"):
                result, seen = watch_first_call(self.gm, args)
                self._build(seen)
            return result
        return self.old(args)

    def _decline(self, args: list) -> Any:
        self.declined += 1
        return self.old(args)

    def _build(self, seen: Any) -> None:
        try:
            b = StepBuilder(self.gm, seen)
            steps = rewrite(b.build(), b)
            memory = plan_memory(steps, b.inputs, b.result_uses, reuse=REUSE)
            layouts = _input_layouts(b, seen)
            clock = StepClock(len(steps)) if config.program_clock else None
            emitted = emit_program(
                self.name,
                steps,
                memory,
                b.names,
                b.inputs,
                b.result,
                _checked_alignment(steps, b, layouts),
                seen.device(),
                self._decline,
                _input_strides(layouts) if self.check_strides else None,
                _input_metas(layouts) if self.check_strides else None,
                clock,
            )
        except Exception as e:
            if self.strict:
                raise
            self.note = f"not built ({type(e).__name__}: {str(e)[:300]}); the old path runs"
            warnings.warn(f"fuser: call program of {self.name} {self.note}", stacklevel=3)
            return
        self.steps, self.memory, self.inlined = steps, memory, b.inlined
        self.clock = clock
        self.returned = b.result_uses
        self.source, self.fn = emitted.source, emitted.fn
        for record in b.inlined:
            record.program = self
        debug_print(2, f"[fuser.dynamo] call program of {self.name}:\n{self.source}")

    def summary(self) -> str:
        if self.fn is None:
            return f"call program: {self.note or 'built at the first call'}"
        count = {k: sum(s.kind == k for s in self.steps) for k in ("launch", "call", "view")}
        regions = sum(s.kind == "region" for s in self.steps)
        return (
            f"call program {self.name}: {count['launch']} kernel launches "
            f"({len(self.inlined)} regions inlined, {regions} called as modules), "
            f"{count['call']} other calls, {count['view']} views resolved, "
            f"{self.memory.frees} frees, {len(self.memory.reuse)} buffers reused; "
            f"{self.calls} calls ({self.declined} handed to the old path)"
        )


def rewrite(steps: list[Step], b: Any) -> list[Step]:
    """The passes over a program's steps, in order. Casts are grouped first (casts.py):
    a group's launch reads its tensors by name, so the later passes rename them in its
    code as in any other step's (a clone elided, views folded), and a view it reads stays
    a tensor rather than a pointer. `b`: the StepBuilder (or what has its names, inputs,
    result_uses, clones and itemsize)."""
    steps = group_casts(steps, b.names)
    steps = elide_clones(steps, b.inputs, b.result_uses, b.clones)
    steps = fold_views(steps, b.result_uses)
    return pointer_views(steps, b.result_uses, b.itemsize)


def _input_layouts(b: StepBuilder, seen: Any) -> dict[str, Any]:
    """The Layout the first call saw of each tensor input of the graph, by name."""
    nodes = {n.name: n for n in b.gm.graph.nodes if n.op == "placeholder"}
    layouts = {name: seen.layouts.get(nodes.get(name)) for name in b.inputs}
    return {name: lay for name, lay in layouts.items() if lay is not None}


def _checked_alignment(steps: list[Step], b: StepBuilder, layouts: dict) -> dict[str, int]:
    """Graph inputs whose storage a kernel reads or writes, with the alignment seen."""
    roots = storage_roots(steps, b.inputs)
    used = {r for s in steps if s.kind == "launch" for u in s.uses for r in roots.get(u, ())}
    return {n: layouts[n].align for n in b.inputs if n in used and n in layouts}


def _input_strides(layouts: dict) -> dict[str, tuple[int | None, ...]]:
    """The strides the first call saw of each tensor input, None for a dim of size 1 (its
    stride addresses nothing: a tensor that differs only there is the same)."""
    return {
        n: tuple(None if size == 1 else st for size, st in zip(lay.shape, lay.stride))
        for n, lay in layouts.items()
        if any(size != 1 for size in lay.shape)
    }


def _input_metas(layouts: dict) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The shape and dtype the first call saw of each tensor input."""
    return {n: (lay.shape, lay.dtype) for n, lay in layouts.items()}
