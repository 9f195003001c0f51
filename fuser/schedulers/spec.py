"""KernelSpec: one segment with its layout and the facts of its actual arguments.

This is what a scheduler chooses a Schedule for and what a renderer turns into source:
the nodes, the [rows, cols] layout, and for every tensor argument its kind, dtype,
strides in the collapsed 2D view and the alignment of its pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from fuser.ir.dtypes import DType
from fuser.ir.graph import Node, Value
from fuser.ir.ops import INDEXED, REDUCE, Op
from fuser.segmenter import Kind, Layout, Segment
from fuser.segmenter.classify import index_source

# the parameters a kernel with check_index nodes takes after its tensors and workspaces:
# its error record on the device and the process's flag in pinned host memory (int64
# both; fuser/runtime/checks.py)
CHECK_PARAMS = ("err_ptr", "err_flag_ptr")


@dataclass(frozen=True)
class Arg:
    value: Value
    kind: Kind
    is_output: bool
    row_stride: int  # elements between rows (FULL, ROW)
    col_stride: int  # elements between columns (FULL, COL)
    align: int  # bytes the pointer is aligned to (1, 2, 4, 8 or 16)
    # the kernel's row dims with this argument's stride in each, outermost first, where
    # its rows are not one stride apart (row_stride then holds the gcd of these strides,
    # which is what vector alignment needs): a broadcast over some of them (rotary cos
    # [B, T, D] read for [B, H, T, D]: stride 0 along H) or a view whose row dims do not
    # collapse (q [B, T, H, D] transposed to [B, H, T, D]), read in place, not copied
    row_dims: tuple[tuple[int, int], ...] = ()

    @property
    def name(self) -> str:
        return self.value.name

    def row_offset(self, row: str, floordiv: str) -> str:
        """The element offset of row `row` when row_dims are set: each dim's index
        ((row // inner) % size) times its stride, dims of stride 0 left out; `floordiv` is
        the backend's integer division ("//" or "/")."""
        terms, inner = [], 1
        for i, (size, stride) in reversed(list(enumerate(self.row_dims))):
            if stride and size > 1:
                at = row if inner == 1 else f"{row} {floordiv} {inner}"
                if i > 0:  # the outermost index needs no modulo: row < rows
                    at = f"({at}) % {size}" if inner > 1 else f"{at} % {size}"
                terms.append(f"({at}) * {stride}" if stride != 1 else f"({at})")
            inner *= size
        return " + ".join(reversed(terms)) or "0"

    def extent(self, rows: int, cols: int) -> int:
        """A bound on the element offsets this argument reads or writes (what decides
        32- or 64-bit indexing)."""
        if self.row_dims:
            return sum(n * st for n, st in self.row_dims) + self.col_stride * cols
        return self.row_stride * rows + self.col_stride * cols

    def distinct_rows(self, rows: int) -> int:
        """Rows of memory behind the kernel's `rows` (a broadcast reads fewer)."""
        if not self.row_dims:
            return rows
        n = 1
        for size, stride in self.row_dims:
            n *= size if stride else 1
        return n

    @property
    def dtype(self) -> DType:
        return self.value.dtype


@dataclass(frozen=True)
class Gather:
    """How a gathered table is read: at row `index[row]` (a ROW argument, loaded once a
    row) when 0 <= index[row] < bound; never at a bad index (its check reports it)."""

    index: Arg
    bound: int


def access_width(spec: KernelSpec, a: Arg, width: int) -> int:
    """Elements per access of `a` in a slot of `width` columns: the widest power of two up
    to `width` (and 16 bytes) whose accesses start aligned in every row. A slot's first
    column is a multiple of its width, so a pack of p elements is aligned when the pointer
    is aligned to p elements and the row stride keeps it so."""
    if a.kind not in (Kind.FULL, Kind.COL) or a.col_stride != 1:
        return 1
    p, size = width, a.dtype.itemsize
    # a gathered table's rows start at any of its rows, whatever the kernel's row count
    rows = spec.rows > 1 or a.value.id in spec.gathers
    while p > 1 and (
        a.align % (p * size) or p * size > 16 or (a.kind == Kind.FULL and rows and a.row_stride % p)
    ):
        p //= 2
    return p


def view_width(spec: KernelSpec, node: Node, width: int) -> int:
    """Elements per access of a VIEW read (a slice or a cat piece) in a slot of `width`
    columns: as access_width, and also its column offset and its range ends must fall on
    a pack boundary (a slice at an odd offset reads odd columns: 1), and a strided read
    (step > 1) is one element at a time."""
    a = spec.view_arg(node)
    if node.attr("scale") != 1:
        return 1
    p = access_width(spec, a, width)
    ends = [node.attr("offset"), node.attr("lo"), min(node.attr("hi"), spec.cols)]
    while p > 1 and any(e % p for e in ends if e != spec.cols):
        p //= 2
    return p


@dataclass(frozen=True)
class KernelSpec:
    name: str
    segment: Segment
    args: tuple[Arg, ...]

    @property
    def layout(self) -> Layout:
        assert self.segment.layout is not None
        return self.segment.layout

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def cols(self) -> int:
        return self.layout.cols

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.segment.nodes

    @property
    def inputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.is_output)

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.is_output)

    def kind(self, v: Value) -> Kind:
        return self.kinds[v.id]

    @cached_property
    def kinds(self) -> dict[int, Kind]:
        return dict(self.layout.kinds)

    @cached_property
    def depth(self) -> dict[int, int]:
        """Reduction rounds each value waits for (0: computable straight from the inputs)."""
        d = {a.value.id: 0 for a in self.inputs}
        for n in self.nodes:
            base = max((d.get(v.id, 0) for v in n.inputs), default=0)
            for v in n.outputs:
                d[v.id] = base + 1 if n.op in REDUCE else base
        return d

    @cached_property
    def row_constant(self) -> frozenset[int]:
        """Values equal across a row's columns: ROW and SCALAR values, and FULL ones
        computed from those alone (a per-row value broadcast over the row, then cast)."""
        same = {a.value.id for a in self.inputs if a.kind in (Kind.ROW, Kind.SCALAR)}
        for n in self.nodes:
            kind = self.kinds.get(n.out.id)
            if kind in (Kind.ROW, Kind.SCALAR) or (
                kind == Kind.FULL
                and n.op not in REDUCE
                and n.op != Op.IOTA
                and all(v.id in same for v in n.inputs)
            ):
                same.update(v.id for v in n.outputs)
        return frozenset(same)

    @cached_property
    def checks(self) -> tuple[Node, ...]:
        """The check_index nodes, in order: a kernel with any takes an error record (its
        number in this tuple is what the record's `check` field holds)."""
        return tuple(n for n in self.nodes if n.op == Op.CHECK_INDEX)

    @cached_property
    def producers(self) -> dict[int, Node]:
        """The node computing each value (inputs have none)."""
        return {v.id: n for n in self.nodes for v in n.outputs}

    @cached_property
    def reductions(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.op in REDUCE)

    @property
    def rounds(self) -> int:
        return max((self.depth[n.out.id] for n in self.reductions), default=0)

    def crossing_words(self) -> float:
        """32-bit registers per row element that must survive a reduction.

        One fp32 word when any FULL value computed before a reduction is used after it
        (ptxas keeps the newest fp32 form of the row and lets the older ones die; measured
        on the seed fusion, layernorm and softmax), otherwise none.
        """
        for n in self.nodes:
            if n.op in REDUCE:
                continue
            for v in n.inputs:
                if self.kinds.get(v.id) == Kind.FULL and self.depth[v.id] < self.depth[n.out.id]:
                    return 1.0
        return 0.0

    def bytes_moved(self) -> int:
        """Each input read once and each output written once."""
        total = 0
        for a in self.args:
            rows = a.distinct_rows(self.rows)
            n = {Kind.FULL: rows * self.cols, Kind.ROW: rows, Kind.COL: self.cols}.get(a.kind, 1)
            total += n * a.dtype.itemsize
        return total

    def view_arg(self, node: Node) -> Arg:
        """The argument a VIEW reads: its operand, or, when that is a broadcast over part
        of the row dims (classify.row_map), the broadcast's operand (whose row_dims map the
        kernel's rows onto it)."""
        v = node.inputs[0]
        for a in self.args:
            if a.value.id == v.id:
                return a
        src = next(n for n in self.nodes if v.id in (o.id for o in n.outputs)).inputs[0]
        return next(a for a in self.args if a.value.id == src.id)

    @cached_property
    def views(self) -> tuple[Node, ...]:
        """The VIEW reads: each loads its input once more, at mapped columns."""
        return tuple(n for n in self.nodes if n.op == Op.VIEW)

    @cached_property
    def gathers(self) -> dict[int, Gather]:
        """The gathered tables (GATHER_ROWS reads), by the table's value id: each is a FULL
        argument loaded at row `index[row]` instead of `row`."""
        out = {}
        for n in self.nodes:
            if n.op in INDEXED:
                src = index_source(n, self.nodes)
                index = next(a for a in self.args if a.value.id == src.id)
                out[n.inputs[0].id] = Gather(index, int(n.inputs[0].shape[0]))
        return out

    def full_args(self) -> list[Arg]:
        return [a for a in self.args if a.kind == Kind.FULL]
