"""One fused region: its FusionDefinition, the module that runs it, and its eager fallback."""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from fuser.config import debug_print
from fuser.dynamo.context import LOWERINGS, LowerCtx, NothingToFuse, NotLowerable, meta_of
from fuser.dynamo.support import describe, is_free, op_name
from fuser.errors import FuserError, OutOfBoundsError
from fuser.frontend.builder import Tensor
from fuser.frontend.fusion_definition import FusionDefinition
from fuser.runtime.buffers import restride
from fuser.runtime.cache import digest

# identical regions (the same blocks of a transformer) share one FusionDefinition, so
# they share its plans and its compiled kernels
_DEFINITIONS: dict[str, FusionDefinition] = {}


@dataclass
class RegionRecord:
    """What explain shows about one region."""

    name: str
    nodes: list[str]
    ops: str
    inputs: int
    outputs: int
    fd: FusionDefinition | None = None
    fallback: str | None = None  # why it runs as ATen ops, if it does
    calls: int = 0
    restrided: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)  # found by check mode
    program: Any = field(default=None, repr=False)  # the call program that launches it

    @property
    def total_calls(self) -> int:
        """Calls through its module plus calls of the program that inlines it."""
        return self.calls + (self.program.calls if self.program is not None else 0)

    @property
    def fused(self) -> bool:
        return self.fallback is None and self.fd is not None

    @property
    def kernels(self) -> list[Any]:
        return self.fd.kernels if self.fused and self.fd is not None else []


@dataclass
class RegionPlan:
    """The FX side of a region: its nodes, what flows in and out, what is duplicated."""

    nodes: list[fx.Node]
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    duplicated: list[fx.Node]  # views/constants also kept as ATen nodes for outside users

    @staticmethod
    def of(nodes: list[fx.Node]) -> RegionPlan:
        inside = set(nodes)
        # a free node (view, constant) used outside stays an ATen node for those users, so
        # the region never materializes a broadcast it does not need; so do the free nodes
        # such an ATen copy reads (a constant under a duplicated expand)
        outside: set[fx.Node] = set()
        for n in reversed(nodes):
            if is_free(n) and any(u not in inside or u in outside for u in n.users):
                outside.add(n)
        dup = [n for n in nodes if n in outside]
        outputs = [
            n
            for n in nodes
            if n not in outside and any(u not in inside or u in outside for u in n.users)
        ]
        inputs: dict[fx.Node, None] = {}
        for n in nodes:
            for p in n.all_input_nodes:
                if p not in inside:
                    inputs.setdefault(p)
        return RegionPlan(list(nodes), list(inputs), outputs, dup)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.target is not operator.getitem:
                name = op_name(n).removeprefix("aten.")
                counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in counts.items())


def build_definition(
    plan: RegionPlan, copies: dict[int, int] | None = None
) -> tuple[FusionDefinition, list[tuple[str, int]]]:
    """The region as a FusionDefinition, and for each region output where it comes from:
    ("fd", k) for the definition's output k, ("in", j) for region input j itself.
    `copies`: region output i -> region input j, outputs that are input j in another
    layout once the definition is simplified (found by _hidden_relayouts)."""
    fd = FusionDefinition("region")
    ctx = LowerCtx(fd)
    inputs = [ctx.define_input(p) for p in plan.inputs]
    for n in plan.nodes:
        if n.target is operator.getitem:
            src = ctx.values[n.args[0]]
            ctx.values[n] = src[n.args[1]]
            continue
        outs = LOWERINGS[n.target](ctx, n)
        ctx.values[n] = outs[0] if isinstance(meta_of(n), torch.Tensor) else outs
    slots: list[tuple[str, int]] = []
    added: dict[int, int] = {}
    for i_out, o in enumerate(plan.outputs):
        t = ctx.values[o]
        if not isinstance(t, Tensor):
            raise NotLowerable(f"region output {o.name} is not a tensor")
        j = next((j for j, i in enumerate(inputs) if i.value.id == t.value.id), None)
        if copies and i_out in copies:
            j = copies[i_out]
            t = inputs[j]
        if j is not None and _relayout(plan.inputs[j], o):
            # a clone into another layout (a transposed view made contiguous): the input
            # itself is not the output, a copy is; an identity read of the last dim is one
            n = t.shape[-1] if t.ndim else 1
            t = fd.ops.view(t, t.ndim - 1, n, 1, 0, 0, n) if t.ndim else fd.ops.cast(t, t.dtype)
        elif j is not None:
            slots.append(("in", j))
            continue
        if t.value.id not in added:
            added[t.value.id] = len(added)
            fd.add_output(t)
        slots.append(("fd", added[t.value.id]))
    if not added:
        raise NothingToFuse("the region computes nothing (only identities of its inputs)")
    for o, (kind, k) in zip(plan.outputs, slots):
        layout = _layout(o)  # ATen's strides, when not contiguous: the kernel writes them
        if kind == "fd" and layout is not None:
            fd.output_strides.setdefault(k, layout)
    fd.graph  # finalize: verify now, not at the first run  # noqa: B018
    if copies is None:
        hidden = _hidden_relayouts(plan, fd, slots)
        if hidden:
            return build_definition(plan, hidden)
    key = repr(fd) + (f" strides {sorted(fd.output_strides.items())}" if fd.output_strides else "")
    shared = _DEFINITIONS.setdefault(key, fd)
    shared.name = "fx_" + digest(key)[:10]
    return shared, slots


