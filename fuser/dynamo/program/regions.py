"""A fused region inlined into the call program: its kernels' launches, written out.

The region module (dynamo/region.py) does at every call what its plan already knows: it
looks the plan up by the inputs' signature, allocates the outputs, launches, and then
packs the outputs (a clone where one would alias another, a copy to ATen's strides). Here
that is decided once, from the plan the first call chose, and written as steps: each
kernel's launch, each op of a segment left to ATen as its call (segments.py), a copy only
where an output would share storage with an input or another output, or lacks the
strides ATen gives. Only check mode's regions (compared with ATen at every call) are
called as modules.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from fuser.backends.registry import get_backend
from fuser.dynamo.program.segments import fresh_result, segment_steps
from fuser.dynamo.program.step import Cast, Step
from fuser.ir.ops import Op
from fuser.runtime.buffers import restride  # the strides ATen gives
from fuser.runtime.cast_group import CASTABLE
from fuser.runtime.checks import check_args
from fuser.runtime.cuda_backend import direct_launcher

if TYPE_CHECKING:
    from fuser.dynamo.program.steps import StepBuilder


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def not_inlined(
    n: fx.Node, region: Any, plan: Any, outs: dict[int, fx.Node], b: StepBuilder
) -> str:
    """Why `region` (called at node n) with `plan`, its CompiledFusion, cannot be
    inlined; "" when it can. `outs`: the getitem node of each region output."""
    if region.check:
        return "check mode (its outputs are compared with ATen's at every call)"
    if _region_device(n, outs, b) is None:
        return "no device seen"
    return ""


def inline_region(
    n: fx.Node, region: Any, plan: Any, outs: dict[int, fx.Node], b: StepBuilder
) -> list[Step]:
    """The steps that run `region` (called at node n) with `plan`, its CompiledFusion
    (not_inlined says it can): its kernels' launches, its ATen segments' calls
    (segments.py), its outputs' copies. `outs`: the getitem node of each region output."""
    inputs = [b.local[p] for p in n.args]
    # the region's own device: its inputs' (define_input puts all of a region's operands
    # on one device), not the graph's first input's, which may be a CPU scalar tensor
    device = _region_device(n, outs, b)
    direct = _direct_outputs(region, plan, outs)
    steps: list[Step] = []
    value: dict[int, str] = dict(zip(plan._input_ids, inputs))
    # per IR value, the values whose storage it may share (an ATen result may be its input)
    roots = {vid: frozenset({vid}) for vid in plan._input_ids}
    shared = set(plan._input_ids)  # storage the region does not own: inputs, constants
    consts: dict[int, float] = {}
    dense = {vid for vid, p in zip(plan._input_ids, n.args) if _seen_contiguous(p, b)}
    for seg in plan.segments:
        kernel = plan.kernels.get(seg.index)
        if kernel is None:
            steps += segment_steps(seg.nodes, value, roots, shared, consts, direct, plan, b, device)
            continue
        args = []
        for is_out, vid, shape, dtype in kernel.arg_plan:
            if is_out:
                name = value[vid] = direct.get(vid) or b.names.fresh("buf")
                roots[vid] = frozenset({vid})
                shape = tuple(int(s) for s in shape)
                alloc = (shape, _alloc_strides(plan, vid, shape), dtype, device)
                steps.append(Step("alloc", (name,), (), alloc=alloc))
            else:
                name = value[vid]
                # not a 2D view: the plan copies it (a region input seen contiguous is
                # contiguous at every call: .contiguous() would return it)
                if (seg.index, vid) in plan.copied and vid not in dense:
                    tmp = b.names.fresh("tmp")
                    code = f"{tmp} = {name}.contiguous()"
                    steps.append(Step("call", (tmp,), (name,), code, (name,), op="contiguous"))
                    name = tmp
            args.append(name)
        steps += _launch(kernel, args, b, device)
    after = _output_steps(region, plan, outs, inputs, direct, value, roots, shared, b)
    if not after and len(plan.segments) == 1:
        _mark_cast(steps, plan, n, b)
    return steps + after


