"""Lower one AOTAutograd graph: partition, build a FusionDefinition per region, rewrite.

The rewritten graph calls each fused region as a submodule (`fused_3(...)`) and keeps
every other node as the ATen call it was. Units (regions and nodes) are emitted in a
topological order that follows the original program order wherever the data allows;
side-effecting nodes are chained so their relative order never changes.
"""

from __future__ import annotations

import operator
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fuser.config import config, debug_print
from fuser.dynamo.attention import lower_attention
from fuser.dynamo.causal_mask import causal_masks
from fuser.dynamo.ce_rewrite import scale_saved_gradient_in_place
from fuser.dynamo.context import NothingToFuse, NotLowerable
from fuser.dynamo.gemm import lower_gemm
from fuser.dynamo.indexing import lower_scatters
from fuser.dynamo.layout import drop_empty_pieces
from fuser.dynamo.middle_sums import split_middle_sums
from fuser.dynamo.outer_product import outer_products
from fuser.dynamo.pad_mm import pad_matmuls
from fuser.dynamo.partition import form_regions
from fuser.dynamo.program import CallProgram
from fuser.dynamo.region import (
    FusedRegion,
    RegionPlan,
    RegionRecord,
    build_definition,
    meta_inputs,
    record_for,
)
from fuser.dynamo.support import (
    DraftModule,
    copy_module,
    describe,
    draft_module,
    is_free,
    is_side_effect,
    op_name,
    try_lower,
)
from fuser.dynamo.tidy import casts_before_views, dedupe
from fuser.dynamo.views import sink_row_views
from fuser.errors import FuserError

VIEW_ONLY = "only views/constants, no compute: not worth a kernel, stays ATen (free)"
CONSTANTS_ONLY = "scalars computed from constants alone (no tensor input): stays ATen"
IDENTITY = "its region's outputs are views of its inputs (a one-tensor cat, an expand): stays ATen"


@dataclass
class Fallback:
    """An FX node that runs as an ATen call, and why."""

    node: str
    op: str
    reason: str


@dataclass
class GraphRecord:
    """One compiled AOTAutograd graph: forward, backward or inference."""

    kind: str
    name: str
    nodes: int
    regions: list[RegionRecord] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    compile_seconds: float = 0.0
    views_moved: int = 0  # row views taken out from between fusible ops (views.py)
    duplicates: int = 0  # repeated pure ATen calls replaced by the first (tidy.py)
    casts_moved: int = 0  # casts of transposed or reshaped views moved before them (tidy.py)
    outer_products: int = 0  # matmuls contracting one element made products (outer_product.py)
    matmuls_padded: list[str] = field(default_factory=list)  # pad_mm.py's notes
    attention: list[str] = field(default_factory=list)  # attention.py's choices
    scatters: list[str] = field(default_factory=list)  # indexing.py's scatter-adds
    middle_sums: list[str] = field(default_factory=list)  # middle_sums.py's rewrites
    gemm: list[str] = field(default_factory=list)  # gemm.py's choices (FUSER_GEMM)
    error: str = ""  # set when lowering failed and the whole graph runs as ATen ops
    cudagraphs: str = ""  # with CUDA graphs asked for: captured, or why not (cudagraphs.py)
    tangents: str = ""  # a backward lowered for absent tangents: what changed (tangents.py)
    aten_graph: str = ""
    module: fx.GraphModule | None = field(default=None, repr=False)
    program: Any = field(default=None, repr=False)  # the CallProgram, when there is one

    @property
    def fused(self) -> list[RegionRecord]:
        return [r for r in self.regions if r.fused]

    @property
    def kernels(self) -> list[Any]:
        return [k for r in self.fused for k in r.kernels]


