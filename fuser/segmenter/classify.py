"""Map a set of nodes onto the 2D iteration space every generated kernel works in.

A kernel iterates over a domain D (the largest shape among its values), seen as
[rows, cols] where cols is D's last (contiguous) dim and rows is the product of the
others. Every value in the kernel is one of:

  FULL    varies along rows and cols          (a [rows, cols] tile)
  ROW     one value per row                   (a row reduction result, a [rows] input)
  COL     one value per column                (a [cols] weight, a column reduction result)
  SCALAR  one value                           (constants)

Inner reductions take FULL to ROW (layernorm, softmax); outer reductions take FULL to
COL (a bias gradient). A kernel may have both (inner-outer: LayerNorm backward's dx with
its dw and db): the column reductions may read values that need the row reductions, and
their results feed only column ops or outputs. A node set that does not map onto this
space is rejected with a reason, and the segmenter splits it or leaves it to ATen.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from fuser.ir.broadcast import row_map
from fuser.ir.graph import Node, Value
from fuser.ir.ops import ELEMENTWISE, GUARD, INDEXED, LAYOUT, REDUCE, Op


class Kind(enum.Enum):
    FULL = "full"
    ROW = "row"
    COL = "col"
    SCALAR = "scalar"


class Rejected(Exception):
    """The node set does not fit one kernel; the message says why."""


@dataclass(frozen=True)
class Layout:
    """The result of classification: the domain and the kind of every value."""

    domain: tuple[int, ...]
    kinds: tuple[tuple[int, Kind], ...]
    inner: bool  # has FULL -> ROW reductions
    outer: bool  # has FULL -> COL reductions

    @property
    def inner_outer(self) -> bool:
        """Row reductions and column reductions in one kernel (a persistent row loop that
        accumulates per-column partials)."""
        return self.inner and self.outer

    @property
    def rows(self) -> int:
        return math.prod(self.domain[:-1]) if self.domain else 1

    @property
    def cols(self) -> int:
        return self.domain[-1] if self.domain else 1

    def kind(self, v: Value) -> Kind:
        return dict(self.kinds)[v.id]


def _rows(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def _shape_kinds(shape: tuple[int, ...], domain: tuple[int, ...]) -> set[Kind]:
    """Every kind a value of `shape` could have in `domain`."""
    n = len(domain)
    out = set()
    if math.prod(shape) == 1 or shape == ():
        out.add(Kind.SCALAR)
    if shape == domain or (
        n >= 1 and shape[-1:] == domain[-1:] and _rows(shape[:-1]) == _rows(domain[:-1])
    ):  # size-1 row dims aside ([T, C] in [1, T, C] at batch 1): the same rows
        out.add(Kind.FULL)
    if n >= 1 and shape in (domain[:-1], domain[:-1] + (1,)):
        out.add(Kind.ROW)
    if n >= 1 and shape in (domain[-1:], (1,) * (n - 1) + domain[-1:]):
        out.add(Kind.COL)
    if n >= 1 and domain[-1] == 1 and shape == domain:
        out.add(Kind.ROW)
    return out


def _unit_dims_aside(shape: tuple[int, ...], kind: Kind, domain: tuple[int, ...]) -> bool:
    """Whether an op that makes `shape` a `kind` value (a broadcast's operand) may: a row
    value whose dims other than 1s are the domain's row dims ([16] in [1, 1, 16, 16]: a
    mask's row at batch 1), a column value of 1s and the domain's columns ([1, 16] in
    [1, 1, 16]). Both are read as view_2d reads them (runtime/specs.py): the rows through
    the dims other than 1s, the columns through the last. Only where the op says which
    kind: by its shape alone, [1, 16] in [16, 16] would look like a row."""
    if not domain:
        return False
    if kind == Kind.ROW:
        return bool(_rows(shape)) and _rows(shape) == _rows(domain[:-1])
    if kind == Kind.COL:
        return bool(shape) and shape[-1] == domain[-1] and all(d == 1 for d in shape[:-1])
    return False


def _broadcast_source_kind(node: Node, domain: tuple[int, ...]) -> Kind:
    """The kind of a broadcast's operand, read off which output dims it maps to."""
    x, bdims = node.inputs[0], node.attr("broadcast_dims")
    out_rank = len(node.attr("shape"))
    lead = out_rank - 1
    real = [d for i, d in enumerate(bdims) if x.shape[i] != 1]
    has_col = lead in real and domain[-1] != 1
    has_row = any(d < lead for d in real)
    if has_row and has_col:
        return Kind.FULL
    if has_col:
        return Kind.COL
    if has_row:
        if sorted(d for d in real if d < lead) != [d for d in range(lead) if domain[d] != 1]:
            raise Rejected(f"`{node.describe()}` broadcasts over part of the row dims")
        return Kind.ROW
    return Kind.SCALAR


def pick_domain(nodes: list[Node]) -> tuple[int, ...]:
    """The largest shape (by rank, then elements) among the values of `nodes`."""

    # a view's operand is read at other columns and a gather's table at other rows:
    # their shapes are not the kernel's
    def values(n: Node) -> tuple[Value, ...]:
        if n.op == Op.VIEW:
            return n.outputs
        if n.op in INDEXED:
            return (*n.inputs[1:], *n.outputs)
        return (*n.inputs, *n.outputs)

    shapes = [tuple(v.shape) for n in nodes for v in values(n)]
    return max(shapes, key=lambda s: (len(s), math.prod(s)), default=())


def classify(nodes: list[Node]) -> Layout:
    """Kinds for every value of `nodes` (a topologically ordered node set)."""
    domain = pick_domain(nodes)
    kinds: dict[int, Kind] = {}
    inner = outer = False
    n = len(domain)

    def assign(v: Value, k: Kind, why: Node) -> None:
        shape = tuple(v.shape)
        if (
            k not in _shape_kinds(shape, domain)
            and not _unit_dims_aside(shape, k, domain)
            and not (k == Kind.SCALAR and v.rank == 0)
        ):
            raise Rejected(
                f"{v.name} of shape {list(v.shape)} cannot be {k.value} in {list(domain)}"
            )
        old = kinds.get(v.id)
        if old is not None and old != k:
            raise Rejected(f"`{why.describe()}` uses {v.name} as {k.value} and as {old.value}")
        kinds[v.id] = k

    def kind_from_shape(v: Value) -> Kind:
        if v.id in kinds:
            return kinds[v.id]
        options = _shape_kinds(tuple(v.shape), domain)
        for k in (Kind.FULL, Kind.SCALAR, Kind.ROW, Kind.COL):
            if k in options:
                return k
        raise Rejected(
            f"{v.name} of shape {list(v.shape)} does not map onto rows x cols of {list(domain)}"
        )

    produced = {v.id for node in nodes for v in node.outputs}
    views: list[Node] = []
    gathers: list[Node] = []
    mapped: list[Node] = []  # broadcasts over part of the row dims (row_map)
    for node in nodes:
        op = node.op
        if op == Op.VIEW:
            views.append(node)
            _view_kinds(node, domain, produced - {m.out.id for m in mapped}, kinds)
        elif op in INDEXED:
            gathers.append(node)
            _gather_kinds(node, domain, nodes, produced, kinds)
        elif op in LAYOUT:
            raise Rejected(
                f"`{node.describe()}` is a {op.value} along dim {node.attr('dim')}: only the "
                "last dim is an index map in a kernel (ATen slices or copies it)"
            )
        elif op == Op.CONST:
            assign(node.out, Kind.SCALAR, node)
        elif op == Op.IOTA:
            if tuple(node.attr("shape")) != domain or node.attr("dim") != n - 1:
                raise Rejected(f"`{node.describe()}` is not a column index of {list(domain)}")
            assign(node.out, Kind.FULL, node)
        elif op == Op.BROADCAST_IN_DIM and row_map(node, domain) is not None:
            mapped.append(node)
            _mapped_kinds(node, domain, produced, kinds)
        elif op == Op.BROADCAST_IN_DIM:
            src = _broadcast_source_kind(node, domain)
            assign(node.inputs[0], src, node)
            out_options = _shape_kinds(tuple(node.out.shape), domain)
            out = Kind.FULL if Kind.FULL in out_options else src
            if out not in out_options and src != Kind.SCALAR:
                raise Rejected(f"`{node.describe()}` does not produce a {src.value} value")
            assign(node.out, out if out in out_options else src, node)
        elif op in ELEMENTWISE or op in GUARD:
            ks = {kind_from_shape(v) for v in node.inputs} - {Kind.SCALAR}
            if len(ks) > 1:
                raise Rejected(f"`{node.describe()}` mixes {sorted(k.value for k in ks)} operands")
            k = ks.pop() if ks else Kind.SCALAR
            for v in node.inputs:
                if v.rank:
                    assign(v, k, node)
                elif v.id not in kinds:  # a rank-0 operand from outside: loaded once
                    assign(v, Kind.SCALAR, node)
            assign(node.out, k, node)
        elif op in REDUCE:
            x = node.inputs[0]
            xk = kind_from_shape(x)
            assign(x, xk, node)
            dims = set(node.attr("dims"))
            if xk == Kind.FULL and dims == {n - 1}:
                inner = True
                assign(node.out, Kind.ROW, node)
            elif xk == Kind.FULL and n > 1 and dims == set(range(n - 1)):
                outer = True
                assign(node.out, Kind.COL, node)
            else:
                raise Rejected(
                    f"`{node.describe()}` reduces dims {sorted(dims)} of a "
                    f"{xk.value} value; only the last dim or all leading dims fuse"
                )
        else:
            raise Rejected(f"no scheduler takes `{node.describe()}` ({op.value})")
    if views and (inner or outer):
        raise Rejected(f"`{views[0].describe()}`: views fuse into pointwise kernels only, so far")
    if mapped:
        _check_mapped(mapped, nodes, outer)
    if gathers and outer:
        raise Rejected(
            f"`{gathers[0].describe()}`: gathered rows fuse into pointwise and row-reduction "
            "kernels only, so far"
        )
    if outer:
        _check_single_round(nodes, kinds, only_columns=inner)
    return Layout(domain, tuple(kinds.items()), inner, outer)


def _view_kinds(node: Node, domain: tuple[int, ...], produced: set[int], kinds: dict) -> None:
    """A VIEW reads a kernel input (FULL or COL, like its result) at other columns, or
    the result of a broadcast over part of the row dims (which reads a kernel input at
    mapped rows: `produced` leaves those out)."""
    src, out = node.inputs[0], node.out
    if src.id in produced:
        raise Rejected(
            f"`{node.describe()}` reads {src.name} through an index map, but this kernel "
            f"computes {src.name}; a view reads a kernel input"
        )
    n = len(domain)
    rows = _rows(domain[:-1])
    if (
        tuple(out.shape[-1:]) == domain[-1:]
        and _rows(tuple(out.shape[:-1])) == rows
        and _rows(tuple(src.shape[:-1])) == rows
    ):  # size-1 row dims aside: k [B, 1, T, D] of one key-value head reads sin [B, T, D]
        kind = Kind.FULL
    elif n >= 1 and tuple(out.shape) in (domain[-1:], (1,) * (n - 1) + domain[-1:]):
        kind = Kind.COL
        if math.prod(src.shape[:-1]) != 1:
            raise Rejected(f"`{node.describe()}`: {src.name} is not a column")
    else:
        raise Rejected(f"`{node.describe()}` is neither a full tile nor a column of {list(domain)}")
    for v in (src, out):
        if kinds.get(v.id, kind) != kind:
            raise Rejected(
                f"`{node.describe()}` uses {v.name} as {kind.value} and as {kinds[v.id].value}"
            )
        kinds[v.id] = kind


def _mapped_kinds(node: Node, domain: tuple[int, ...], produced: set[int], kinds: dict) -> None:
    """A broadcast over part of the row dims reads a kernel input at the rows row_map
    names (FULL, or ROW when the input has no column dim); its result is FULL."""
    src = node.inputs[0]
    if src.id in produced:
        raise Rejected(
            f"`{node.describe()}` broadcasts {src.name} over part of the row dims; a kernel "
            f"reads such a broadcast from an input, and this kernel computes {src.name}"
        )
    has_col = src.rank > 0 and node.attr("broadcast_dims")[-1] == len(domain) - 1
    has_col = has_col and src.shape[-1] != 1 and domain[-1] != 1
    for v, kind in ((src, Kind.FULL if has_col else Kind.ROW), (node.out, Kind.FULL)):
        if kinds.get(v.id, kind) != kind:
            raise Rejected(
                f"`{node.describe()}` uses {v.name} as {kind.value} and as {kinds[v.id].value}"
            )
        kinds[v.id] = kind


def _check_mapped(mapped: list[Node], nodes: list[Node], outer: bool) -> None:
    """Each operand of a partial broadcast is read through it alone, one way."""
    if outer:
        raise Rejected(
            f"`{mapped[0].describe()}` broadcasts over part of the row dims: such reads fuse "
            "into pointwise and row-reduction kernels only, so far"
        )
    for node in mapped:
        src = node.inputs[0]
        for n in nodes:
            if src.id not in (v.id for v in n.inputs) or n is node:
                continue
            if n.op != Op.BROADCAST_IN_DIM or n.attrs != node.attrs:
                raise Rejected(
                    f"`{node.describe()}`: {src.name} is read through a broadcast over part "
                    f"of the row dims and otherwise (`{n.describe()}`) in this kernel"
                )


def index_source(node: Node, nodes: list[Node] | tuple[Node, ...]) -> Value:
    """The kernel input a gather's index is loaded from: the index itself, or the operand
    of the check_index (in the same kernel) that produced it."""
    index = node.inputs[1]
    for n in nodes:
        if n.op == Op.CHECK_INDEX and n.out.id == index.id:
            return n.inputs[0]
    return index


def _gather_kinds(
    node: Node, domain: tuple[int, ...], nodes: list[Node], produced: set[int], kinds: dict
) -> None:
    """A gather reads a kernel input table ([V, H], seen as FULL: its rows are read at the
    rows its ROW index names) into a FULL value; the index is loaded from a kernel input."""
    table, out = node.inputs[0], node.out
    src = index_source(node, nodes)
    for v, what in ((table, "table"), (src, "index")):
        if v.id in produced:
            raise Rejected(
                f"`{node.describe()}` reads through {v.name}, but this kernel computes it; "
                f"a gather's {what} is a kernel input"
            )
    if tuple(out.shape) != domain:
        raise Rejected(f"`{node.describe()}` is not a full tile of {list(domain)}")
    users = [n for n in nodes if table.id in (v.id for v in n.inputs)]
    if any(n.op not in INDEXED for n in users) or any(
        index_source(n, nodes).id != src.id for n in users
    ):
        raise Rejected(
            f"`{node.describe()}`: {table.name} is used other than as a table gathered at "
            f"{src.name} in this kernel"
        )
    for v, kind in ((table, Kind.FULL), (node.inputs[1], Kind.ROW), (out, Kind.FULL)):
        if kinds.get(v.id, kind) != kind:
            raise Rejected(
                f"`{node.describe()}` uses {v.name} as {kind.value} and as {kinds[v.id].value}"
            )
        kinds[v.id] = kind


def _check_single_round(
    nodes: list[Node], kinds: dict[int, Kind], only_columns: bool = False
) -> None:
    """A column reduction's result may feed only column-wise epilogue ops. With
    `only_columns` (an inner-outer kernel) row reductions start no such round: values
    after them stay row values."""
    after: set[int] = set()
    for node in nodes:
        starts = node.op in REDUCE and (not only_columns or kinds.get(node.out.id) == Kind.COL)
        if starts or any(v.id in after for v in node.inputs):
            for v in node.outputs:
                if kinds[v.id] in (Kind.FULL, Kind.ROW):
                    raise Rejected(
                        f"`{node.describe()}` uses a column reduction's result "
                        "across rows; that needs a second kernel"
                    )
                after.add(v.id)
