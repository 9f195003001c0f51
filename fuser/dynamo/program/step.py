"""Step: one line of a call program, what every stage of fuser/dynamo/program/ passes on
(steps.py makes them from FX nodes, regions.py from a region's kernels, memory.py plans
their buffers, emit.py writes them out)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Step:
    """One line of the call program.

    kind: "alloc" (a fresh buffer the program owns: `alloc` is its (shape, stride, dtype,
    device) and the memory plan may give it a dead buffer of the same key instead), "launch",
    "call" (ATen or Python), "view", "region" (a region module, called as before).
    code: the line, except for allocations, which emit.py writes.
    aliases: names whose storage the defined names may share; empty: fresh storage.
    on_stream: a direct launch, whose code reads `stream` (set once per call).
    device: where a launch runs (the device its region's tensors are on).
    op: what a "call" calls (an ATen op's name, or "clone", "restride", "contiguous" for
    a copy an inlined region makes); for a "region", why it is not inlined. census.py
    counts the steps by it.
    view: a view's (function, shape, strides, offset from its base's), which fold.py
    composes.
    cast: a launch that only casts a whole contiguous value into a fresh contiguous
    buffer (Cast), which casts.py may launch together with others.
    """

    kind: str
    defines: tuple[str, ...]
    uses: tuple[str, ...]
    code: str = ""
    aliases: tuple[str, ...] = ()
    alloc: tuple | None = None
    on_stream: bool = False  # the code reads `stream`, torch's current raw stream
    device: object = None  # a launch's device
    op: str = ""
    view: tuple | None = None
    cast: Cast | None = None


@dataclass(frozen=True)
class Cast:
    """What a lone cast's launch does (regions.py marks it, casts.py groups it): it casts
    the contiguous value `source` (a graph input, `where` "input", or a computed one,
    "value") of `numel` elements from `src` to `dst` into the fresh buffer `result`."""

    source: str
    result: str
    numel: int
    src: torch.dtype
    dst: torch.dtype
    where: str


# the copies an inlined region makes, as regions.py names their steps
COPIES = ("clone", "restride", "clone+restride", "contiguous")


def step_key(s: Step) -> str:
    """The census row of one step."""
    if s.kind == "region":
        return f"region module: {s.op}"
    if s.kind == "call":
        if s.op in COPIES:
            return f"region copy: {s.op}"
        return (
            f"aten: {s.op.removeprefix('aten.')}" if s.op.startswith("aten.") else f"call: {s.op}"
        )
    if s.kind == "view" and s.op:
        return f"view: {s.op}"  # a clone written as a name (copies.py)
    return s.kind