def _hidden_relayouts(
    plan: RegionPlan, fd: FusionDefinition, slots: list[tuple[str, int]]
) -> dict[int, int]:
    """Region outputs that the definition's passes reduce to an input in another layout
    (a bf16 -> fp32 -> bf16 round trip, then a clone of a transposed view, as SDPA's math
    path leaves them): region output i -> input j. Without a copy in the definition such
    an output would be the input itself, and the call program would clone it with ATen's
    strided copy (~30% of copy on an H200, against ~85% for a fused copy). The passes run
    only where an output could be one: an input of its shape and dtype in other strides."""
    maybe = any(
        _same_kind(p, o) and _relayout(p, o)
        for o, (kind, _) in zip(plan.outputs, slots)
        if kind == "fd"
        for p in plan.inputs
    )
    if not maybe:
        return {}
    final = fd.pipeline().final
    position = {v.id: j for j, v in enumerate(final.inputs)}
    out = {}
    for i, (o, (kind, k)) in enumerate(zip(plan.outputs, slots)):
        j = position.get(final.outputs[k].id) if kind == "fd" else None
        if j is not None and _relayout(plan.inputs[j], o):
            out[i] = j
    return out


def _same_kind(a: fx.Node, b: fx.Node) -> bool:
    x, y = meta_of(a), meta_of(b)
    return (
        isinstance(x, torch.Tensor)
        and isinstance(y, torch.Tensor)
        and x.shape == y.shape
        and x.dtype == y.dtype
    )


def _relayout(src: fx.Node, out: fx.Node) -> bool:
    """Whether region output `out`, an identity of input `src`, has other strides (a
    clone of a transposed view: ATen's result is contiguous, the input is not)."""
    a, b = meta_of(src), meta_of(out)
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.numel() <= 1:
        return False
    dims = [i for i, size in enumerate(b.shape) if size != 1]
    return any(a.stride()[i] != b.stride()[i] for i in dims)


def meta_inputs(plan: RegionPlan) -> list[torch.Tensor]:
    """Meta tensors shaped, strided and typed like the region's inputs, for planning."""
    out = []
    for p in plan.inputs:
        m = meta_of(p)
        out.append(torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device="meta"))
    return out


