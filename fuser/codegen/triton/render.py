"""The Triton kernel writer: prints a KernelPlan.

Every kernel is written for its exact input signature: sizes, strides and alignment are
literals, so Triton sees the divisibility it needs to vectorize. FULL values of an inner
persistent kernel are written chunk by chunk (`t7_0`, `t7_1`, ...): the persistent batch
is unrolled in the source, and only the tail chunk carries a column mask.
"""

from __future__ import annotations

import math

import torch

from fuser.codegen.guards import check_comment, record_slot, static_check
from fuser.codegen.triton.templates import (
    FLOAT_MATH,
    TL_DTYPE,
    helper_names,
    reduce_call,
    render_op,
)
from fuser.codegen.writer import Writer
from fuser.config import use_interpreter
from fuser.errors import CompileError
from fuser.ir.dtypes import DType, accumulator, promote
from fuser.ir.graph import Node, Value
from fuser.ir.ops import COMPARE, ELEMENTWISE, LOGICAL, REDUCE, UNARY_BOOL, Op
from fuser.plan.kernel_plan import KernelPlan
from fuser.schedulers.spec import CHECK_PARAMS, Arg, KernelSpec
from fuser.segmenter import Kind

# NaN is not a module constant: Triton re-checks a kernel's global constexprs with !=
# before each JIT launch, and NaN != NaN ("Global variable NAN has changed"; the H100
# fuzz soak hit it 69 times). The nan_() helper builds it from its bits instead.
CONSTANTS = {"NEG_INF": 'float("-inf")', "POS_INF": 'float("inf")'}
HALF = (DType.float16, DType.bfloat16)


def _literal(value: object, dtype: DType) -> str:
    """`value` as a literal of `dtype` (a 16-bit float holds that dtype's rounding of it)."""
    if dtype == DType.bool:
        return "True" if value else "False"
    if dtype.is_float:
        v = float(value)
        if dtype in HALF and math.isfinite(v):
            v = float(torch.tensor(v, dtype=dtype.torch))
        if math.isnan(v):
            return "nan_()"
        if math.isinf(v):
            return "POS_INF" if v > 0 else "NEG_INF"
        return repr(v)
    return str(int(value))


def _identity(op: Op, dtype: DType) -> str:
    if op == Op.SUM:
        return "0"
    if dtype.is_float:
        return "NEG_INF" if op == Op.MAX else "POS_INF"
    bound = 2**63 - 1 if dtype == DType.int64 else 2**31 - 1
    return str(-bound - 1 if op == Op.MAX else bound)


def operand_dtype(node: Node) -> DType | None:
    """The dtype torch computes elementwise `node` in: its operands' common dtype (None
    for logical_and/or, which test their operands for nonzero)."""
    if node.op in LOGICAL:
        return None
    if node.op in COMPARE:
        xs = node.inputs
        return promote([x.dtype for x in xs if x.rank], [x.dtype for x in xs if not x.rank])
    if node.op in UNARY_BOOL:
        return node.inputs[0].dtype
    return node.out.dtype


def compute_dtype(dtype: DType) -> DType:
    """The dtype a kernel computes values of `dtype` in: 16-bit floats in float32 (as
    eager's opmath; Triton's interpreter also keeps bfloat16 as uint16 bits, and compares
    and selects those as integers)."""
    return DType.float32 if dtype in HALF else dtype


def _acc_dtype(dtype: DType) -> str:
    return TL_DTYPE[accumulator(dtype)]


class Chunk:
    """One column tile of a row: its offset, width and whether it needs a mask. `split`:
    loads address `offset + row offset + tl.arange` (the scalar offset apart from the
    lanes) instead of `row offset + cols`, so that a pipelined loop computes no column
    tensor for a load that a later stage's iota would keep alive in registers."""

    def __init__(
        self, index: int | str | None, offset: str, width: int, masked: bool, split: bool = False
    ):
        self.index, self.offset, self.width, self.masked = index, offset, width, masked
        self.split = split

    def suffix(self) -> str:
        return "" if self.index is None else f"_{self.index}"


# kernels whose blocks split the rows (a column reduction's COL outputs are its results,
# one block a column range)
ROW_KINDS = ("pointwise", "inner_persistent", "inner_looped")


