"""The op -> CUDA C++ expression table and the helpers every kernel may use.

One place spells each op for CUDA, with the same semantics as the Triton table
(fuser/codegen/triton/templates.py): 16-bit floats are computed in float32 and rounded
once to their dtype, division and square root are correctly rounded, max/min propagate
NaN as torch does. 16-bit floats travel as their bits (`fp16`, `bf16`) and are converted
with single PTX instructions, so NVRTC needs no header (cuda_fp16.h is not in the pip
wheels).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from fuser.errors import CompileError
from fuser.ir.dtypes import DType
from fuser.ir.ops import Op

HALF = (DType.float16, DType.bfloat16)

# the C type a value of each dtype has in registers: 16-bit floats live as float32
COMPUTE = {
    DType.float64: "double",
    DType.float32: "float",
    DType.float16: "float",
    DType.bfloat16: "float",
    DType.int64: "long long",
    DType.int32: "int",
    DType.bool: "bool",
}
# the C type of each dtype in memory
MEMORY = {**COMPUTE, DType.float16: "fp16", DType.bfloat16: "bf16"}


def from_memory(expr: str, dtype: DType) -> str:
    """A loaded element as its compute type."""
    return f"to_float({expr})" if dtype in HALF else expr


def to_memory(expr: str, dtype: DType) -> str:
    """A computed value as its memory type (the value is already rounded to dtype)."""
    if dtype == DType.float16:
        return f"to_fp16({expr})"
    if dtype == DType.bfloat16:
        return f"to_bf16({expr})"
    return expr


def round_to(expr: str, dtype: DType) -> str:
    """A float32 expression rounded to a 16-bit dtype (kept as float32)."""
    if dtype == DType.float16:
        return f"round_fp16({expr})"
    if dtype == DType.bfloat16:
        return f"round_bf16({expr})"
    return expr


def acc_type(dtype: DType) -> str:
    """The C type a reduction over values of `dtype` accumulates in."""
    if dtype.is_float:
        return "double" if dtype == DType.float64 else "float"
    return "long long"


def _half_value(v: float, dtype: DType) -> float:
    """`v` rounded to nearest even in a 16-bit float format."""
    if dtype == DType.float16:
        return (
            struct.unpack("<e", struct.pack("<e", v))[0]
            if abs(v) < 65520
            else math.copysign(math.inf, v)
        )
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def literal(value: object, dtype: DType) -> str:
    """A constant of `dtype` as a C literal of its compute type."""
    if dtype == DType.bool:
        return "true" if value else "false"
    if dtype.is_float:
        v = float(value)
        if dtype in HALF and math.isfinite(v):
            v = _half_value(v, dtype)
        if math.isnan(v):
            return "NAN_F"
        if math.isinf(v):
            return "POS_INF" if v > 0 else "NEG_INF"
        if dtype != DType.float64 and abs(v) > 3.4028234663852886e38:
            return "POS_INF" if v > 0 else "NEG_INF"
        text = repr(v)
        return text if dtype == DType.float64 else text + "f"
    n = int(value)
    if dtype == DType.int64:
        return f"({n + 1}LL - 1)" if n == -(2**63) else f"{n}LL"
    return f"({n + 1} - 1)" if n == -(2**31) else str(n)


def identity(op: Op, dtype: DType) -> str:
    """The identity of a reduction over values of `dtype`, in its accumulator type."""
    acc = acc_type(dtype)
    if op == Op.SUM:
        return {"float": "0.0f", "double": "0.0"}.get(acc, "0LL")
    if acc in ("float", "double"):
        return "NEG_INF" if op == Op.MAX else "POS_INF"
    return literal(-(2**63) if op == Op.MAX else 2**63 - 1, DType.int64)


REDUCE_FN = {Op.SUM: "Sum", Op.MAX: "Max", Op.MIN: "Min"}


def combine(op: Op, a: str, b: str) -> str:
    if op == Op.SUM:
        return f"{a} + {b}"
    return f"{'max_nan' if op == Op.MAX else 'min_nan'}({a}, {b})"


# -- math by compute type: float32 functions take an `f` suffix -------------------------
def _fn(name: str) -> Callable[[str, str], str]:
    return lambda x, ct: f"{name}{'f' if ct == 'float' else ''}({x})"


def _abs(x: str, ct: str) -> str:
    return {"float": f"fabsf({x})", "double": f"fabs({x})", "long long": f"llabs({x})"}.get(
        ct, f"abs({x})" if ct == "int" else x
    )


def _one(ct: str) -> str:
    return "1.0f" if ct == "float" else "1.0"


E = Callable[..., str]
UNARY: dict[Op, E] = {
    Op.NEG: lambda x, ct: f"-{x}",
    Op.ABS: _abs,
    Op.EXP: _fn("exp"),
    Op.EXP2: _fn("exp2"),
    Op.LOG: _fn("log"),
    Op.LOG2: _fn("log2"),
    Op.LOG1P: _fn("log1p"),
    Op.SQRT: lambda x, ct: f"__{'f' if ct == 'float' else 'd'}sqrt_rn({x})",
    Op.RSQRT: _fn("rsqrt"),
    Op.RECIPROCAL: lambda x, ct: f"({_one(ct)} / {x})",
    Op.TANH: _fn("tanh"),
    Op.ERF: _fn("erf"),
    Op.SIGMOID: lambda x, ct: f"({_one(ct)} / ({_one(ct)} + {_fn('exp')(f'-{x}', ct)}))",
    # as the Triton table: where(x > 0, x, 0)
    Op.RELU: lambda x, ct: f"({x} < 0 ? ({ct})0 : {x})",  # NaN stays NaN, as torch.relu
    Op.SIN: _fn("sin"),
    Op.COS: _fn("cos"),
    Op.FLOOR: _fn("floor"),
    Op.CEIL: _fn("ceil"),
    Op.LOGICAL_NOT: lambda x, ct: f"({x} == 0)",
    Op.ISNAN: lambda x, ct: f"({x} != {x})",
}
BINARY: dict[Op, E] = {
    Op.ADD: lambda a, b, ct: f"({a} + {b})",
    Op.SUB: lambda a, b, ct: f"({a} - {b})",
    Op.MUL: lambda a, b, ct: f"({a} * {b})",
    Op.DIV: lambda a, b, ct: (
        f"__{'f' if ct == 'float' else 'd'}div_rn({a}, {b})"
        if ct in ("float", "double")
        else f"({a} / {b})"
    ),
    Op.POW: lambda a, b, ct: (
        f"ipow<{ct}>({a}, {b})"
        if ct in ("int", "long long")
        else f"pow{'f' if ct == 'float' else ''}({a}, {b})"
    ),
    Op.MAXIMUM: lambda a, b, ct: f"max_nan({a}, {b})",
    Op.MINIMUM: lambda a, b, ct: f"min_nan({a}, {b})",
    Op.EQ: lambda a, b, ct: f"({a} == {b})",
    Op.NE: lambda a, b, ct: f"({a} != {b})",
    Op.LT: lambda a, b, ct: f"({a} < {b})",
    Op.LE: lambda a, b, ct: f"({a} <= {b})",
    Op.GT: lambda a, b, ct: f"({a} > {b})",
    Op.GE: lambda a, b, ct: f"({a} >= {b})",
    Op.LOGICAL_AND: lambda a, b, ct: f"({a} && {b})",
    Op.LOGICAL_OR: lambda a, b, ct: f"({a} || {b})",
}
# ops whose 16-bit result must be rounded back to its dtype (the others are exact on
# values that already are 16-bit floats)
ROUNDED = set(UNARY) - {Op.NEG, Op.ABS, Op.RELU, Op.FLOOR, Op.CEIL} | {
    Op.ADD,
    Op.SUB,
    Op.MUL,
    Op.DIV,
    Op.POW,
    Op.WHERE,
}


def render_op(op: Op, args: list[str], ct: str) -> str:
    """`op` applied to C expressions `args`, computing in C type `ct`."""
    if op in UNARY:
        return UNARY[op](*args, ct)
    if op in BINARY:
        return BINARY[op](*args, ct)
    if op == Op.WHERE:
        return f"({args[0]} ? {args[1]} : {args[2]})"
    raise CompileError(f"cannot render {op.value} for cuda")


# -- helpers, emitted into a kernel's source when it uses them ----------------------------
_HELPERS: dict[str, str] = {
    "fp16": r"""
