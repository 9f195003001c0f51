"""The C expressions of a CUDA kernel: how the current scope spells a value, a constant in
a given C type, an elementwise node, a cast, an index check. CudaKernelWriter (render.py)
adds the memory accesses, reductions and nests on top."""

from __future__ import annotations

from fuser.codegen.cuda.templates import (
    COMPUTE,
    HALF,
    ROUNDED,
    from_memory,
    literal,
    render_op,
    round_to,
)
from fuser.codegen.guards import check_comment, record_slot, static_check
from fuser.codegen.writer import Writer
from fuser.errors import CompileError
from fuser.ir.dtypes import DType, promote
from fuser.ir.graph import Node, Value
from fuser.ir.ops import COMPARE, ELEMENTWISE, LOGICAL, UNARY_BOOL, Op
from fuser.plan.kernel_plan import KernelPlan
from fuser.schedulers.spec import CHECK_PARAMS
from fuser.segmenter import Kind

_CT_DTYPE = {
    "double": DType.float64,
    "long long": DType.int64,
    "int": DType.int32,
    "bool": DType.bool,
}


class CudaExpressions:
    """The state of one kernel being written and the expressions of its values."""

    def __init__(self, plan: KernelPlan):
        spec = plan.spec
        self.spec, self.s = spec, plan
        self.w = Writer()
        self.args = {a.value.id: a for a in spec.args}
        self.consts = {n.out.id: n for n in spec.nodes if n.op == Op.CONST}
        self.producer = spec.producers
        self.idx = "long long" if plan.index_bits == 64 else "int"
        self.arrays: set[int] = set()  # values in [slot][i] register arrays
        self.col_arrays: set[int] = set()  # COL values a thread holds in [i] arrays
        self.slot_var = "c"

    # -- values ------------------------------------------------------------------------
    def kind(self, v: Value) -> Kind:
        return self.spec.kind(v)

    def value(self, vid: int) -> Value:
        n = self.producer.get(vid)
        if n is not None:
            return next(v for v in n.outputs if v.id == vid)
        return self.args[vid].value

    def ref(self, v: Value) -> str:
        """How the current scope spells `v`."""
        if v.id in self.consts:
            n = self.consts[v.id]
            return literal(n.attr("value"), n.attr("dtype"))
        if v.id in self.arrays:
            return f"{v.name}[{self.slot_var}][i]"
        if v.id in self.col_arrays:
            return f"{v.name}[i]"
        return v.name

    def operand(self, v: Value, ct: str, common: DType | None = None) -> str:
        """`v` as C type `ct`: constants are written in it, other values converted.

        `common`: the operands' common dtype of a comparison, where, maximum or minimum;
        eager rounds each operand to it first (bf16(0.1) == 0.1 is true), so a 16-bit
        `common` rounds a constant or a wider value (a float32 scalar next to a bf16
        tensor). Arithmetic keeps its constants as the builder gave them.
        """
        if v.id in self.consts:
            value, dtype = self.consts[v.id].attr("value"), self.consts[v.id].attr("dtype")
            if common in HALF:
                return literal(value, common)
            # a float constant stays float32 (or its own 16-bit value) next to float32 math:
            # a double literal would pull the whole expression into float64
            target = (dtype if dtype in HALF else DType.float32) if ct == "float" else _CT_DTYPE[ct]
            return literal(value, target)
        x = self.ref(v)
        x = x if COMPUTE[v.dtype] == ct else f"({ct}){x}"
        return round_to(x, common) if common in HALF and v.dtype != common else x

    def expr(self, node: Node) -> str:
        """The C expression of an elementwise, broadcast or iota node."""
        out, op = node.out, node.op
        ct = COMPUTE[out.dtype]
        if op == Op.BROADCAST_IN_DIM:
            return self.operand(node.inputs[0], ct)
        if op == Op.IOTA:
            return f"({ct})(col + i)"
        if op == Op.VIEW:
            return self.view(node)
        if op == Op.GATHER_ROWS:  # the table's load is the gathered read
            return self.operand(node.inputs[0], ct)
        if op == Op.CAST:
            return self.cast(node.inputs[0], out.dtype)
        if op not in ELEMENTWISE:
            raise CompileError(f"cannot render {op.value} for cuda")
        if op in COMPARE:
            xs = node.inputs
            common = promote([x.dtype for x in xs if x.rank], [x.dtype for x in xs if not x.rank])
            opct = COMPUTE[common]
            return render_op(op, [self.operand(v, opct, common) for v in xs], opct)
        if op in LOGICAL:
            return render_op(op, [self.operand(v, "bool") for v in node.inputs], "bool")
        if op in UNARY_BOOL:
            x = node.inputs[0]
            return render_op(op, [self.operand(x, COMPUTE[x.dtype])], COMPUTE[x.dtype])
        if op == Op.WHERE:
            args = [self.operand(node.inputs[0], "bool")]
            args += [self.operand(v, ct, out.dtype) for v in node.inputs[1:]]
        elif op in (Op.MAXIMUM, Op.MINIMUM):
            args = [self.operand(v, ct, out.dtype) for v in node.inputs]
        else:
            args = [self.operand(v, ct) for v in node.inputs]
        e = render_op(op, args, ct)
        return round_to(e, out.dtype) if out.dtype in HALF and op in ROUNDED else e

    def view(self, node: Node) -> str:
        """A read of a kernel input at mapped column scale * (col + i) + offset, one
        element, guarded by the view's range [lo, hi) and the tile's rows and columns."""
        a = self.spec.view_arg(node)
        scale, offset, lo, hi = (node.attr(k) for k in ("scale", "offset", "lo", "hi"))
        col = "(col + i)" if scale == 1 else f"(col + i) * {scale}"
        col = col if not offset else f"({col} {'+' if offset > 0 else '-'} {abs(offset)})"
        terms = [f"{col} * {a.col_stride}" if a.col_stride != 1 else col]
        if a.row_dims:
            terms.insert(0, a.row_offset("row", "/"))
        elif a.kind == Kind.FULL and a.row_stride:
            terms.insert(0, "row" if a.row_stride == 1 else f"row * {a.row_stride}")
        ok = [f"row < {self.spec.rows}"] if a.kind == Kind.FULL else []
        ok += [f"col + i >= {lo}"] if lo > 0 else []
        ok += [f"col + i < {min(hi, self.spec.cols)}"]
        mem = from_memory(f"{a.name}_ptr[{' + '.join(terms)}]", a.dtype)
        ct = COMPUTE[node.out.dtype]
        return f"({' && '.join(ok)}) ? {mem} : ({ct})1"

    def cast(self, src: Value, dst: DType) -> str:
        if src.id in self.consts:  # fold: the literal in the new dtype
            return literal(self.consts[src.id].attr("value"), dst)
        x, ct = self.ref(src), COMPUTE[dst]
        if dst == DType.bool:
            return f"({x} != 0)"
        if dst in HALF:
            if src.dtype == dst:
                return x
            return round_to(x if COMPUTE[src.dtype] == "float" else f"(float){x}", dst)
        return x if COMPUTE[src.dtype] == ct else f"({ct}){x}"

    def define(self, node: Node) -> None:
        """Emit `node` in the current scope: an array element or a local constant."""
        if node.op == Op.CONST:
            return
        if node.op == Op.CHECK_INDEX:
            self.check_index(node)
            return
        v = node.out
        if v.id in self.arrays or v.id in self.col_arrays:
            self.w.line(f"{self.ref(v)} = {self.expr(node)};")
        else:
            self.w.line(f"const {COMPUTE[v.dtype]} {v.name} = {self.expr(node)};")

    def check_index(self, node: Node) -> None:
        """`node`'s index passed through, and one compare per element of its kind (per
        row for a target): a bad element inside the tensor calls index_error. The element
        is spelled from `row`, `col` and `i`, which every scope of that kind defines."""
        v, ct = node.out, COMPUTE[node.out.dtype]
        value = static_check(node, self.consts)
        if value is not None:  # a constant index, checked here
            self.w.line(f"const {ct} {v.name} = {literal(value, v.dtype)};")
            return
        self.w.comment(check_comment(node), "//")
        x = self.operand(node.inputs[0], ct)
        if v.id in self.arrays or v.id in self.col_arrays:
            self.w.line(f"{self.ref(v)} = {x};")
        else:
            self.w.line(f"const {ct} {v.name} = {x};")
        ref, rows, cols = self.ref(v), self.spec.rows, self.spec.cols
        index, inside = {
            Kind.ROW: ("row", [f"row < {rows}"]),
            Kind.COL: ("col + i", [f"col + i < {cols}"]),
            Kind.FULL: (f"row * {cols} + col + i", [f"row < {rows}", f"col + i < {cols}"]),
            Kind.SCALAR: ("0", []),
        }[self.kind(v)]
        bad = f"({ref} < 0 || {ref} >= {int(node.attr('bound'))})"
        if node.attr("ignore") is not None:
            bad += f" && {ref} != {literal(node.attr('ignore'), v.dtype)}"
        record = record_slot(CHECK_PARAMS[0], self.spec.checks.index(node))
        args = f"{record}, {CHECK_PARAMS[1]}, {index}, {ref}"
        self.w.line(f"if ({' && '.join([*inside, bad])}) index_error({args});")