def _plan_regions(
    gm: fx.GraphModule, record: GraphRecord, strict: bool, check: bool
) -> list[tuple[RegionPlan, FusedRegion]]:
    reasons: dict[fx.Node, str] = {}
    fusible: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            why = try_lower(n)
            if why is None:
                fusible.add(n)
            else:
                reasons[n] = why
    groups = form_regions(gm.graph, fusible.__contains__, is_side_effect)
    planned = []
    for nodes in groups:
        if all(is_free(n) or n.target is operator.getitem for n in nodes):
            reasons.update((n, VIEW_ONLY) for n in nodes)
            continue
        plan = RegionPlan.of(nodes)
        if _constant_scalars(plan):
            reasons.update((n, CONSTANTS_ONLY) for n in nodes)
            continue
        rec = record_for(f"{record.name}_fused_{len(record.regions)}", plan)
        record.regions.append(rec)
        try:
            fd, slots = build_definition(plan)
            rec.fd = fd
            with unset_fake_temporarily():  # plan now: a FuserError shows at compile time
                fd.compile(meta_inputs(plan))
        except NothingToFuse:
            record.regions.pop()
            reasons.update((n, IDENTITY) for n in nodes)
            continue
        except (NotLowerable, FuserError) as e:
            rec.fallback = f"{type(e).__name__}: {e}"
        except Exception as e:
            if strict:
                raise
            rec.fallback = f"unexpected {type(e).__name__} while fusing: {e}"
        if rec.fallback is not None:
            debug_print(1, f"[fuser.dynamo] {rec.name} runs as ATen ops: {rec.fallback}")
            reasons.update((n, f"in {rec.name}, which fell back: {rec.fallback}") for n in nodes)
            continue
        planned.append((plan, FusedRegion(plan, fd, slots, rec, strict, check)))
    fused = {n for plan, _ in planned for n in plan.nodes}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n not in fused and n.target is not operator.getitem:
            record.fallbacks.append(Fallback(n.name, op_name(n), reasons.get(n, "not fused")))
    return planned


def _constant_scalars(plan: RegionPlan) -> bool:
    """Whether the region makes 0-d values from constants alone: a loss's element count
    once a run-time specialization made the sizes constants (the executor had no kernel
    for it and failed). A region that builds a tensor from constants (positions from an
    iota) keeps its kernel."""
    if any(isinstance(p.meta.get("val"), torch.Tensor) for p in plan.inputs):
        return False
    vals = [o.meta.get("val") for o in plan.outputs]
    return all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals)


def _emit_order(gm: fx.GraphModule, planned: list[tuple[RegionPlan, FusedRegion]]) -> list:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    owner = {n: i for i, (plan, _) in enumerate(planned) for n in plan.nodes}
    dup = {n for plan, _ in planned for n in plan.duplicated}

    def unit(p: fx.Node) -> Any:
        return ("region", owner[p]) if p in owner and p not in dup else p

    dag = nx.DiGraph()
    last_effect = None
    for n in gm.graph.nodes:
        if n in owner and n not in dup:
            continue
        dag.add_node(n)
        for p in n.all_input_nodes:
            dag.add_edge(unit(p), n)
        if is_side_effect(n):
            if last_effect is not None:
                dag.add_edge(last_effect, n)
            last_effect = n
    for i, (plan, _) in enumerate(planned):
        dag.add_node(("region", i))
        for p in plan.inputs:
            dag.add_edge(unit(p), ("region", i))

    def key(u: Any) -> int:
        return order[planned[u[1]][0].nodes[0]] if isinstance(u, tuple) else order[u]

    return list(nx.lexicographical_topological_sort(dag, key=key))


def rewrite(gm: fx.GraphModule, planned: list[tuple[RegionPlan, FusedRegion]]) -> fx.GraphModule:
    """A new GraphModule in which every planned region is one submodule call."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    root = torch.nn.Module()
    for u in _emit_order(gm, planned):
        if not isinstance(u, tuple):
            env[u] = graph.node_copy(u, env.__getitem__)
            if u.op == "get_attr":
                _copy_attr(gm, root, u.target)
            continue
        plan, module = planned[u[1]]
        name = module.record.name
        root.add_module(name, module)
        call = graph.call_module(name, tuple(env[p] for p in plan.inputs))
        for k, o in enumerate(plan.outputs):
            env[o] = graph.call_function(operator.getitem, (call, k))
            env[o].meta = dict(o.meta)
    _box(graph)  # before the module is made: its source is generated once
    return fx.GraphModule(root, graph, gm.__class__.__name__)


def _boxed_codegen() -> Any:
    """torch's boxed calling convention (a list of inputs, each released once consumed),
    or None on a torch without it."""
    try:
        from torch.fx.graph import _BoxedCodeGen
    except ImportError:
        return None
    return _BoxedCodeGen


def _is_boxed(graph: fx.Graph) -> bool:
    codegen = _boxed_codegen()
    return codegen is not None and isinstance(graph._codegen, codegen)


def _box(graph: fx.Graph) -> bool:
    """Give graph the boxed calling convention; False on a torch without it."""
    codegen = _boxed_codegen()
    if codegen is None:
        return False
    if not isinstance(graph._codegen, codegen):
        graph.set_codegen(codegen())
    return True


def _copy_attr(src: torch.nn.Module, dst: torch.nn.Module, target: str) -> None:
    *path, last = target.split(".")
    s, d = src, dst
    for p in path:
        s = getattr(s, p)
        if not hasattr(d, p):
            d.add_module(p, torch.nn.Module())
        d = getattr(d, p)
    setattr(d, last, getattr(s, last))


def boxed(gm: fx.GraphModule) -> Any:
    """gm as AOTAutograd's boxed callable, releasing each input once it is consumed."""
    if not _is_boxed(gm.graph):
        if not _box(gm.graph):  # an older torch: inputs live until the graph returns
            from functorch.compile import make_boxed_func

            return make_boxed_func(gm.forward)
        gm.recompile()
    forward = gm.forward

    def run(args: list) -> Any:
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def is_symbolic(gm: fx.GraphModule) -> bool:
    """Whether Dynamo traced the graph with symbolic sizes (dynamic shapes)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) or (
            isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape)
        ):
            return True
    return False


def _data_dependent_sizes(gm: fx.GraphModule) -> bool:
    """Whether a value of the graph has a size no input size fixes (unbacked: a
    nonzero's, a slice to an .item())."""
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        for v in val if isinstance(val, (tuple, list)) else [val]:
            if isinstance(v, torch.SymInt) or (
                isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in v.shape)
            ):
                return True
    return False


