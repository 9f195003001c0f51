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

    @property
    def name(self) -> str:
        return self.value.name

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
    a = next(x for x in spec.args if x.value.id == node.inputs[0].id)
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
            n = {Kind.FULL: self.rows * self.cols, Kind.ROW: self.rows, Kind.COL: self.cols}.get(
                a.kind, 1
            )
            total += n * a.dtype.itemsize
        return total

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