def convert(x: str, dst: DType, src: DType | None, interpreted: bool, helpers: set[str]) -> str:
    """Triton source of `x` (of dtype `src`, if known) converted to `dst`. Triton's
    interpreter truncates float32 to bfloat16 where a GPU (and torch) rounds to nearest
    even, and loses bfloat16 subnormals when it widens them, so an interpreted kernel
    converts with the bf16_rne and bf16_wide helpers instead (added to `helpers`)."""
    if src == dst:
        return x
    if interpreted and dst == DType.bfloat16:
        helpers.add("bf16_rne")
        return f"bf16_rne({x})"
    if interpreted and src == DType.bfloat16 and dst.is_float:
        helpers.add("bf16_wide")
        wide = f"bf16_wide({x})"
        return wide if dst == DType.float32 else f"{wide}.to({TL_DTYPE[dst]})"
    return f"{x}.to({TL_DTYPE[dst]})"


def cast_value(x: str, src: DType, dst: DType, interpreted: bool, helpers: set[str]) -> str:
    """Triton source of the IR cast of `x` from `src` to `dst`: as `convert`, and to a
    16-bit float through float32, as torch (c10 converts doubles and integers to float
    first: float64 1 + 2^-8 + 2^-30 gives bf16 1.0, not 1.0078125); Triton's interpreter
    also converts to bfloat16 only from float32 (it copies bits else)."""
    if dst in HALF and src not in (DType.float32, dst):
        wide = convert(x, DType.float32, src, interpreted, helpers)
        return convert(wide, dst, DType.float32, interpreted, helpers)
    return convert(x, dst, src, interpreted, helpers)


