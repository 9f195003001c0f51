"""Explain what fuser did to a compiled model: each fused region with its kernels, each ATen
call with the reason it was not fused."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from fuser.dynamo.backend import CAPTURES, Capture, FuserBackend
from fuser.dynamo.graph_text import graph_text
from fuser.dynamo.lower import GraphRecord
from fuser.explanation import Explanation
from fuser.frontend.fusion_definition import FusionDefinition


def captures_text(captures: list[Capture], source: bool = False, brief: bool = False) -> str:
    if not captures:
        return (
            "fuser: nothing compiled for this yet (torch.compile compiles on the first call; "
            "backward graphs on the first backward)"
        )
    graphs = [g for c in captures for g in c.graphs]
    regions = sum(len(g.fused) for g in graphs)
    kernels = sum(len(g.kernels) for g in graphs)
    recompiles = sum(c.recompile for c in captures)
    lines = [
        f"fuser: {len(captures)} captured graph(s), {len(graphs)} ATen graph(s), {regions} "
        f"fused regions, {kernels} kernels, {recompiles} recompile(s)"
    ]
    pieces = Counter(c.compile_id for c in captures)
    seen: Counter = Counter()
    for c in captures:
        shapes = ", ".join(str(s) for s in c.input_shapes[:6])
        more = ", ..." if len(c.input_shapes) > 6 else ""
        tag = " (recompile)" if c.recompile else ""
        seen[c.compile_id] += 1
        if pieces[c.compile_id] > 1:  # one frame, several graphs: DDP's buckets
            tag += (
                f" (piece {seen[c.compile_id]} of {pieces[c.compile_id]}: Dynamo's DDPOptimizer "
                "split the frame at DDP's gradient-bucket boundaries, so each bucket's "
                "all-reduce can start while the backward of the pieces before it runs)"
            )
        lines.append(f"\n== capture {c.compile_id}{tag} of {c.where}; inputs {shapes}{more}")
        lines.append(c.timings.text())
        lines += [f"  {note}" for note in c.linear_ce]
        lines += [graph_text(g, source, brief) for g in c.graphs]
    return "\n".join(lines)


def _belongs(obj: Any) -> Callable[[Capture], bool]:
    """Which captures are of `obj`, a model or function (compiled or not). A model's are
    the ones that took its parameters or buffers: Dynamo passes them in as inputs, and the
    frame it compiles for a compiled module is torch's wrapper, not the model's forward.
    A function's, and a stateless model's, are the ones whose code is theirs."""
    obj = getattr(obj, "_orig_mod", obj)  # torch.compile(model)
    obj = getattr(obj, "_torchdynamo_orig_callable", obj)  # torch.compile(fn)
    if isinstance(obj, torch.nn.Module):
        state = {id(t) for t in (*obj.parameters(), *obj.buffers())}
        inner = getattr(obj, "module", None)  # DistributedDataParallel(model).module
        if isinstance(inner, torch.nn.Module) and not any(c.takes_any(state) for c in CAPTURES):
            # DDP's graph split (DDPOptimizer) compiles its pieces from fake tensors: no
            # capture took the model's own, so they are found by the model's forward
            forward = type(inner).forward.__code__
            return lambda c: forward in c.codes
        if state:
            return lambda c: c.takes_any(state)
        forward = type(obj).forward.__code__
        return lambda c: forward in c.codes
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    return lambda c: bool(c.codes) and c.codes[0] is code  # the frame Dynamo entered


def captures_of(obj: Any) -> list[Capture]:
    """The captures explain shows for `obj` (a trace, a backend, a compiled model or fn)."""
    if obj is None:
        return list(CAPTURES)
    if isinstance(obj, FuserBackend) or hasattr(obj, "captures"):
        return list(obj.captures)
    if isinstance(obj, Capture):
        return [obj]
    belongs = _belongs(obj)
    return [c for c in CAPTURES if belongs(c)]


def explain(obj: Any = None, source: bool = False, brief: bool = False) -> Explanation:
    """Each fused region with its kernels (schedule, reasons; `source=True` adds the
    generated source, `brief=True` keeps one schedule line per kernel) and each ATen call
    with why it was not fused. Returned, not printed (a REPL shows it; a script prints it).

    `obj`: what `fuser.trace` returned, a model or function compiled with
    backend="fuser" or a FuserBackend (after its first call), the model or function
    itself, a FusionDefinition, or None for everything compiled in this process.
    """
    if isinstance(obj, FusionDefinition):
        return obj.explain()
    if isinstance(obj, GraphRecord):
        return Explanation(graph_text(obj, source, brief))
    return Explanation(captures_text(captures_of(obj), source, brief))
