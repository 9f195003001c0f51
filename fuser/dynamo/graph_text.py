"""The text of one compiled graph and its regions: what `fuser.explain` shows per graph, and
what the backend prints at FUSER_DEBUG >= 2 (no import of the backend here, so both can
use it)."""

from __future__ import annotations

from fuser.dynamo.gemm_call import template_sources
from fuser.dynamo.lower import GraphRecord
from fuser.dynamo.region import RegionRecord
from fuser.dynamo.saved import saved_for_backward, saved_summary


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def _brief_kernels(r: RegionRecord) -> list[str]:
    """One line per kernel (name, ops, schedule) and per ATen segment of the fusion."""
    assert r.fd is not None
    plan = r.fd._runtime().last
    if plan is None:
        return []
    lines = []
    for seg in plan.segments:
        k = plan.kernels.get(seg.index)
        if k is None:
            lines.append(f"    ATen segment: {seg.ops_summary()} ({seg.reason})")
            continue
        head, _, sched, *_ = k.explain().splitlines() + ["", "", ""]
        lines.append(f"    {head.removeprefix('kernel ')}")
        lines.append(f"      {sched.strip()}")
    return lines


def region_text(r: RegionRecord, source: bool = False, brief: bool = False) -> str:
    head = f"  region {r.name}: {r.ops}  ({r.inputs} inputs, {r.outputs} outputs"
    head += f", {r.total_calls} calls)" if r.total_calls else ")"
    lines = [head]
    if r.fallback is not None:
        lines.append(f"    runs as ATen ops: {r.fallback}")
        return "\n".join(lines)
    assert r.fd is not None
    for m in r.mismatches:
        lines.append(f"    CHECK FAILED: {m}")
    if r.restrided:
        lines.append(f"    outputs {', '.join(r.restrided)} are copied to ATen's strides")
    if brief:
        return "\n".join(lines + _brief_kernels(r))
    lines.append(f"    fusion {r.fd.name}:")
    lines.append(_indent(r.fd._runtime().explain(), "      "))
    if source:
        for k in r.fd.kernels:
            lines.append(f"    source of {k.name}:")
            lines.append(_indent(k.source, "      "))
    return "\n".join(lines)


def fallbacks_text(record: GraphRecord) -> str:
    groups: dict[tuple[str, str], list[str]] = {}
    for f in record.fallbacks:
        groups.setdefault((f.op, f.reason), []).append(f.node)
    lines = [f"  ATen calls ({len(record.fallbacks)}):"]
    for (op, reason), names in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        count = f" x{len(names)}" if len(names) > 1 else f" ({names[0]})"
        lines.append(f"    {op}{count}: {reason}")
    return "\n".join(lines)


def graph_text(record: GraphRecord, source: bool = False, brief: bool = False) -> str:
    fused = record.fused
    lines = [
        f"-- {record.kind} graph {record.name}: {record.nodes} ATen ops -> {len(fused)} fused "
        f"regions ({len(record.kernels)} kernels), {len(record.fallbacks)} ATen calls; "
        f"lowered in {record.compile_seconds:.2f}s"
    ]
    if record.error:
        lines.append(f"  LOWERING FAILED, the graph runs as ATen ops: {record.error}")
    if record.tangents:
        lines.append(f"  {record.tangents}")
    lines += [f"  matmul {note}" for note in record.matmuls_padded]
    lines += [f"  {note}" for note in record.attention]
    lines += [f"  {note}" for note in record.scatters]
    lines += [f"  sum {note}" for note in record.middle_sums]
    if record.outer_products:
        lines.append(
            f"  {record.outer_products} matmul(s) contracting one element made products "
            "(outer_product.py): they fuse with their producers and consumers"
        )
    if record.duplicates or record.casts_moved:
        lines.append(
            f"  tidied: {record.duplicates} repeated ATen call(s) merged, "
            f"{record.casts_moved} cast(s) of a view moved before the view"
        )
    lines += [f"  {note}" for note in record.gemm]
    if record.kind == "forward" and record.module is not None:
        lines.append("  " + saved_summary(saved_for_backward(record.module)))
    if source and record.module is not None:  # the GEMM template calls' kernels
        lines += [_indent(src) for src in template_sources(record.module)]
    lines += [region_text(r, source, brief) for r in record.regions]
    lines.append(fallbacks_text(record))
    if record.cudagraphs:
        lines.append(f"  CUDA graphs: {record.cudagraphs}")
    if record.program is not None:
        lines.append("  " + record.program.summary())
        if source and record.program.source:
            lines.append(_indent(record.program.source))
    return "\n".join(lines)