class Specializing:
    """A graph with symbolic sizes, lowered again for each concrete input signature.

    fuser plans kernels for concrete sizes, so a dynamic-shape graph is specialized at run
    time: the first call with new sizes propagates them through a copy of the graph (fake
    tensors) and lowers that copy; explain lists every specialization.
    """

    def __init__(self, gm: fx.GraphModule, kind: str, name: str, strict: bool, check: bool):
        self.gm, self.kind, self.name, self.strict, self.check = gm, kind, name, strict, check
        # an instance attribute: wrappers (torch._dynamo.disable) copy __dict__, not the class
        self._boxed_call = True
        self.compiled: dict[tuple, Any] = {}
        self.records: list[GraphRecord] = []
        self.on_record: Any = None  # called with each new GraphRecord

    def __call__(self, args: list) -> Any:
        key = tuple(
            (tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type)
            if isinstance(a, torch.Tensor)
            else a
            for a in args
        )
        fn = self.compiled.get(key)
        if fn is None:
            name = f"{self.name}_s{len(self.compiled)}"
            try:
                concrete = _propagate(self.gm, args)
            except Exception as e:  # eager runs what sizes cannot be propagated through
                if self.strict:
                    raise
                fn, record = _aten_graph(copy_module(self.gm), self.kind, name, e)
            else:
                fn, record = lower_graph(concrete, self.kind, name, self.strict, self.check)
            record.kind = f"{self.kind} (specialized for sizes {_sizes(args)})"
            self.compiled[key] = fn
            self.records.append(record)
            if self.on_record is not None:
                self.on_record(record)
        return fn(args)


def _sizes(args: list) -> str:
    """The values the graph's symbolic sizes take (its int inputs), or the first shapes."""
    ints = [str(a) for a in args if isinstance(a, int)]
    if ints:
        return ", ".join(ints)
    return ", ".join(str(list(a.shape)) for a in args[:3] if isinstance(a, torch.Tensor))


