"""The op -> Triton expression table: the one place Triton spells each op."""

from __future__ import annotations

import re
from collections.abc import Callable

from fuser.errors import CompileError
from fuser.ir.dtypes import DType
from fuser.ir.ops import Op

TL_DTYPE = {
    DType.float32: "tl.float32",
    DType.float16: "tl.float16",
    DType.bfloat16: "tl.bfloat16",
    DType.float64: "tl.float64",
    DType.int32: "tl.int32",
    DType.int64: "tl.int64",
    DType.bool: "tl.int1",
}

E = Callable[..., str]
UNARY: dict[Op, E] = {
    Op.NEG: lambda x: f"-{x}",
    Op.ABS: lambda x: f"tl.abs({x})",
    Op.EXP: lambda x: f"tl.exp({x})",
    Op.EXP2: lambda x: f"tl.exp2({x})",
    Op.LOG: lambda x: f"tl.log({x})",
    Op.LOG2: lambda x: f"tl.log2({x})",
    Op.LOG1P: lambda x: f"log1p({x})",
    Op.SQRT: lambda x: f"tl.sqrt_rn({x})",
    Op.RSQRT: lambda x: f"tl.rsqrt({x})",
    Op.RECIPROCAL: lambda x: f"(1.0 / {x})",
    Op.TANH: lambda x: f"tanh({x})",
    Op.ERF: lambda x: f"tl.erf({x})",
    Op.SIGMOID: lambda x: f"tl.sigmoid({x})",
    Op.RELU: lambda x: f"tl.where({x} < 0, 0, {x})",  # NaN stays NaN, as torch.relu
    Op.SIN: lambda x: f"tl.sin({x})",
    Op.COS: lambda x: f"tl.cos({x})",
    Op.FLOOR: lambda x: f"tl.floor({x})",
    Op.CEIL: lambda x: f"tl.ceil({x})",
    Op.LOGICAL_NOT: lambda x: f"({x} == 0)",
    Op.ISNAN: lambda x: f"({x} != {x})",
}
BINARY: dict[Op, E] = {
    Op.ADD: lambda a, b: f"({a} + {b})",
    Op.SUB: lambda a, b: f"({a} - {b})",
    Op.MUL: lambda a, b: f"({a} * {b})",
    Op.DIV: lambda a, b: f"tl.div_rn({a}, {b})",
    Op.POW: lambda a, b: f"pow_({a}, {b})",
    Op.MAXIMUM: lambda a, b: f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    Op.MINIMUM: lambda a, b: f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)",
    Op.EQ: lambda a, b: f"({a} == {b})",
    Op.NE: lambda a, b: f"({a} != {b})",
    Op.LT: lambda a, b: f"({a} < {b})",
    Op.LE: lambda a, b: f"({a} <= {b})",
    Op.GT: lambda a, b: f"({a} > {b})",
    Op.GE: lambda a, b: f"({a} >= {b})",
    # not `&`/`|`: Triton's interpreter cannot `&` a tile with a 0-d comparison (numpy
    # bitwise_and on the float data it labels the result with); a GPU compiles a select
    # of a constant i1 to the same and/or
    Op.LOGICAL_AND: lambda a, b: f"tl.where({a}, {b}, False)",
    Op.LOGICAL_OR: lambda a, b: f"tl.where({a}, True, {b})",
}
REDUCE_FN = {Op.SUM: "tl.sum", Op.MAX: "tl.max", Op.MIN: "tl.min"}
# float max/min reduce with a NaN-propagating combine (tl.max drops NaN; torch.amax keeps it)
NAN_COMBINE = {Op.MAX: "max_nan", Op.MIN: "min_nan"}


def reduce_call(op: Op, dtype: DType, operand: str, axis: int) -> str:
    """One reduction of `operand` along `axis`, keeping the reduced axis."""
    if op in NAN_COMBINE and dtype.is_float:
        return f"tl.reduce({operand}, {axis}, {NAN_COMBINE[op]}, keep_dims=True)"
    return f"{REDUCE_FN[op]}({operand}, axis={axis}, keep_dims=True)"