def _mark_cast(steps: list[Step], plan: Any, n: fx.Node, b: StepBuilder) -> None:
    """Mark the launch of a region that only casts one whole value, seen contiguous and
    16-byte aligned, into a fresh contiguous buffer, both dtypes floats (Step.cast:
    CastGroup's kernel takes nothing else): casts.py may launch it
    with others, earlier where the value is a graph input (there from the start), later
    where it is computed. Anything else stays as it is."""
    kernel = plan.kernels.get(plan.segments[0].index)
    if kernel is None or not get_backend(kernel.backend).cast_groups:
        return
    if kernel.workspaces or kernel.spec.checks:
        return
    if [node.op for node in plan.segments[0].nodes] != [Op.CAST] or len(steps) != 2:
        return
    alloc, launch = steps
    (src_out, vin, shape_in, din), (dst_out, _, shape_out, dout) = kernel.arg_plan
    if src_out or not dst_out or alloc.kind != "alloc" or launch.kind != "launch":
        return
    source = n.args[plan._input_ids.index(vin)] if vin in plan._input_ids else None
    lay = b.seen.layouts.get(source) if isinstance(source, fx.Node) else None
    if source is None or lay is None or lay.align:
        return
    if din not in CASTABLE or dout not in CASTABLE:
        return  # the group kernel casts floats only (an int mask, a bool stays alone)
    numel = math.prod(int(d) for d in shape_in)
    shape, stride, dtype, _ = alloc.alloc  # type: ignore[misc]
    if (
        numel != math.prod(int(d) for d in shape_out)
        or not _seen_contiguous(source, b)
        or tuple(stride) != _contiguous(tuple(shape))
        or dtype != dout
        or lay.dtype != din
    ):
        return
    where = "input" if source.op == "placeholder" else "value"
    launch.cast = Cast(b.local[source], alloc.defines[0], numel, din, dout, where)


def _seen_contiguous(p: Any, b: StepBuilder) -> bool:
    lay = b.seen.layouts.get(p)
    return lay is not None and lay.stride == _contiguous(lay.shape)