// 16-bit floats travel as their bits; all math on them is done in float32.
struct fp16 { unsigned short bits; };
__device__ __forceinline__ float to_float(fp16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ fp16 to_fp16(float f) {
    fp16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
__device__ __forceinline__ float round_fp16(float f) { return to_float(to_fp16(f)); }""",
    "bf16": r"""
struct bf16 { unsigned short bits; };
__device__ __forceinline__ float to_float(bf16 h) {
    return __uint_as_float(static_cast<unsigned>(h.bits) << 16);
}
__device__ __forceinline__ bf16 to_bf16(float f) {
    bf16 h;  // round to nearest even, NaN stays NaN (sm_80 and newer)
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
__device__ __forceinline__ float round_bf16(float f) { return to_float(to_bf16(f)); }""",
    "pack": r"""
// N consecutive elements moved as one N * sizeof(T)-byte access; the renderer only
// asks for widths the pointer's alignment and the strides allow.
template <int BYTES> struct Word;
template <> struct Word<16> { typedef uint4 type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<4> { typedef unsigned int type; };
template <> struct Word<2> { typedef unsigned short type; };
template <> struct Word<1> { typedef unsigned char type; };

template <int N, typename T>
__device__ __forceinline__ void load_pack(T* dst, const T* src) {
    typedef typename Word<N * sizeof(T)>::type W;
    union { W word; T elems[N]; } u;
    u.word = *reinterpret_cast<const W*>(src);
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k] = u.elems[k];
}

template <int N, typename T>
__device__ __forceinline__ void store_pack(T* dst, const T* src) {
    typedef typename Word<N * sizeof(T)>::type W;
    union { W word; T elems[N]; } u;
#pragma unroll
    for (int k = 0; k < N; ++k) u.elems[k] = src[k];
    *reinterpret_cast<W*>(dst) = u.word;
}""",
    "inf": r"""
#define POS_INF __int_as_float(0x7f800000)
#define NEG_INF __int_as_float(0xff800000)
#define NAN_F __int_as_float(0x7fffffff)""",
    "max_nan": r"""
// max/min that return NaN when either operand is NaN, as torch.maximum/amax do
template <typename T> __device__ __forceinline__ T max_nan(T a, T b) {
    return (a > b || a != a) ? a : b;
}
template <typename T> __device__ __forceinline__ T min_nan(T a, T b) {
    return (a < b || a != a) ? a : b;
}""",
    "reduce_ops": r"""
struct Sum {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
        return max_nan(a, b);
    }
};
struct Min {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const {
        return min_nan(a, b);
    }
};""",
    "warp_reduce": r"""
// Combine x over aligned groups of W lanes (W a power of two up to 32): xor shuffles,
// so every lane of the group ends with the same, deterministic result.
template <int W, typename T, typename F>
__device__ __forceinline__ T warp_reduce(T x, F f) {
#pragma unroll
    for (int o = W / 2; o > 0; o /= 2) x = f(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}""",
    "row_reduce": r"""
// Combine x over the TPR (> 32) consecutive threads of a row: shuffles inside each warp,
// then one value per warp through shared memory, read back by every thread of the row
// in the same order. Every thread of the block must call it (it holds a barrier).
template <int TPR, typename T, typename F>
__device__ __forceinline__ T row_reduce(T x, F f, T* part) {
    constexpr int WARPS = TPR / 32;
    x = warp_reduce<32>(x, f);
    const int first = threadIdx.x / TPR * WARPS;
    if (threadIdx.x % 32 == 0) part[first + threadIdx.x % TPR / 32] = x;
    __syncthreads();
    x = part[first];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) x = f(x, part[first + w]);
    return x;
}""",
    "column_reduce": r"""
// Combine each thread's V column accumulators over the TY thread rows of the block
// (threads with the same threadIdx.x % TPR share columns): a fixed-order tree through
// shared memory, so the sum is deterministic. Thread row 0 ends with the result.
template <int TPR, int TY, int V, typename T, typename F>
__device__ __forceinline__ void column_reduce(T (&acc)[V], F f, T* part) {
    const int tx = threadIdx.x % TPR, ty = threadIdx.x / TPR;
#pragma unroll
    for (int i = 0; i < V; ++i) part[(ty * TPR + tx) * V + i] = acc[i];
    __syncthreads();
#pragma unroll
    for (int half = TY / 2; half > 0; half /= 2) {
        if (ty < half) {
#pragma unroll
            for (int i = 0; i < V; ++i) {
                acc[i] = f(acc[i], part[((ty + half) * TPR + tx) * V + i]);
                part[(ty * TPR + tx) * V + i] = acc[i];
            }
        }
        __syncthreads();
    }
}""",
    "ipow": r"""
// integer a**b as torch computes it: exact, wrapping around in T (pow would go through
// double, whose 53 bits hold no 3**40), by squaring over the bits of b, in unsigned math
// (signed overflow is undefined in C++); a negative b gives 1 for a = 1, +-1 for a = -1
// as b is even or odd, 0 else
template <typename T> __device__ __forceinline__ T ipow(T a, T b) {
    if (b < 0) return a == 1 ? T(1) : a == -1 ? T((b & 1) ? -1 : 1) : T(0);
    unsigned long long r = 1, sq = static_cast<unsigned long long>(a);
    for (; b != 0; b >>= 1) {
        if (b & 1) r *= sq;
        sq *= sq;
    }
    return static_cast<T>(r);
}""",
    "index_error": r"""
// A bad index (fuser/runtime/checks.py); called only for one, so a good index costs its
// compare. The smallest bad element wins: its index keys both 32-bit halves of its
// value, so both minima are its own (an index past 2^31 - 1 is clamped to it). The flag
// is a word of pinned host memory the host reads without synchronizing.
__device__ void index_error(long long* err, long long* flag, long long index,
                            long long value) {
    const long long key = (index < 0x7fffffffLL ? index : 0x7fffffffLL) << 32;
    atomicMin(err, key | (value & 0xffffffffLL));
    atomicMin(err + 1, key | ((value >> 32) & 0xffffffffLL));
    *reinterpret_cast<volatile long long*>(flag) = 1;
}""",
}
HELPERS = {name: text.strip("\n") for name, text in _HELPERS.items()}
# helpers another helper relies on
HELPER_DEPS = {
    "reduce_ops": ["max_nan"],
    "row_reduce": ["warp_reduce"],
    "warp_reduce": ["reduce_ops"],
    "column_reduce": ["reduce_ops"],
}
HELPER_ORDER = [
    "inf",
    "fp16",
    "bf16",
    "pack",
    "max_nan",
    "reduce_ops",
    "warp_reduce",
    "row_reduce",
    "column_reduce",
    "ipow",
    "index_error",
]

# a helper is needed when its marker appears in the kernel body
HELPER_MARKERS = {
    "inf": ("POS_INF", "NEG_INF", "NAN_F"),
    "fp16": ("fp16",),
    "bf16": ("bf16",),
    "pack": ("load_pack<", "store_pack<"),
    "max_nan": ("max_nan(", "min_nan("),
    "reduce_ops": ("Sum()", "Max()", "Min()"),
    "warp_reduce": ("warp_reduce<",),
    "row_reduce": ("row_reduce<",),
    "column_reduce": ("column_reduce<",),
    "ipow": ("ipow<",),
    "index_error": ("index_error(",),
}


def helpers_for(body: str) -> list[str]:
    """The helper snippets `body` uses, in dependency order."""
    need = {name for name, marks in HELPER_MARKERS.items() if any(m in body for m in marks)}
    stack = list(need)
    while stack:
        for dep in HELPER_DEPS.get(stack.pop(), []):
            if dep not in need:
                need.add(dep)
                stack.append(dep)
    return [HELPERS[name] for name in HELPER_ORDER if name in need]