def eager_graph(plan: RegionPlan) -> fx.Graph:
    """The region's original ATen ops as a graph of their own (copied now: the nodes
    leave the captured graph when the region takes their place)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for p in plan.inputs:
        env[p] = g.placeholder(p.name)
        env[p].meta = dict(p.meta)
    for n in plan.nodes:
        env[n] = g.node_copy(n, env.__getitem__)
    g.output(tuple(env[o] for o in plan.outputs))
    return g


def _non_overlapping(shape: torch.Size, stride: tuple[int, ...]) -> bool:
    """Whether a fresh buffer can have these strides: each dim steps over all of the ones
    inside it (a permutation of a contiguous layout, or one with gaps between rows, as
    fuser::cross_entropy's gradient has), no two elements at one address."""
    expect = 1
    for st, size in sorted((st, size) for size, st in zip(shape, stride) if size != 1):
        if st < expect:
            return False
        expect = st * size
    return True


def _layout(node: fx.Node) -> tuple[int, ...] | None:
    """Strides ATen gives this output when they are not the contiguous ones."""
    m = meta_of(node)
    if m.is_contiguous() or not _non_overlapping(m.shape, m.stride()):
        return None
    return tuple(m.stride())


class FusedRegion(torch.nn.Module):
    """Runs a region's FusionDefinition; falls back to its ATen ops if fuser fails."""

    def __init__(
        self,
        plan: RegionPlan,
        fd: FusionDefinition,
        slots: list[tuple[str, int]],
        record: RegionRecord,
        strict: bool,
        check: bool = False,
    ):
        super().__init__()
        self.fd, self.slots, self.record, self.strict = fd, slots, record, strict
        self.check = check
        # the fallback module is made on first use: a GraphModule generates and compiles
        # its Python source, ~6 ms a region, and most regions never fall back
        self._eager_graph: fx.Graph | None = eager_graph(plan)
        self._eager: fx.GraphModule | None = None
        self.layouts = [_layout(o) for o in plan.outputs]
        # the dtypes the captured graph gives the outputs (the check's reference for them)
        self.graph_dtypes = [meta_of(o).dtype for o in plan.outputs]
        # outputs whose kernel writes ATen's strides in place (fd.output_strides) need no copy
        last = fd._runtime().last
        in_place = set(last.alloc_strides) if last is not None else set()
        ids = last._output_ids if last is not None else []
        record.restrided = [
            o.name
            for o, s, (kind, k) in zip(plan.outputs, self.layouts, slots)
            if s and not (kind == "fd" and k < len(ids) and ids[k] in in_place)
        ]

    @property
    def eager(self) -> fx.GraphModule:
        """The region's original ATen ops as a module: the fallback when fuser gives up."""
        if self._eager is None:
            assert self._eager_graph is not None
            self._eager = fx.GraphModule(torch.nn.Module(), self._eager_graph, "eager_region")
            self._eager_graph = None
        return self._eager

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.record.calls += 1
        if self.record.fallback is None:
            try:
                outs = self.fd.execute(list(args))
            except (torch.cuda.OutOfMemoryError, OutOfBoundsError):
                raise  # a bad index is the data's fault: the region stays fused
            except Exception as e:
                if self.strict:
                    raise
                self._give_up(e)
            else:
                result = self._pack(outs, args)
                if self.check:
                    want = self.eager(*args)
                    if not self._compare(result, want, args):
                        return want  # the region's own ATen result, after the warning
                return result
        return self.eager(*args)

    def _compare(self, got: tuple, want: tuple, args: tuple) -> bool:
        """check mode: each output against the region's ATen ops. A difference raises when
        strict; otherwise it is recorded in the region's record with a warning. Regions
        that touch 16-bit floats anywhere are compared at 16-bit precision."""
        half = (torch.float16, torch.bfloat16)
        tensors = (*args, *want, *got)
        low = any(t.dtype in half for t in tensors if isinstance(t, torch.Tensor))
        ok = True
        for i, (g, w) in enumerate(zip(got, want)):
            problem = None
            # a dtype the graph's meta gives and ATen's kernel does not (CPU's
            # native_layer_norm of a bf16 input with fp32 weights: mean and rstd in fp32,
            # its meta says bf16) is the graph's: fuser follows the graph
            graph_dtype = g.dtype == self.graph_dtypes[i] and g.is_floating_point()
            if g.shape != w.shape or (g.dtype != w.dtype and not graph_dtype):
                problem = f"is {g.dtype}{list(g.shape)}, ATen gives {w.dtype}{list(w.shape)}"
            else:
                tol = 1e-2 if low else 1e-4
                wide = torch.float64 if w.dtype == torch.float64 else torch.float32
                gf, wf = g.to(wide), w.to(wide)
                scale = max(1.0, wf.abs().max().item()) if wf.numel() else 1.0
                if not torch.allclose(gf, wf, atol=tol * scale, rtol=tol, equal_nan=True):
                    err = (gf - wf).abs().nan_to_num(float("inf")).max().item()
                    problem = f"differs from ATen by {err:.3g} (largest |ATen value| {scale:.3g})"
            if problem is None:
                continue
            ok = False
            text = f"output {i} ({self.record.output_names[i]}) {problem}"
            if self.strict:
                raise AssertionError(f"fuser check: {self.record.name} {text}\n{self.fd!r}")
            if not any(m.startswith(f"output {i} ") for m in self.record.mismatches):
                self.record.mismatches.append(text)
                warnings.warn(f"fuser check: {self.record.name} {text}", stacklevel=3)
        return ok

    def _give_up(self, e: Exception) -> None:
        kind = "fuser error" if isinstance(e, FuserError) else "unexpected error"
        reason = f"{kind} at run time: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        self.record.fallback = reason
        warnings.warn(
            f"fuser: region {self.record.name} runs as ATen ops from now on: {reason}",
            stacklevel=3,
        )
        debug_print(1, f"[fuser.dynamo] {self.record.name}: {reason}")

    def _pack(self, outs: list[torch.Tensor], args: tuple) -> tuple[torch.Tensor, ...]:
        storages = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        result, seen = [], set()
        for (kind, k), stride in zip(self.slots, self.layouts):
            t = outs[k] if kind == "fd" else args[k]
            # an output must never alias an input or another output: the graph is functional
            # (two fusion outputs may be one value, computed once: the same tensor)
            ptr = t.untyped_storage().data_ptr()
            if kind == "in" or k in seen or ptr in storages:
                # contiguous where ATen's strides are (stride None): the value may be an
                # input in another layout (a cast there and back, simplified away)
                t = t.clone(memory_format=torch.contiguous_format) if stride is None else t.clone()
            if kind == "fd":
                seen.add(k)
            if stride is not None:
                t = restride(t, stride)
            storages.add(t.untyped_storage().data_ptr())
            result.append(t)
        return tuple(result)


def record_for(name: str, plan: RegionPlan) -> RegionRecord:
    return RegionRecord(
        name,
        [describe(n) for n in plan.nodes],
        plan.summary(),
        len(plan.inputs),
        len(plan.outputs),
        output_names=[o.name for o in plan.outputs],
    )