def _alloc_strides(plan: Any, vid: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return plan.alloc_strides.get(vid) or _contiguous(shape)


def _direct_outputs(region: Any, plan: Any, outs: dict[int, fx.Node]) -> dict[int, str]:
    """Kernel outputs (and ATen segments' results) that are region outputs as they are
    (ATen's strides, or none asked): the buffer gets the output's name. One buffer, one
    name: two fd outputs may be one value (a fusion computes two identical layer norms
    once); the first one named gets it."""
    made: dict[int, tuple[int, ...] | None] = {}  # value -> its buffer's strides
    for seg in plan.segments:
        kernel = plan.kernels.get(seg.index)
        if kernel is None:  # an ATen result of its own storage, of strides ATen chooses
            made.update((n.out.id, None) for n in seg.nodes if fresh_result(n))
            continue
        for is_out, vid, shape, _ in kernel.arg_plan:
            if is_out:
                made[vid] = _alloc_strides(plan, vid, tuple(int(s) for s in shape))
    direct: dict[int, str] = {}
    taken: set[int] = set()
    for k_out, ((kind, j), layout) in enumerate(zip(region.slots, region.layouts)):
        if kind != "fd":
            continue
        vid = plan._output_ids[j]
        fits = layout is None or (made.get(vid) is not None and tuple(layout) == made[vid])
        if j not in taken and vid in made and fits and k_out in outs:
            direct.setdefault(vid, outs[k_out].name)
        taken.add(j)
    return direct


def _output_steps(
    region: Any,
    plan: Any,
    outs: dict[int, fx.Node],
    inputs: list[str],
    direct: dict[int, str],
    value: dict[int, str],
    roots: dict[int, frozenset[int]],
    shared: set[int],
    b: StepBuilder,
) -> list[Step]:
    """The region outputs that are not a kernel's buffer under their own name: a clone
    where one would share storage with an input, a constant or an earlier output (the
    graph is functional), a restride where ATen's strides are asked and not known to be
    the buffer's, else the value itself under the output's name."""
    steps = []
    claimed = set(direct)  # storage that already is an output, under its name
    for k_out, ((kind, j), layout) in enumerate(zip(region.slots, region.layouts)):
        node = outs.get(k_out)
        if node is None:
            continue
        b.local[node] = node.name
        if kind == "fd":
            vid = plan._output_ids[j]
            if direct.get(vid) == node.name:
                continue  # the kernel's buffer, named after the output
            src, cloned = value[vid], bool(roots[vid] & (shared | claimed))
            claimed |= roots[vid]
        else:
            src, cloned = inputs[j], True
        # a clone keeps its source's strides; where ATen's are the contiguous ones
        # (layout None) and the source is an input in another layout (a cast there and
        # back, simplified away), the clone is made contiguous
        how = ""
        if cloned and layout is None:
            how = f"memory_format={b.names.bind(torch.contiguous_format, 'contiguous_format')}"
        lines = [f"{node.name} = {src}.clone({how})"] if cloned else []
        if cloned and layout is None:
            _note_clone(node, src, b)
        if layout is not None:
            fn = b.names.bind(restride, "restride")
            lines.append(f"{node.name} = {fn}({node.name if cloned else src}, {tuple(layout)})")
        if not lines:
            lines = [f"{node.name} = {src}"]
        # restride returns its input when the strides already fit: then it aliases it
        aliases = () if cloned else (src,)
        op = "+".join(["clone"] * cloned + ["restride"] * (layout is not None)) or "alias"
        steps.append(Step("call", (node.name,), (src,), "\n".join(lines), aliases, op=op))
    return steps


def _note_clone(node: fx.Node, src: str, b: StepBuilder) -> None:
    """Offer the clone of graph value `src` that region output `node` is to copies.py,
    which writes it as a name where nobody can tell the two apart (a region's output that
    is its input: a backward whose zero tangent folded an add away, say)."""
    source = next((p for p, name in b.local.items() if name == src and p is not node), None)
    if source is not None and b._same_layout(node, source):
        b.clones[node.name] = src


def _region_device(n: fx.Node, outs: dict[int, fx.Node], b: StepBuilder) -> Any:
    """The device the first call saw the region's tensors on (None: it saw none)."""
    for v in [*n.all_input_nodes, *outs.values()]:
        lay = b.seen.layouts.get(v)
        if lay is not None:
            return lay.device
    return None


def _launch(kernel: Any, args: list[str], b: StepBuilder, device: Any) -> list:
    """Steps that launch `kernel` on the tensors named `args` (its spec's order)."""

    # Triton's compiled launchers, set by a GPU launch (kernel.py); None for the
    # interpreter and for backends that launch otherwise (CUDA's cuda.core launcher)
    fast = kernel._fast
    cuda = direct_launcher(kernel, device) if fast is None else None
    if fast is None and cuda is None:  # the kernel's own unchecked launch
        k = b.names.bind(kernel, kernel.name)
        code = f"{k}.launch_unchecked([{', '.join(args)}])"
        return [Step("launch", (), tuple(args), code, device=device)]
    # a Triton kernel's launcher called directly (runtime/launchers.py; the program checks
    # once per call that no profiler hooked Triton's launches), or the prepared driver
    # launch of a CUDA C++ kernel (runtime/cuda_backend.py)
    steps = []
    extra: list[str] = []
    for dt in kernel.workspace_dtypes:
        ws = b.names.fresh("ws")
        n = kernel.plan.split_rows * kernel.spec.cols
        steps.append(Step("alloc", (ws,), (), alloc=((n,), (1,), dt, device)))
        extra.append(ws)
    uses = (*args, *extra)
    if kernel.spec.checks:
        record, flag = check_args(kernel, device)
        extra += [b.names.bind(record, f"{kernel.name}_errors"), b.names.bind(flag, "error_flag")]
    # tensors go to the launchers as their pointers: a launcher would otherwise call
    # data_ptr itself and ask the driver whether each is a device pointer, which the
    # program knows (Dynamo's guards fix its inputs' devices; it allocates the rest)
    pointers = [f"{a}.data_ptr()" for a in (*args, *extra)]
    if cuda is not None:  # the row count is compiled into a CUDA C++ kernel
        launch = b.names.bind(cuda, f"{kernel.name}_cuda_launch")
        code = f"{launch}([{', '.join(pointers)}], stream)"
        steps.append(Step("launch", (), uses, code, on_stream=True, device=device))
        return steps
    call_args = [*pointers, str(kernel.spec.rows)]
    names = [kernel.name, kernel.name + "_finalize"]
    lines = [_launch_line(launch, call_args, name, b) for launch, name in zip(fast, names)]
    steps.append(Step("launch", (), uses, "\n".join(lines), on_stream=True, device=device))
    return steps


def _launch_line(launch: Any, call_args: list[str], name: str, b: StepBuilder) -> str:
    """The program's line for one DirectLaunch (runtime/launchers.py) of kernel `name`."""
    f = b.names.bind(launch.function, f"{name}_fn")
    gx, gy, gz = launch.grid
    if launch.way == "static":
        call = b.names.bind(launch.call, "static_launch")
        kept = [call_args[i] for i in launch.keep] + ["None", "None"]  # + Triton's scratch
        return (
            f"{call}({f}, {gx}, {gy}, {gz}, {launch.num_warps}, {launch.shared}, "
            f"{launch.types!r}, ({', '.join(kept)}), stream)"
        )
    call = b.names.bind(launch.call, f"{name}_launch")
    m = b.names.bind(launch.packed, f"{name}_meta")
    head = f"{call}({gx}, {gy}, {gz}, stream, {f}"
    tail = ", ".join(call_args)
    if launch.way == "triton-c":  # no cooperative launch, no PDL, no scratch, no hooks
        return f"{head}, 0, 0, None, None, {m}, None, None, None, {tail})"
    return f"{head}, {m}, None, None, None, {tail})"
