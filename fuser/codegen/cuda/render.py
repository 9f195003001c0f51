"""The CUDA C++ kernel writer: prints a KernelPlan (compiled with NVRTC).

Like the Triton renderer, every kernel is written for its exact input signature: sizes,
strides and alignment are literals. What CUDA adds is spelled out:

- a thread owns `vector` consecutive columns of a row and moves them with one 16-byte
  (or the widest legal) packed access; an argument whose alignment or strides forbid
  that gets narrower packs or strided scalar accesses;
- values that live across a reduction are register arrays `t13[c][i]` indexed only by
  fully unrolled loops, so nothing lands in local memory;
- row reductions are warp shuffles, then shared memory across the warps of a row;
- when the split is exact the code carries no predicates; otherwise only the tail chunk
  and the last row block are predicated.

Every memory access belongs to a *nest*: the slots a thread walks in one pass (the
chunks of a row, the vectors of a pointwise tile, the rows in flight of a column
reduction). A nest first issues the loads of all its slots, then computes element by
element and stores, so every load is in flight at once.

This module holds the writer's memory accesses, reductions, nests and kernel frame;
expressions.py the C expressions of values (its base class); one module per kernel kind
writes the bodies (pointwise.py, persistent.py, looped.py, outer.py; kernels.py maps a
plan's kind to one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fuser.codegen.cuda.expressions import CudaExpressions
from fuser.codegen.cuda.templates import (
    COMPUTE,
    MEMORY,
    REDUCE_FN,
    acc_type,
    combine,
    from_memory,
    identity,
    round_to,
    to_memory,
)
from fuser.ir.graph import Node, Value
from fuser.ir.ops import REDUCE, Op
from fuser.schedulers.spec import CHECK_PARAMS, Arg
from fuser.segmenter import Kind


@dataclass
class Region:
    """Slots of a nest with one width: `header` loops over them (empty: one slot, named
    in `setup`); `setup` defines the slot's `row`/`col` and its guards."""

    header: str
    setup: list[str]
    width: int
    row_ok: str | None = None
    col_ok: str | None = None
    # the aligned-start walk's head: the slot holding column 0 starts before it (the
    # columns < 0 are off)
    head: bool = False


@dataclass
class Nest:
    """One pass of a thread over its slots.

    nodes: element-level nodes computed here (plus slot-level ROW nodes if row_level);
    reductions: accumulated element by element into `acc(node)`, masked by the region's
    column guard (`reduce_guard="col"`, row reductions) or row guard ("row");
    keep: values this nest writes into register arrays for later nests;
    given: values defined at the top of the element loop (id -> C expression);
    store_when: an extra condition for storing outputs of a kind (first row or column).
    """

    regions: list[Region]
    slots: int
    var: str
    nodes: list[Node]
    reductions: list[Node] = field(default_factory=list)
    acc: Callable[[Node], str] = lambda n: f"acc_{n.out.name}"
    reduce_guard: str = "col"
    keep: set[int] = field(default_factory=set)
    row_level: bool = False
    given: dict[int, str] = field(default_factory=dict)
    store_when: dict[Kind, str] = field(default_factory=dict)
    # column reductions accumulated across rows into `cacc_<name>[slot][i]`, guarded by
    # the region's row and column guards (an inner_outer kernel)
    columns: list[Node] = field(default_factory=list)


# kernels whose blocks split the rows (a column reduction's COL outputs are its results)
ROW_KINDS = ("pointwise", "inner_persistent", "inner_looped")