def _propagate(gm: fx.GraphModule, args: list) -> fx.GraphModule:
    """A copy of gm whose node.meta['val'] hold the concrete sizes of `args` (sizes that
    depend on data, a nonzero's, stay symbolic: unbacked, as in a graph without dynamic
    shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    copy = copy_module(gm)
    for n in copy.graph.nodes:  # symbols of the traced graph's shape environment
        n.meta.pop("unbacked_bindings", None)
    with unset_fake_temporarily():
        mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
        _SizesProp(copy, mode).propagate(*args)
    _fold_sizes(copy.graph)
    copy.recompile()
    return copy


class _SizesProp(FakeTensorProp):
    """FakeTensorProp that also records plain int results (an int input, a sym_size of a
    static shape): FakeTensorProp keeps only tensors and SymInts, so the traced SymInt
    stayed in those nodes' meta (seen on an H200: the embedding backward's num_weights
    was still s15 after the sizes were fixed)."""

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if type(result) is int:
            n.meta["val"] = result
        return result


def _fold_sizes(graph: fx.Graph) -> None:
    """Put the sizes this specialization fixed in as constants: every node whose value is
    now a plain int (a SymInt input, sym_size, arithmetic on sizes) is replaced in its
    users' arguments by that int, so that lowering sees the graph a static trace gives
    (rules read sizes as ints: an embedding backward's num_weights was a node). Nodes
    left unused are dropped; placeholders stay, the call still passes them."""
    for n in list(graph.nodes):
        val = n.meta.get("val")
        if type(val) is not int or n.op not in ("placeholder", "call_function"):
            continue
        for user in list(n.users):
            user.args = fx.map_arg(user.args, lambda a, n=n, val=val: val if a is n else a)
            user.kwargs = fx.map_arg(user.kwargs, lambda a, n=n, val=val: val if a is n else a)
        if n.op == "call_function" and not n.users:
            graph.erase_node(n)


def lower_graph(
    gm: fx.GraphModule, kind: str, name: str, strict: bool = False, check: bool = False
) -> Any:
    """Compile one AOTAutograd graph; returns (boxed callable, GraphRecord).

    Unless strict, an unexpected error while lowering leaves the whole graph to ATen,
    with the error in the record (explain shows it) and a warning.
    """
    t0 = time.perf_counter()
    record = GraphRecord(kind, name, sum(1 for n in gm.graph.nodes if n.op == "call_function"))
    record.aten_graph = "\n".join(describe(n) for n in gm.graph.nodes if n.op == "call_function")
    try:
        work = prepare(gm, record)
        planned = _plan_regions(work, record, strict, check)  # partition, then regions
        new_gm = rewrite(work, planned)
    except Exception as e:
        if strict:
            raise
        return _aten_graph(gm, kind, name, e, record, t0)
    record.module = new_gm
    run = boxed(new_gm)
    if not record.error and not is_symbolic(new_gm) and not _data_dependent_sizes(new_gm):
        # the program is built at the first call, from what that call shows (sizes that
        # depend on the data would be taken for fixed: views of the first call's sizes)
        run = record.program = CallProgram(new_gm, name, run, strict, kind == "backward")
    record.compile_seconds = time.perf_counter() - t0
    return run, record


def _aten_graph(
    gm: fx.GraphModule,
    kind: str,
    name: str,
    e: Exception,
    record: GraphRecord | None = None,
    t0: float | None = None,
) -> Any:
    """gm run as its ATen ops, with the error in its record (explain shows it) and a
    warning; returns (boxed callable, GraphRecord)."""
    t0 = time.perf_counter() if t0 is None else t0
    if isinstance(gm, DraftModule):  # a graph fuser edited without source: run needs it
        gm = copy_module(gm)
    if record is None:
        record = GraphRecord(kind, name, sum(n.op == "call_function" for n in gm.graph.nodes))
    record.error = f"{type(e).__name__}: {str(e)[:500]}"
    record.regions.clear()
    record.fallbacks = [
        Fallback(n.name, op_name(n), "the graph runs as ATen ops (error)")
        for n in gm.graph.nodes
        if n.op == "call_function"
    ]
    warnings.warn(f"fuser: {kind} graph {name} runs as ATen ops: {record.error}", stacklevel=3)
    record.module = gm
    run = boxed(gm)
    record.compile_seconds = time.perf_counter() - t0
    return run, record


def prepare(gm: fx.GraphModule, record: GraphRecord) -> fx.GraphModule:
    """The first stage: a copy of gm (gm stays the ATen fallback) with its matmuls of one
    element's contraction made products, its chosen matmul chains made GEMM template
    calls, its unaligned matmuls padded, its chosen attentions made template calls, its
    scatter-adds calls of fuser's scatter kernel, its repeated pure calls merged, its
    casts of views moved before them, its sums over a few middle elements adds of views,
    and its row views moved out from between fusible ops."""
    work = draft_module(gm)  # read as a graph from here on: rewrite() makes the module
    scale_saved_gradient_in_place(work)
    record.outer_products = outer_products(work.graph)  # rotary angles: inv_freq @ positions
    record.gemm = lower_gemm(work)  # before padding: a template call needs none
    if config.pad_matmuls:
        record.matmuls_padded = pad_matmuls(work)
    record.attention = causal_masks(work) + lower_attention(work)
    record.scatters = lower_scatters(work)
    drop_empty_pieces(work.graph)  # a KV cache's first cat: a copy of its one piece
    record.duplicates = dedupe(work.graph)  # SDPA's math backward casts a tensor twice
    record.casts_moved = casts_before_views(work.graph)  # ... and casts transposed views
    record.middle_sums = split_middle_sums(work.graph)  # GQA's gradient over shared heads
    record.views_moved = sink_row_views(work.graph)
    return work