# arithmetic: its constants keep the value the builder gave them (the builder rounds a
# scalar added to a 16-bit tensor; eager CPU mul/div keep it unrounded)
FLOAT_MATH = set(UNARY) | {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW}

# Helpers written in tl.* only, so they run in the interpreter and compile alike.
HELPERS = {
    "tanh": """@triton.jit
def tanh(x):
    # tanh(x) = sign(x) * (1 - e) / (1 + e), e = exp(-2|x|): no overflow for large |x|
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    # near 0, 1 - e cancels: the series to x**13 there, exact to float64 below 0.0625
    # (each term is ~0.0016 of the last; to x**5 only, float64 came out 2e-9 off)
    x2 = x * x
    s = 21844.0 / 6081075.0 - x2 * (929569.0 / 638512875.0)
    s = 62.0 / 2835.0 - x2 * (1382.0 / 155925.0 - x2 * s)
    s = 0.3333333333333333 - x2 * (0.13333333333333333 - x2 * (17.0 / 315.0 - x2 * s))
    small = x * (1.0 - x2 * s)
    return tl.where(tl.abs(x) < 0.0625, small, tl.where(x < 0, -t, t))
""",
    "log1p": """@triton.jit
def log1p(x):
    # log(1 + x) loses x's low bits when it rounds 1 + x (x = 1e-4 came out 5e-4 off in
    # float32): log(u) * x / (u - 1), u = 1 + x, divides that rounding out (Goldberg),
    # in float64 for float64 and in float32 otherwise (a float64 log per element would
    # cost a memory-bound kernel its speed; the formula's error is the log's, a few ulps);
    # u - 1 = 0 is x below half an ulp of 1, where log1p(x) is x (u = inf: x = inf)
    if x.dtype == tl.float64:
        w = x
    else:
        w = x.to(tl.float32)
    u = 1.0 + w
    d = u - 1.0
    exact = (d == 0) | (u == POS_INF)
    r = tl.log(tl.where(exact, 1.0, u)) * (w / tl.where(exact, 1.0, d))
    return tl.where(exact, w, r).to(x.dtype)
""",
    "nan_": """@triton.jit
def nan_():
    # a quiet NaN from its bits (see render.CONSTANTS for why not a global)
    return tl.cast(0x7FC00000, tl.float32, bitcast=True)
""",
    "bf16_rne": """@triton.jit
def bf16_rne(x):
    # float32 -> bfloat16 rounded to nearest even, as a GPU's cvt.rn and torch round
    # (Triton's interpreter, where this runs, truncates); NaN stays a quiet NaN
    bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet = (bits >> 16) | 0x40
    top = tl.where(x != x, quiet, rounded)
    return top.to(tl.uint16).to(tl.bfloat16, bitcast=True)
""",
    "bf16_wide": """@triton.jit
def bf16_wide(x):
    # bfloat16 -> float32 exactly, subnormals included: the same bits, 16 places up
    # (Triton's interpreter, where this runs, flushes bf16 subnormals when it widens)
    bits = x.to(tl.uint16, bitcast=True).to(tl.uint32)
    return (bits << 16).to(tl.float32, bitcast=True)
""",
    "index_error": """@triton.jit
def index_error(err_ptr, flag_ptr, index, value, bad):
    # indices out of their range where `bad` (fuser/runtime/checks.py): masked atomics,
    # predicated off while every index is good. The smallest bad element wins: its index
    # keys both 32-bit halves of its value, so both minima are its own (an index past
    # 2**31 - 1 is clamped to it)
    key = tl.minimum(index.to(tl.int64), 0x7FFFFFFF) << 32
    wide = value.to(tl.int64)
    at = err_ptr + tl.zeros_like(index)
    tl.atomic_min(at, key | (wide & 0xFFFFFFFF), mask=bad)
    tl.atomic_min(at + 1, key | ((wide >> 32) & 0xFFFFFFFF), mask=bad)
    tl.store(flag_ptr + tl.zeros_like(index), 1, mask=bad)
""",
    "max_nan": """@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
""",
    "min_nan": """@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
""",
    "pow_": """@triton.jit
def pow_(a, b):
    # a**b = exp2(b * log2|a|), with the sign of a for integral b, and a**0 = 1
    # (a 0-d a or b made a tile first: Triton's interpreter cannot `&` a tile with a 0-d
    # comparison; a GPU splats it either way). The exp2 and log2 run in float64: in
    # float32 the GPU's approximate log2 is off by ~2**-22 absolute, which b multiplies
    # (a result near 2**127 came out 1e-5 off and finite where torch's powf overflows)
    a, b = tl.broadcast(a, b)
    # a zero a apart: 0**b is 0, inf or NaN as b > 0, < 0 or NaN (0**0 = 1 below); the
    # exp2 computes 1**0 there, not b * log2(0) = b * -inf (NaN for b = 0)
    zero = a == 0
    lg = tl.log2(tl.where(zero, 1.0, tl.abs(a)).to(tl.float64))
    wide = tl.exp2(tl.where(zero, 0.0, b).to(tl.float64) * lg)
    wide = tl.where(zero, tl.where(b > 0, 0.0, tl.where(b < 0, POS_INF, b)), wide)
    mag = wide.to(a.dtype)
    integral = tl.floor(b) == b
    odd = integral & (tl.floor(b * 0.5) * 2.0 != b)
    signed = tl.where((a < 0) & odd, -mag, mag)
    r = tl.where((a < 0) & (integral == 0), nan_(), signed)
    # IEEE pow: 1**b = 1 for any b (NaN too), (-1)**(+-inf) = 1, a**0 = 1
    one = (a == 1.0) | (b == 0) | ((a == -1.0) & (tl.abs(b) == POS_INF))
    return tl.where(one, 1.0, r)
""",
    "ipow_": """@triton.jit
def ipow_(a, b):
    # integer a**b as torch computes it: exact, wrapping around in the integer type (pow_
    # goes through float64, whose 53 bits hold no 3**40), by squaring over the bits of
    # b; a negative b gives 1 for a = 1, +-1 for a = -1 as b is even or odd, 0 else
    a, b = tl.broadcast(a, b)
    e = tl.where(b < 0, 0, b)
    r = tl.full(a.shape, 1, a.dtype)
    sq = a
    for _ in range(a.dtype.primitive_bitwidth - 1):
        r = tl.where((e & 1) != 0, r * sq, r)
        sq = sq * sq
        e = e >> 1
    neg = tl.where(a == 1, 1, tl.where(a == -1, 1 - 2 * (b & 1), 0)).to(a.dtype)
    return tl.where(b < 0, neg, r)
""",
}


def helper_names(expr: str) -> list[str]:
    return [name for name in HELPERS if re.search(rf"(?<![\w.]){name}\b", expr)]


# tl.div_rn and tl.sqrt_rn take float32 only; float64's `/` and tl.sqrt round correctly
# (div.rn.f64, sqrt.rn.f64)
FLOAT64: dict[Op, E] = {
    Op.DIV: lambda a, b: f"({a} / {b})",
    Op.SQRT: lambda x: f"tl.sqrt({x})",
}


def render_op(op: Op, args: list[str], dtype: DType | None = None) -> str:
    """`op` of the expressions `args`, computed in `dtype`."""
    if op == Op.POW and dtype in (DType.int32, DType.int64):
        return f"ipow_({args[0]}, {args[1]})"
    if dtype == DType.float64 and op in FLOAT64:
        return FLOAT64[op](*args)
    if op in UNARY:
        return UNARY[op](*args)
    if op in BINARY:
        return BINARY[op](*args)
    if op == Op.WHERE:
        return f"tl.where({args[0]}, {args[1]}, {args[2]})"
    raise CompileError(f"cannot render {op.value} for triton")