class CudaKernelWriter(CudaExpressions):
    # -- memory ------------------------------------------------------------------------
    def offset(self, a: Arg) -> str:
        """Element offset of `a` at the scope's `row` and `col` (a slot's first column)."""
        terms = []
        if a.value.id in self.spec.gathers:  # a gathered table: the row its index names
            at = self.gather_at(a)
            terms.append(at if a.row_stride == 1 else f"{at} * {a.row_stride}")
        elif a.row_dims:  # rows not one stride apart: each row dim's index and stride
            terms.append(a.row_offset("row", "/"))
        elif a.kind in (Kind.FULL, Kind.ROW) and a.row_stride:
            terms.append("row" if a.row_stride == 1 else f"row * {a.row_stride}")
        if a.kind in (Kind.FULL, Kind.COL) and a.col_stride:
            terms.append("col" if a.col_stride == 1 else f"col * {a.col_stride}")
        return " + ".join(terms) or "0"

    def gather_index(self, table: Arg) -> str:
        """The index element naming the row of `table` at the scope's `row`, read through
        the const __restrict__ pointer (ptxas loads it once per slot and row)."""
        index = self.spec.gathers[table.value.id].index
        return f"{index.name}_ptr[{self.offset(index)}]"

    def gather_at(self, table: Arg) -> str:
        """The table row a gathered load reads, in the plan's bits for its row offset (a
        narrowed int64 index is in range: the load is guarded by its check)."""
        ix, index = self.gather_index(table), self.spec.gathers[table.value.id].index
        if self.s.gather_index_bits(table) == 64:
            return f"(long long){ix}"
        return ix if index.dtype.itemsize == 4 else f"(int){ix}"

    def access(self, a: Arg, width: int, arr: str, load: bool) -> list[str]:
        """Statements moving `width` elements between `a` at (row, col) and array `arr`."""
        ptr, off = f"{a.name}_ptr", self.offset(a)
        p = self.s.pack(a, width)
        if p > 1:
            fn = "load_pack" if load else "store_pack"
            if p == width:
                pair = (arr, f"{ptr} + {off}") if load else (f"{ptr} + {off}", arr)
                return [f"{fn}<{p}>({pair[0]}, {pair[1]});"]
            pair = (f"{arr} + k", f"{ptr} + {off} + k")
            pair = pair if load else pair[::-1]
            return [
                "#pragma unroll",
                f"for (int k = 0; k < {width}; k += {p}) {fn}<{p}>({pair[0]}, {pair[1]});",
            ]
        if width == 1:
            mem, el = f"{ptr}[{off}]", f"{arr}[0]"
            return [f"{el} = {mem};" if load else f"{mem} = {el};"]
        step = "k" if a.col_stride == 1 else f"k * {a.col_stride}"
        mem, el = f"{ptr}[{off} + {step}]", f"{arr}[k]"
        stmt = f"{el} = {mem};" if load else f"{mem} = {el};"
        return ["#pragma unroll", f"for (int k = 0; k < {width}; ++k) {stmt}"]

    def partial(self, r: Region) -> bool:
        """True when a guarded slot of `r` may straddle the row end (its first column in
        the row, its last not): the column count is not a multiple of the slot width, or
        the slots start `shift` columns off it (the aligned-start walk's tail)."""
        straddles = self.spec.cols % r.width != 0 or bool(self.s.walk_align)
        return r.head or (bool(r.col_ok) and straddles)

    def element_ok(self, r: Region) -> str | None:
        """The column guard of element i of a slot of `r`."""
        if r.head:
            return "col + i >= 0"
        return "col + i < COLS" if self.partial(r) else r.col_ok

    def slot_access(self, a: Arg, r: Region, arr: str, load: bool) -> list[str]:
        """access() for one slot of `r`; the slot straddling the row end falls back to
        element-by-element accesses, each predicated (a packed one would cross it)."""
        stmts = self.access(a, r.width, arr, load)
        if a.kind not in (Kind.FULL, Kind.COL) or not self.partial(r):
            return stmts
        step = "k" if a.col_stride == 1 else f"k * {a.col_stride}"
        mem, el = f"{a.name}_ptr[{self.offset(a)} + {step}]", f"{arr}[k]"
        one = f"{el} = {mem};" if load else f"{mem} = {el};"
        whole, part = (f"col + {r.width} <= COLS", "col + k < COLS")
        if r.head:
            whole, part = "col >= 0", "col + k >= 0"
        return [
            f"if ({whole}) {{",
            *(self.w.unit + x for x in stmts),
            "} else {",
            self.w.unit + "#pragma unroll",
            f"{self.w.unit}for (int k = 0; k < {r.width}; ++k) if ({part}) {one}",
            "}",
        ]

    def guard(self, a: Arg, region: Region) -> str | None:
        parts = []
        if a.kind in (Kind.FULL, Kind.ROW) and region.row_ok:
            parts.append(region.row_ok)
        if a.kind in (Kind.FULL, Kind.COL) and region.col_ok:
            parts.append(region.col_ok)
        g = self.spec.gathers.get(a.value.id)
        if g is not None:  # never a read at a bad index (its check_index reports it)
            parts.append(f"(unsigned long long){self.gather_index(a)} < {g.bound}ull")
        return " && ".join(parts) or None

    def guarded(self, cond: str | None, stmts: list[str]) -> None:
        if not cond:
            for s in stmts:
                self.w.line(s)
        elif len(stmts) == 1:
            self.w.line(f"if ({cond}) {stmts[0]}")
        else:
            with self.w.block(f"if ({cond}) {{", "}"):
                for s in stmts:
                    self.w.line(s)

    # -- one value per thread ------------------------------------------------------------
    def thread_inputs(self, kinds: tuple[Kind, ...], row_ok: str | None) -> None:
        """Load every input of `kinds` (ROW, SCALAR) as one value per thread."""
        for a in self.spec.inputs:
            if a.kind not in kinds:
                continue
            ct = COMPUTE[a.dtype]
            mem = from_memory(f"{a.name}_ptr[{self.offset(a)}]", a.dtype)
            if a.kind == Kind.ROW and row_ok:
                mem = f"{row_ok} ? {mem} : ({ct})0"
            self.w.line(f"const {ct} {a.name} = {mem};")

    def store_value(self, v: Value, cond: str | None) -> None:
        """Store `v` (a per-thread value) if it is an output, under `cond`."""
        a = self.args.get(v.id)
        if a is not None and a.is_output:
            stmt = f"{a.name}_ptr[{self.offset(a)}] = {to_memory(self.ref(v), a.dtype)};"
            self.guarded(cond, [stmt])

    def thread_nodes(self, nodes: Iterable[Node], row_cond: str | None) -> None:
        """ROW/SCALAR nodes, one value per thread; ROW outputs stored under `row_cond`."""
        for n in nodes:
            self.define(n)
            if self.kind(n.out) == Kind.SCALAR:
                self.store_value(n.out, "blockIdx.x == 0 && threadIdx.x == 0")
            else:
                self.store_value(n.out, row_cond)

    def scalar_prologue(self) -> None:
        """SCALAR inputs and the nodes computed from them alone."""
        self.thread_inputs((Kind.SCALAR,), None)
        self.thread_nodes(
            [n for n in self.spec.nodes if self.kind(n.out) == Kind.SCALAR and n.op != Op.CONST],
            None,
        )

    # -- reductions ----------------------------------------------------------------------
    def row_reduce(self, n: Node, tpr: int, rows_per_block: int) -> None:
        """Combine a row's per-thread accumulators into the ROW value n.out."""
        x, out = n.inputs[0], n.out
        at, fn, acc = acc_type(x.dtype), f"{REDUCE_FN[n.op]}()", f"acc_{out.name}"
        if tpr > 32:
            part = f"part_{out.name}"
            self.w.line(f"__shared__ {at} {part}[{rows_per_block * tpr // 32}];")
            total = f"row_reduce<{tpr}>({acc}, {fn}, {part})"
        else:
            total = f"warp_reduce<{tpr}>({acc}, {fn})"
        ct = COMPUTE[out.dtype]
        total = total if at == ct else f"({ct}){total}"
        self.w.line(f"const {ct} {out.name} = {round_to(total, out.dtype)};")

    def declare_acc(self, n: Node, width: int | None = None) -> None:
        x = n.inputs[0]
        at, init = acc_type(x.dtype), identity_of(n)
        if width is None:
            self.w.line(f"{at} acc_{n.out.name} = {init};")
            return
        self.w.line(f"{at} acc_{n.out.name}[{width}];")
        self.w.line("#pragma unroll")
        self.w.line(f"for (int i = 0; i < {width}; ++i) acc_{n.out.name}[i] = {init};")

    # -- nests ---------------------------------------------------------------------------
    def nest_inputs(self, nest: Nest) -> list[Arg]:
        """Inputs this nest loads: those its nodes use that no register array holds."""
        seen: set[int] = set()
        out = []
        kept = [self.value(i) for i in sorted(nest.keep) if i in self.args]
        # a VIEW reads its input itself, element by element at mapped columns
        reds = [*nest.nodes, *nest.reductions, *nest.columns]
        used = (x for n in reds if n.op != Op.VIEW for x in n.inputs)
        for v in [*kept, *used]:
            a = self.args.get(v.id)
            if a is None or a.is_output or v.id in seen:
                continue
            held = (v.id in self.arrays or v.id in self.col_arrays) and v.id not in nest.keep
            per_thread = a.kind == Kind.SCALAR or (a.kind == Kind.ROW and not nest.row_level)
            if held or per_thread:
                continue
            seen.add(v.id)
            out.append(a)
        return out

    def emit_nest(self, nest: Nest) -> None:
        """Loads of FULL (and per-slot ROW) inputs for every slot first, then per slot:
        column inputs (cache hits, loaded where used), the elements, the stores."""
        self.declare_loads(nest)
        self.emit_loads(nest)
        self.emit_compute(nest)

    def early_loads(self, nest: Nest) -> list[Arg]:
        """The inputs a nest loads for all its slots before computing (not COL ones)."""
        return [a for a in self.nest_inputs(nest) if a.kind != Kind.COL]

    def declare_loads(self, nest: Nest, masked: bool | None = None) -> None:
        early = self.early_loads(nest)
        width = max(r.width for r in nest.regions)
        if masked is None:
            masked = any(self.guard(a, r) for a in early for r in nest.regions)
        for a in early:
            dims = f"[{nest.slots}]" + (f"[{width}]" if a.kind != Kind.ROW else "")
            self.w.line(f"{MEMORY[a.dtype]} {a.name}_v{dims}{' = {}' if masked else ''};")

    def emit_loads(self, nest: Nest, row_ok: str | None = None) -> None:
        """The early loads of every slot; `row_ok` overrides the regions' row guard."""
        early = self.early_loads(nest)
        if not early:
            return
        slot = f"[{nest.var}]"
        self.w.comment("loads of every slot first, so that they are all in flight together", "//")
        for r in nest.regions:
            with self.region(r):
                guards = Region(r.header, r.setup, r.width, row_ok or r.row_ok, r.col_ok)
                for a in early:
                    if a.kind == Kind.ROW:
                        stmts = [f"{a.name}_v{slot} = {a.name}_ptr[{self.offset(a)}];"]
                    else:
                        stmts = self.slot_access(a, r, f"{a.name}_v{slot}", True)
                    self.guarded(self.guard(a, guards), stmts)

    def emit_compute(self, nest: Nest) -> None:
        self.slot_var = nest.var
        loads = self.nest_inputs(nest)
        for r in nest.regions:
            with self.region(r):
                self.nest_body(nest, r, loads, f"[{nest.var}]")

    @contextmanager
    def region(self, r: Region) -> Iterator[None]:
        if r.header:
            self.w.line("#pragma unroll")
        with self.w.block(f"{r.header} {{" if r.header else "{", "}"):
            for line in r.setup:
                self.w.line(line)
            yield

    def nest_body(self, nest: Nest, r: Region, loads: list[Arg], slot: str) -> None:
        w = self.w
        row_nodes = [n for n in nest.nodes if self.kind(n.out) in (Kind.ROW, Kind.SCALAR)]
        elem_nodes = [n for n in nest.nodes if n not in row_nodes]
        computed = {n.out.id for n in nest.nodes} | set(nest.given)
        outs = [a for a in self.spec.outputs if a.value.id in computed]
        for a in loads:
            if a.kind == Kind.ROW:
                mem = from_memory(f"{a.name}_v{slot}", a.dtype)
                w.line(f"const {COMPUTE[a.dtype]} {a.name} = {mem};")
            elif a.kind == Kind.COL:
                guard = self.guard(a, r)
                w.line(f"{MEMORY[a.dtype]} {a.name}_v[{r.width}]{' = {}' if guard else ''};")
                self.guarded(guard, self.slot_access(a, r, f"{a.name}_v", True))
        for n in row_nodes:
            self.define(n)
        for a in outs:
            if a.kind == Kind.ROW:
                cond = [c for c in (r.row_ok, nest.store_when.get(Kind.ROW)) if c]
                self.store_value(a.value, " && ".join(cond) or None)
        vec_outs = [a for a in outs if a.kind in (Kind.FULL, Kind.COL)]
        for a in vec_outs:
            w.line(f"{MEMORY[a.dtype]} {a.name}_o[{r.width}];")
        w.line("#pragma unroll")
        with w.block(f"for (int i = 0; i < {r.width}; ++i) {{", "}"):
            for vid, e in nest.given.items():
                v = self.value(vid)
                w.line(f"const {COMPUTE[v.dtype]} {v.name} = {e};")
            for a in loads:
                if a.kind != Kind.ROW:
                    arr = f"{a.name}_v" + (slot if a.kind == Kind.FULL else "")
                    e = from_memory(f"{arr}[i]", a.dtype)
                    if a.value.id in nest.keep:
                        w.line(f"{self.ref(a.value)} = {e};")
                    else:
                        w.line(f"const {COMPUTE[a.dtype]} {a.name} = {e};")
            for n in elem_nodes:
                self.define(n)
            guard = self.element_ok(r) if nest.reduce_guard == "col" else r.row_ok
            for n in nest.reductions:
                x, acc = n.inputs[0], nest.acc(n)
                stmt = f"{acc} = {combine(n.op, acc, self.operand(x, acc_type(x.dtype)))};"
                w.line(f"if ({guard}) {stmt}" if guard else stmt)
            for n in nest.columns:
                x, acc = n.inputs[0], f"cacc_{n.out.name}{slot}[i]"
                stmt = f"{acc} = {combine(n.op, acc, self.operand(x, acc_type(x.dtype)))};"
                both = " && ".join(g for g in (r.row_ok, self.element_ok(r)) if g)
                w.line(f"if ({both}) {stmt}" if both else stmt)
            for a in vec_outs:
                w.line(f"{a.name}_o[i] = {to_memory(self.ref(a.value), a.dtype)};")
        for a in vec_outs:
            cond = [c for c in (self.guard(a, r), nest.store_when.get(a.kind)) if c]
            if a.kind == Kind.COL and self.spec.rows > 1 and self.s.kind in ROW_KINDS:
                # row-invariant: stored by row 0's threads only, not by every row (the same
                # addresses written by every block serialize in L2)
                cond.append("row == 0")
            self.guarded(" && ".join(cond) or None, self.slot_access(a, r, f"{a.name}_o", False))

    # -- cones ---------------------------------------------------------------------------
    def cone(self, targets: Iterable[Value], stop: Callable[[Value], bool]) -> list[Node]:
        """Nodes (in order) computing `targets`, not crossing values where `stop` holds,
        reductions or constants."""
        need: set[int] = set()
        stack = list(targets)
        while stack:
            v = stack.pop()
            n = self.producer.get(v.id)
            if n is None or id(n) in need or n.op in REDUCE or n.op == Op.CONST or stop(v):
                continue
            need.add(id(n))
            stack += list(n.inputs)
        return [n for n in self.spec.nodes if id(n) in need]

    # -- kernel frame --------------------------------------------------------------------
    def workspaces(self) -> list[tuple[str, str]]:
        """(name, C type) of the partial-sum buffers of a split column reduction."""
        return [(ws.name, acc_type(ws.reduction.inputs[0].dtype)) for ws in self.s.workspaces]

    def signature(self, name: str, threads: int) -> str:
        params = []
        for a in self.spec.args:
            const = "" if a.is_output else "const "
            params.append(f"{const}{MEMORY[a.dtype]}* __restrict__ {a.name}_ptr")
        params += [f"{ct}* __restrict__ {ws}_ptr" for ws, ct in self.workspaces()]
        if self.spec.checks:  # the error record and the host's flag (runtime/checks.py)
            params += [f"long long* {name}" for name in CHECK_PARAMS]
        # no minimum of blocks per SM: asking for the occupancy the estimate plans made
        # ptxas grow to the cap it implies (12288: 78 -> 111 registers) and spill where the
        # estimate was low (1280: 8 bytes, fp32 layernorm 768: 24 bytes); ptxas chooses
        joined = ",\n    ".join(params)
        return f'extern "C" __global__ void __launch_bounds__({threads})\n{name}(\n    {joined})'

    def constants(self, **names: int) -> None:
        """`constexpr int` lines naming the schedule's numbers used in the body."""
        self.w.line("constexpr int " + ", ".join(f"{k} = {v}" for k, v in names.items()) + ";")


