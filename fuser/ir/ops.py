"""The op enum and its groups. Composites decompose into primitives before scheduling."""

from __future__ import annotations

import enum


class Op(enum.Enum):
    # leaves
    CONST = "const"
    IOTA = "iota"
    # unary
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG2 = "log2"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"
    RELU = "relu"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    LOGICAL_NOT = "logical_not"
    ISNAN = "isnan"
    # binary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    # ternary
    WHERE = "where"
    # type and shape
    CAST = "cast"
    BROADCAST_IN_DIM = "broadcast_in_dim"
    # layout: index maps along one dim, static (fuser/passes/views.py lowers them)
    SLICE = "slice"
    PAD = "pad"
    CAT = "cat"
    # the kernel-level form of a slice or pad along the last dim: a read of a kernel input
    # through out[j] = x[scale * j + offset] for lo <= j < hi (0 elsewhere)
    VIEW = "view"
    # an indexed row read: out[..., :] = table[index[...], :] (embedding, index_select
    # along dim 0); a kernel reads the table at the row its ROW index names
    GATHER_ROWS = "gather_rows"
    # guards: pass a value through, checked (fuser/ir/guards.py)
    CHECK_INDEX = "check_index"
    # reductions
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    # composites
    MEAN = "mean"
    VAR_MEAN = "var_mean"
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    GELU = "gelu"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    SAFE_SOFTMAX = "safe_softmax"
    CROSS_ENTROPY = "cross_entropy"

    def __repr__(self) -> str:
        return f"Op.{self.name}"


LEAF = frozenset({Op.CONST, Op.IOTA})
# unary ops that compute in floating point: an integer operand is promoted to float32
UNARY_FLOAT = frozenset(
    {
        Op.EXP,
        Op.EXP2,
        Op.LOG,
        Op.LOG2,
        Op.LOG1P,
        Op.SQRT,
        Op.RSQRT,
        Op.RECIPROCAL,
        Op.TANH,
        Op.ERF,
        Op.SIGMOID,
        Op.SIN,
        Op.COS,
    }
)
UNARY_SAME = frozenset({Op.NEG, Op.ABS, Op.RELU, Op.FLOOR, Op.CEIL})
UNARY_BOOL = frozenset({Op.LOGICAL_NOT, Op.ISNAN})
UNARY = UNARY_FLOAT | UNARY_SAME | UNARY_BOOL
ARITH = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAXIMUM, Op.MINIMUM})
COMPARE = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
LOGICAL = frozenset({Op.LOGICAL_AND, Op.LOGICAL_OR})
BINARY = ARITH | COMPARE | LOGICAL
TERNARY = frozenset({Op.WHERE})
ELEMENTWISE = UNARY | BINARY | TERNARY | {Op.CAST}
# index maps: a fused kernel reads through them (fuser/passes/views.py)
LAYOUT = frozenset({Op.SLICE, Op.PAD, Op.CAT, Op.VIEW})
MOVEMENT = frozenset({Op.BROADCAST_IN_DIM}) | LAYOUT
# indexed reads: a kernel loads a table input at rows an index input names
INDEXED = frozenset({Op.GATHER_ROWS})
# elementwise identities that check their operand: kept by every pass, fused like a unary op
GUARD = frozenset({Op.CHECK_INDEX})
REDUCE = frozenset({Op.SUM, Op.MAX, Op.MIN})
COMPOSITE = frozenset(
    {
        Op.MEAN,
        Op.VAR_MEAN,
        Op.LAYER_NORM,
        Op.RMS_NORM,
        Op.GELU,
        Op.SOFTMAX,
        Op.LOG_SOFTMAX,
        Op.SAFE_SOFTMAX,
        Op.CROSS_ENTROPY,
    }
)
PRIMITIVE = LEAF | ELEMENTWISE | MOVEMENT | INDEXED | GUARD | REDUCE