class TritonKernelWriter:
    def __init__(self, plan: KernelPlan):
        spec = plan.spec
        self.spec, self.s = spec, plan
        self.w = Writer()
        self.args = {a.value.id: a for a in spec.args}
        self.out_ids = {a.value.id for a in spec.outputs}
        self.consts = {n.out.id: n for n in spec.nodes if n.op == Op.CONST}
        self.helpers: set[str] = set()
        self.row_mask = plan.row_guard
        self.interpreted = use_interpreter()
        self.reports: list[str] = []  # index_error calls waiting for flush_reports
        self.evict = ""  # the L2 hint of the row walk's loads now written (plan.walk_evict)

    def to(self, x: str, dst: DType, src: DType | None = None) -> str:
        """`x` (of dtype `src`, if known) converted to `dst` (`convert`)."""
        return convert(x, dst, src, self.interpreted, self.helpers)

    # -- names ---------------------------------------------------------------------
    def name(self, v: Value, chunk: Chunk | None) -> str:
        if v.id in self.consts:
            n = self.consts[v.id]
            return _literal(n.attr("value"), n.attr("dtype"))
        kind = self.spec.kind(v)
        if kind in (Kind.FULL, Kind.COL) and chunk is not None:
            return f"{v.name}{chunk.suffix()}"
        return v.name

    def mask(self, kind: Kind, chunk: Chunk | None, rows_masked: bool = True) -> str | None:
        parts = []
        if kind in (Kind.FULL, Kind.ROW) and self.row_mask and rows_masked:
            parts.append("row_ok")
        if kind in (Kind.FULL, Kind.COL) and chunk is not None and chunk.masked:
            parts.append(f"col_ok{chunk.suffix()}")
        return " & ".join(parts) if parts else None

    def offsets(self, a: Arg, chunk: Chunk | None, rows: str = "rows") -> str:
        cols = f"cols{chunk.suffix()}" if chunk else "cols"
        if chunk is not None and self.s.walk_align and a.name in self.s.walk_args:
            # the aligned-start walk: the row's aligned base plus the walk position (an
            # argument of another row stride, the same modulo the vector, has its own base)
            base = "row_base" if a.row_stride == self.s.walk_stride else f"row_base_{a.name}"
            if chunk.split:
                return f"{base} + {chunk.offset}tl.arange(0, {chunk.width})[None, :]"
            return f"{base} + pos{chunk.suffix()}"
        terms = []
        if a.value.id in self.spec.gathers:  # a gathered table: the row its index names
            at = self.gather_index(a, rows)
            terms.append(f"{at} * {a.row_stride}" if a.row_stride != 1 else at)
        elif a.row_dims:  # rows not one stride apart: each row dim's index and stride
            terms.append(a.row_offset(rows, "//"))
        elif a.kind == Kind.ROW or (a.kind == Kind.FULL and self.spec.rows > 1):
            # a ROW pointer is always a [rows, 1] block, also for a single row
            terms.append(f"{rows} * {a.row_stride}" if a.row_stride != 1 else rows)
        # (an aligned walk's other arguments are read at the true column, cols = pos - shift)
        split = chunk is not None and chunk.split and not self.s.walk_align
        if a.kind in (Kind.FULL, Kind.COL) and split and a.col_stride == 1:
            return chunk.offset + " + ".join([*terms, f"tl.arange(0, {chunk.width})[None, :]"])
        if a.kind in (Kind.FULL, Kind.COL):
            terms.append(f"{cols} * {a.col_stride}" if a.col_stride != 1 else cols)
        return " + ".join(terms) if terms else "0"

    def gather_index(self, table: Arg, rows: str) -> str:
        """The name of the row of `table` that row block `rows` reads (gather_loads)."""
        return f"{table.name}_at" + ("" if rows == "rows" else f"_{rows}")

    def gather_loads(self, rows: str = "rows") -> None:
        """Each gathered table's row index, loaded once for row block `rows` (a clamped
        prefetch row needs no mask), and whether it is in range: a bad index is never
        read (its check_index reports it)."""
        for tid, g in self.spec.gathers.items():
            table, index = self.args[tid], g.index
            at = self.gather_index(table, rows)
            off = f"{rows} * {index.row_stride}" if index.row_stride != 1 else rows
            m = ", mask=row_ok, other=0" if self.row_mask and rows == "rows" else ""
            self.w.comment(f"{table.name}'s rows at {index.name} (gather_rows), once a row")
            self.w.line(f"{at} = tl.load({index.name}_ptr + {off}{m})")
            if self.s.gather_index_bits(table) == 64 and index.dtype.itemsize < 8:
                self.w.line(f"{at} = {at}.to(tl.int64)")
            self.w.line(f"{at}_ok = ({at} >= 0) & ({at} < {g.bound})")

    # -- emission ------------------------------------------------------------------
    def load(self, a: Arg, chunk: Chunk | None, rows: str = "rows", suffix: str = "") -> None:
        # a clamped row index (a prefetch) needs no row mask
        m = self.mask(a.kind, chunk, rows_masked=rows == "rows")
        if a.value.id in self.spec.gathers:
            ok = f"{self.gather_index(a, rows)}_ok"
            m = ok if m is None else f"{m} & {ok}"
        # masked-off lanes are computed but never stored or reduced: 1 keeps x / y, log,
        # rsqrt and pow finite there, where 0 made 0 / 0, -inf and inf (numpy warnings in
        # the interpreter); a GPU loads either constant alike. 1.0 for floats: the
        # interpreter would take an int 1 as bfloat16's bits (1e-40)
        edge = chunk is not None and str(chunk.index).startswith(("head", "tail"))
        if edge and chunk.masked and self._whole_vectors(a):
            m = self.mask(a.kind, None, rows_masked=rows == "rows")
            if chunk.index != "head":
                m = f"{m} & vec_ok{chunk.suffix()}" if m else f"vec_ok{chunk.suffix()}"
        other = "1.0" if a.dtype.is_float else "1"
        mask = f", mask={m}, other={other}" if m else ""
        target = self.name(a.value, chunk) + suffix
        tables = [t for t, g in self.spec.gathers.items() if g.index.name == a.name]
        if tables and rows == "rows" and not suffix:  # loaded once a row already
            self.w.line(f"{target} = {self.gather_index(self.args[tables[0]], rows)}")
            return
        # the row's own tiles only: a column vector (a weight) is read again by every row
        if self.evict and a.kind == Kind.FULL and chunk is not None:
            mask += f', eviction_policy="{self.evict}"'
        self.w.line(f"{target} = tl.load({a.name}_ptr + {self.offsets(a, chunk, rows)}{mask})")

    def store(self, a: Arg, chunk: Chunk | None) -> None:
        m = self.mask(a.kind, chunk)
        offsets = self.offsets(a, chunk)
        if a.kind == Kind.COL and self.spec.rows > 1 and self.s.kind in ROW_KINDS:
            # a row-invariant output (a parameter's cast, say): every row block holds the
            # same values, and all of them storing to one address serialize in L2 (a
            # LayerNorm with bf16 weights ran 4x slower so). The block of row 0 stores it.
            offsets += " + rows * 0"
            m = "(rows == 0)" if m is None else f"{m} & (rows == 0)"
        mask = f", mask={m}" if m else ""
        val = self.to(self.name(a.value, chunk), a.dtype, a.value.dtype)
        self.w.line(f"tl.store({a.name}_ptr + {offsets}, {val}{mask})")

    def elementwise(self, node: Node, chunk: Chunk | None) -> None:
        out = node.out
        if node.op == Op.CAST:
            expr = self.cast(node.inputs[0], out.dtype, chunk)
        else:
            common = operand_dtype(node)
            values = node.inputs[1:] if node.op == Op.WHERE else node.inputs
            if common is None:  # logical_and/or: each operand as a truth value
                compute, args = DType.bool, [self.truth(v, chunk) for v in values]
            else:
                compute = compute_dtype(common)
                args = [self.operand(v, chunk, node, common) for v in values]
            if node.op == Op.WHERE:
                args.insert(0, self.name(node.inputs[0], chunk))
            if node.op == Op.POW:
                args = self.pow_operands(node, args, chunk)
            expr = render_op(node.op, args, compute)
            if node.op == Op.TANH and not self.interpreted and values[0].id not in self.consts:
                # on a GPU, CUDA's tanhf (libdevice), as eager computes it: the same values,
                # and fewer instructions than the tl.* helper (which the interpreter keeps):
                # the GELU-backward bias gradient at 16384 x 3072 took 0.137 ms against
                # 0.156 (benchmarks/outer_variants.py, H100)
                expr = f"libdevice.tanh({args[0]})"
            if out.dtype != DType.bool and compute != out.dtype:
                expr = self.to(f"({expr})", out.dtype, compute)
        self.helpers.update(helper_names(expr))
        self.w.line(f"{self.name(out, chunk)} = {expr}")

    def operand(self, v: Value, chunk: Chunk | None, node: Node, common: DType) -> str:
        """`v` as an operand of `node`, whose operands' common dtype is `common`.

        Tiles are converted to the compute dtype: Triton would otherwise pick its own
        (float16 for float16 op bfloat16, where torch takes float32; tl.div_rn rejects
        float32 with float16). Comparisons round a wider operand to `common` first, as
        eager does (bf16(0.1) == 0.1 is true). A constant stays a literal, which Triton
        takes in the other operand's dtype; outside arithmetic it holds `common`'s
        rounding of its value, as eager's (arithmetic keeps the value the builder gave).
        """
        compute = compute_dtype(common)
        if v.id in self.consts:
            n = self.consts[v.id]
            dtype = n.attr("dtype") if node.op in FLOAT_MATH else common
            return _literal(n.attr("value"), dtype)
        x = self.name(v, chunk)
        if node.op in COMPARE and v.dtype != common and compute != common:
            return self.to(self.to(x, common, v.dtype), compute, common)
        return self.to(x, compute, v.dtype)

    def pow_operands(self, node: Node, args: list[str], chunk: Chunk | None) -> list[str]:
        """pow's operands with a literal one made a tile of the other's shape: the pow_
        helper broadcasts its operands before it `&`s comparisons of both (a GPU makes the
        same code of a literal)."""
        lit = [v.id in self.consts for v in node.inputs]
        if lit[0] == lit[1]:
            return args
        i = lit.index(True)
        shape = f"{self.name(node.inputs[1 - i], chunk)}.shape"
        spread = f"tl.full({shape}, {args[i]}, {TL_DTYPE[compute_dtype(node.out.dtype)]})"
        return [spread, args[1]] if i == 0 else [args[0], spread]

    def truth(self, v: Value, chunk: Chunk | None) -> str:
        """`v` as a bool (nonzero), an operand of logical_and/or."""
        if v.id in self.consts:
            return _literal(self.consts[v.id].attr("value"), DType.bool)
        x = self.name(v, chunk)
        if v.dtype == DType.bool:
            return x
        compute = compute_dtype(v.dtype)
        return f"({self.to(x, compute, v.dtype)} != 0)"

    def cast(self, src: Value, dst: DType, chunk: Chunk | None) -> str:
        if src.id in self.consts:  # fold: the literal in the new dtype
            return _literal(self.consts[src.id].attr("value"), dst)
        return cast_value(self.name(src, chunk), src.dtype, dst, self.interpreted, self.helpers)

    def broadcast(self, node: Node, chunk: Chunk | None) -> None:
        # tiles broadcast by shape ([R,1] with [R,C]); only name the alias
        src, out = node.inputs[0], node.out
        value = self.name(src, chunk)
        if src.id in self.consts and src.dtype not in (DType.float32, DType.bool):
            # a constant's literal is a float32 (or int32) Python number, not a tile of
            # its dtype: what reads the alias as a bfloat16 or float16 tile (bf16_wide,
            # .to) needs one. A slice of nothing but a pad's zeros is such a broadcast
            value = f"tl.full((1, 1), {value}, {TL_DTYPE[src.dtype]})"
        self.w.line(f"{self.name(out, chunk)} = {value}")

    def view(self, node: Node, chunk: Chunk | None) -> None:
        """A read of a kernel input at mapped columns: scale * cols + offset, masked
        outside the view's range [lo, hi) (and the rows and columns of the tile)."""
        a = self.spec.view_arg(node)
        cols = f"cols{chunk.suffix()}" if chunk else "cols"
        scale, offset, lo, hi = (node.attr(k) for k in ("scale", "offset", "lo", "hi"))
        col = cols if scale == 1 else f"{cols} * {scale}"
        col = col if not offset else f"({col} {'+' if offset > 0 else '-'} {abs(offset)})"
        terms = []
        if a.row_dims:
            terms.append(a.row_offset("rows", "//"))
        elif a.kind == Kind.FULL and self.spec.rows > 1:
            terms.append(f"rows * {a.row_stride}" if a.row_stride != 1 else "rows")
        terms.append(f"{col} * {a.col_stride}" if a.col_stride != 1 else col)
        masks = ["row_ok"] if a.kind == Kind.FULL and self.row_mask else []
        if hi < self.spec.cols:
            masks.append(f"({cols} < {hi})")
        elif chunk is not None and chunk.masked:
            masks.append(f"col_ok{chunk.suffix()}")
        if lo > 0:
            masks.append(f"({cols} >= {lo})")
        other = "1.0" if a.dtype.is_float else "1"  # as load(): finite math in masked lanes
        mask = f", mask={' & '.join(masks)}, other={other}" if masks else ""
        self.w.line(
            f"{self.name(node.out, chunk)} = tl.load({a.name}_ptr + {' + '.join(terms)}{mask})"
        )

    def iota(self, node: Node, chunk: Chunk | None) -> None:
        cols = f"cols{chunk.suffix()}" if chunk else "cols"
        self.w.line(f"{self.name(node.out, chunk)} = {cols}.to({TL_DTYPE[node.out.dtype]})")

    def check_index(self, node: Node, chunk: Chunk | None) -> None:
        """`node`'s index passed through, and one predicate per element of its kind (one
        per row for a target); index_error reports the bad ones."""
        out, name = node.out, self.name(node.out, chunk)
        value = static_check(node, self.consts)
        if value is not None:  # a constant index, checked here
            self.w.line(f"{name} = {value}")
            return
        self.w.comment(check_comment(node))
        self.w.line(f"{name} = {self.name(node.inputs[0], chunk)}")
        bad = f"({name} < 0) | ({name} >= {int(node.attr('bound'))})"
        if node.attr("ignore") is not None:
            bad = f"(({bad}) & ({name} != {node.attr('ignore')}))"
        kind = self.kind(out)
        mask = self.mask(kind, chunk)
        self.w.line(f"{name}_bad = {bad}" + (f" & {mask}" if mask else ""))
        cols = f"cols{chunk.suffix()}" if chunk else "cols"
        index = {
            Kind.ROW: "rows",
            Kind.COL: cols,
            Kind.FULL: f"rows * {self.spec.cols} + {cols}",
            Kind.SCALAR: f"tl.zeros_like({name})",
        }[kind]
        record = record_slot(CHECK_PARAMS[0], self.spec.checks.index(node))
        call = f"index_error({record}, {CHECK_PARAMS[1]}, {index}, {name}, {name}_bad)"
        self.helpers.add("index_error")
        if kind in (Kind.ROW, Kind.SCALAR):
            # reported after the row's work (flush_reports): masked atomics ahead of the
            # row's loops cost ptxas 7-8 registers more (cross-entropy over 50257 and 1000
            # classes, sm_90: 32 -> 39 and 40), after them none
            self.reports.append(call)
        else:
            self.w.line(call)

    def flush_reports(self) -> None:
        """The index_error calls of the row checks so far: where a row's work ends."""
        for call in self.reports:
            self.w.line(call)
        self.reports = []

    def compute(self, node: Node, chunk: Chunk | None) -> None:
        if node.op == Op.CONST:
            return
        if node.op == Op.BROADCAST_IN_DIM:
            self.broadcast(node, chunk)
        elif node.op == Op.IOTA:
            self.iota(node, chunk)
        elif node.op == Op.VIEW:
            self.view(node, chunk)
        elif node.op == Op.CHECK_INDEX:
            self.check_index(node, chunk)
        elif node.op == Op.GATHER_ROWS:  # the table's load is the gathered read
            self.w.line(f"{self.name(node.out, chunk)} = {self.name(node.inputs[0], chunk)}")
        elif node.op in ELEMENTWISE:
            self.elementwise(node, chunk)
        else:
            raise CompileError(f"cannot render {node.op.value} for triton here")

    def reduce_operand(self, node: Node, chunk: Chunk | None, mask: str | None) -> str:
        """The reduced value of one tile, widened to the accumulator dtype, with masked
        lanes set to the reduction's identity."""
        x = node.inputs[0]
        val = (
            f"tl.broadcast_to({self.to(self.name(x, chunk), accumulator(x.dtype), x.dtype)}, "
            f"{self.tile_shape(chunk)})"
        )
        return f"tl.where({mask}, {val}, {_identity(node.op, x.dtype)})" if mask else val

    def reduce_term(self, node: Node, chunk: Chunk | None) -> str:
        """One chunk's partial reduction along the row."""
        mask = f"col_ok{chunk.suffix()}" if chunk is not None and chunk.masked else None
        return self.reduce(node, self.reduce_operand(node, chunk, mask), axis=1)

    def reduce(self, node: Node, operand: str, axis: int) -> str:
        """`node`'s reduction of `operand` along `axis` (NaN-propagating for float max/min)."""
        expr = reduce_call(node.op, node.inputs[0].dtype, operand, axis)
        self.helpers.update(helper_names(expr))
        return expr

    def tile_shape(self, chunk: Chunk | None) -> str:
        width = chunk.width if chunk else self.s.chunk
        return f"({self.s.rows_per_block}, {width})"

    def combine(self, op: Op, a: str, b: str) -> str:
        if op == Op.SUM:
            return f"{a} + {b}"
        fn = "tl.maximum" if op == Op.MAX else "tl.minimum"
        return f"{fn}({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"

    def _whole_vectors(self, a: Arg) -> bool:
        """Whether the aligned-start walk loads `a` a whole vector at a time in its masked
        head and tail too. A 16-byte-aligned vector holding one of the row's columns never
        leaves that column's page; its lanes off the row read the neighbouring rows (or,
        past the last row, up to 14 bytes after the tensor's last element) and are masked
        where they are used (reductions, index checks, stores), so the head needs no mask
        and the tail one per vector. An exact mask there split
        every vector into 2-byte loads, each with its own predicate and address (sm_90,
        the bf16 cross-entropy at 50257: 80 registers and a spill). Not in the interpreter:
        there the lanes past the last row would read past the tensor's allocation."""
        if self.interpreted:
            return False
        return bool(self.s.walk_align) and a.name in self.s.walk_args and not a.is_output

    # -- shared kernel pieces ------------------------------------------------------
    def signature(self, extra: list[str]) -> str:
        ptrs = [f"{a.name}_ptr" for a in self.spec.args] + extra
        ptrs += list(CHECK_PARAMS) if self.spec.checks else []
        return f"def {self.spec.name}({', '.join(ptrs + ['n_rows'])}):"

    def row_setup(self, pid: str) -> None:
        rpb = self.s.rows_per_block
        idx = f"tl.arange(0, {rpb})[:, None]"
        if self.s.index_bits == 64:
            self.w.line(f"rows = {pid}.to(tl.int64) * {rpb} + {idx}")
        else:
            self.w.line(f"rows = {pid} * {rpb} + {idx}")
        if self.row_mask:
            self.w.line("row_ok = rows < n_rows")
        self.gather_loads()
        if self.s.walk_align:
            a, st = self.s.walk_align, self.s.walk_stride
            self.w.comment(
                f"aligned-start walk: the row starts `shift` elements past a {a}-element "
                "boundary;\nits columns are walked from there (column = position - shift)"
            )
            # one row a program (a looped kernel): scalars, so multiple_of is a plain hint
            wide = ".to(tl.int64)" if self.s.index_bits == 64 else ""
            self.w.line(f"row_start = {pid}{wide} * {st}")
            self.w.line(f"shift = row_start % {a}")
            self.w.line(f"row_base = tl.multiple_of(row_start - shift, {a})")
            for arg in self.spec.args:
                if arg.name in self.s.walk_args and arg.row_stride != st:
                    start = f"{pid}{wide} * {arg.row_stride} - shift"
                    self.w.line(f"row_base_{arg.name} = tl.multiple_of({start}, {a})")

    def col_setup(self, chunk: Chunk) -> None:
        sfx = chunk.suffix()
        if self.s.walk_align:
            self.w.line(f"pos{sfx} = {chunk.offset}tl.arange(0, {chunk.width})[None, :]")
            self.w.line(f"cols{sfx} = pos{sfx} - shift")
            if chunk.index == "head":
                self.w.line(f"col_ok{sfx} = cols{sfx} >= 0")
            elif chunk.masked:
                self.w.line(f"col_ok{sfx} = cols{sfx} < {self.spec.cols}")
                if any(self._whole_vectors(a) for a in self.spec.args):
                    # a vector whose first column is on the row is loaded whole
                    v = self.s.walk_align
                    ok = f"(pos{sfx} // {v}) * {v} < {self.spec.cols} + shift"
                    self.w.line(f"vec_ok{sfx} = {ok}")
            return
        self.w.line(f"cols{sfx} = {chunk.offset}tl.arange(0, {chunk.width})[None, :]")
        if chunk.masked:
            self.w.line(f"col_ok{sfx} = cols{sfx} < {self.spec.cols}")

    def pick_setup(self, chunk: Chunk, index: Value) -> None:
        """A pick's one-column tile (plan.picks): the column its row value `index` names,
        in range or masked off."""
        sfx = chunk.suffix()
        if self.kind(index) == Kind.SCALAR:
            # one index for every row (a single row's target): a [rows, 1] tile all the
            # same, as a row value would be, so that loads and stores through it are tiles
            self.w.line(f"cols{sfx} = {self.name(index, None)} + rows * 0")
        else:
            self.w.line(f"cols{sfx} = {self.name(index, None)}")
        self.w.line(f"col_ok{sfx} = (cols{sfx} >= 0) & (cols{sfx} < {self.spec.cols})")
        if self.s.walk_align:  # walk_args are addressed by position: column + shift
            self.w.line(f"pos{sfx} = cols{sfx} + shift")

    def kind(self, v: Value) -> Kind:
        return self.spec.kind(v)


def _cone(spec: KernelSpec, targets: list[Value], kinds: set[Kind], stop_depth: int) -> list[Node]:
    """Nodes (in order) needed to compute `targets`, restricted to values of `kinds`
    with depth below `stop_depth` (deeper ROW values are already computed)."""
    producer = spec.producers
    need: set[int] = set()
    stack = [v.id for v in targets]
    while stack:
        vid = stack.pop()
        n = producer.get(vid)
        if n is None or id(n) in need:
            continue
        if spec.kinds[vid] not in kinds or n.op in REDUCE:
            continue
        need.add(id(n))
        stack += [v.id for v in n.inputs]
    return [n for n in spec.nodes if id(n) in need]