def identity_of(n: Node) -> str:
    return identity(n.op, n.inputs[0].dtype)


PER_THREAD = (Kind.ROW, Kind.SCALAR)


def slot_region(var: str, count: int, setup: list[str], width: int, **guards: str | None) -> Region:
    """A region looping `var` over `count` slots (or naming the single slot 0)."""
    if count == 1:
        return Region("", [f"const int {var} = 0;", *setup], width, **guards)
    return Region(f"for (int {var} = 0; {var} < {count}; ++{var})", setup, width, **guards)


def chunk_regions(
    batch: int, v: int, tail_v: int, col_guard: bool, row_ok: str | None
) -> list[Region]:
    """The regions of a persistent row held in registers: `batch` full chunks of `v`
    columns a thread (predicated only when there is no tail and the chunks reach past
    the row), then the tail chunk of `tail_v` (predicated if col_guard)."""
    full_guard = col_guard and not tail_v
    regions = [
        slot_region(
            "c",
            batch,
            ["const int col = c * CHUNK + lane * V;"]
            + (["const bool col_ok = col < COLS;"] if full_guard else []),
            v,
            row_ok=row_ok,
            col_ok="col_ok" if full_guard else None,
        )
    ]
    if tail_v:
        regions.append(
            Region(
                "",
                [
                    "const int c = BATCH;  // the tail chunk",
                    "const int col = BATCH * CHUNK + lane * TAIL_V;",
                ]
                + (["const bool col_ok = col < COLS;"] if col_guard else []),
                tail_v,
                row_ok=row_ok,
                col_ok="col_ok" if col_guard else None,
            )
        )
    return regions


def row_nodes(kw: CudaKernelWriter, depth: int) -> list[Node]:
    """ROW nodes (not reductions) computed `depth` rounds in: one value per thread."""
    spec = kw.spec
    return [
        n
        for n in spec.nodes
        if n.op not in REDUCE and kw.kind(n.out) == Kind.ROW and spec.depth[n.out.id] == depth
    ]
