"""fuser's side of a profile: every fused region of the compiled graphs, its kernels (names
as launched, bytes from the plan) and where in the model it sits; and marks that make a
profile say which region launched each kernel.

Identical regions (the same block repeated) share one fusion and so one kernel name
(fx_<hash>_k<segment>), so a kernel name alone does not say which block ran it. The
attributes pass of a profile (capture.py) wraps each region call in a
`record_function("fuser.region#<region name>")` through module hooks; the timing pass
runs without them.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Any

from torch.autograd.profiler import record_function

from fuser.config import config
from fuser.ir.ops import LEAF, MOVEMENT, Op

REGION_MARK = "fuser.region#"
_SHORT = {"forward": "fw", "backward": "bw", "inference": "inf"}
# ops a kernel may hold and still only move data: casts, broadcasts, constants
_NO_ARITHMETIC = LEAF | MOVEMENT | {Op.CAST}


def _module_path(node: Any) -> str | None:
    """The module a node of an AOTAutograd graph came from (forward nodes carry
    nn_module_stack, backward nodes the forward's as fwd_nn_module_stack)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"^L\['[^']+'\]\.?", "", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip(".") or "top"  # the model's own forward, in no submodule


def scope_of(region_module: Any) -> str:
    """Where a region sits in the model: the module paths of its nodes (or, when they
    have none, of its inputs), without paths that another one extends (h.0 + h.0.ln_2 ->
    h.0.ln_2); '-' when none is known."""
    graph = getattr(getattr(region_module, "eager", None), "graph", None)
    nodes = list(graph.nodes) if graph is not None else []
    paths: list[str] = []
    # the region's own nodes, else (nodes a decomposition made carry no stack) its inputs'
    for kind in ("call_function", "placeholder"):
        for n in nodes:
            p = _module_path(n) if n.op == kind else None
            if p and p not in paths:
                paths.append(p)
        if paths:
            break
    if len(paths) > 1 and "top" in paths:
        paths.remove("top")
    kept = [p for p in paths if not any(q != p and q.startswith(p + ".") for q in paths)]
    if not kept:
        return "-"
    return " + ".join(kept[:2]) + (" + ..." if len(kept) > 2 else "")


def short_ops(ops: str) -> str:
    """'native_layer_norm_backward, add.Tensor, sum.dim_IntList' without overloads."""
    parts = [re.sub(r"\.[A-Za-z_]+(?= x\d+|$)", "", p.strip()) for p in ops.split(",")]
    return ", ".join(p for p in parts if p)


def _kernels(fd: Any) -> list[dict]:
    """The kernels one call of the fusion launches, in order, each as a table entry."""
    plan = fd._runtime().last if fd is not None else None
    if plan is None:
        return []
    out = []
    for seg in plan.segments:
        k = plan.kernels.get(seg.index)
        if k is None:
            continue  # an ATen segment: its ATen kernels show as themselves
        copy_only = all(n.op in _NO_ARITHMETIC for n in seg.nodes)
        entry = {
            "kernel": k.name,
            "bytes": int(k.spec.bytes_moved()),
            "scheduler": k.schedule.kind,
            "schedule": k.schedule.short(),
            "ops": seg.ops_summary(),
            "copy_only": copy_only,
            "backend": k.backend,
        }
        out.append(entry)
        if k.workspaces:  # the partial sums written by the kernel, read by its finalize
            ws = k.schedule.split_rows * k.spec.cols * 4 * len(k.workspaces)
            fin = {**entry, "kernel": k.name + "_finalize", "bytes": ws, "finalize": True}
            out.append({**fin, "ops": "sum of the partial rows"})
    return out


def region_modules(captures: list[Any]) -> list[tuple[Any, Any, Any]]:
    """(graph record, region record, region module) of every region fuser compiled."""
    out = []
    for c in captures:
        for g in c.graphs:
            module = getattr(g, "module", None)
            if module is None:
                continue
            for mod in module.children():
                if hasattr(mod, "record") and hasattr(mod, "fd"):
                    out.append((g, mod.record, mod))
    return out


def region_table(captures: list[Any]) -> dict[str, dict]:
    """Region name -> its label ("bw h.3.ln_2 · native_layer_norm_backward, add, sum"),
    scope, ops, graph, whether it fell back, and its kernels with their bytes."""
    table = {}
    for g, rec, mod in region_modules(captures):
        kind = _SHORT.get(g.kind.split(" ")[0], g.kind)
        scope = scope_of(mod)
        ops = short_ops(rec.ops)
        table[rec.name] = {
            "label": f"{kind} {scope} · {ops}",
            "scope": scope,
            "ops": ops,
            "graph": g.name,
            "fusion": rec.fd.name if rec.fd is not None else None,
            "fallback": rec.fallback,
            "kernels": _kernels(rec.fd) if rec.fused else [],
        }
    return table


def kernel_index(table: dict[str, dict]) -> dict[str, dict]:
    """Kernel name -> its entry, with the regions that launch it (for a trace without
    region marks, where only the name is known)."""
    out: dict[str, dict] = {}
    for name, region in table.items():
        for k in region["kernels"]:
            e = out.setdefault(k["kernel"], {**k, "regions": []})
            e["regions"].append(name)
    return out


@contextmanager
def marked(captures: list[Any]):  # noqa: ANN201 - a context manager
    """Within it, each fused region's call is a profiler annotation named after it. The
    marks come from the region modules' hooks, so the graphs run the old way meanwhile
    (a call program launches its regions' kernels without calling their modules)."""
    handles, open_marks = [], {}

    def enter(mod: Any, args: Any) -> None:
        rf = record_function(REGION_MARK + mod.record.name)
        rf.__enter__()
        open_marks.setdefault(id(mod), []).append(rf)

    def leave(mod: Any, args: Any, out: Any) -> None:
        marks = open_marks.get(id(mod))
        if marks:
            marks.pop().__exit__(None, None, None)

    for _, _, mod in region_modules(captures):
        handles.append(mod.register_forward_pre_hook(enter))
        handles.append(mod.register_forward_hook(leave, always_call=True))
    program, config.call_program = config.call_program, False
    try:
        yield
    finally:
        config.call_program = program
        for h in handles:
            h.remove()
