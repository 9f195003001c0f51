"""Online max-and-sum: a row max and a sum of exp(x - max) computed in one pass.

A looped kernel walks a row once per reduction round. Softmax, log_softmax and
cross-entropy reduce M = max(X) in one round and S = sum(exp(c * (X - M))) in the next,
so the row is read twice before the output pass. Both fit in one pass: each lane keeps a
running max m and a running sum s of exp(c * (x - m)), and rescales s by
exp(c * (m_old - m_new)) when its max grows; at the end the lanes combine as
M = max(m_l), S = sum(s_l * exp(c * (m_l - M))). Every exponent is <= 0, so nothing
overflows that the two-pass form does not.

Eager's S is NaN exactly when M is not finite (all -inf: -inf - -inf; a +inf: inf - inf;
a NaN anywhere), so the renderers set S to NaN there. A lane updates with one exp of
c * -|x - m|, with 0 in place of an m that is not finite (-inf before the lane meets a
value): a -inf element adds exp(-inf) = 0, and no -inf - -inf is computed for it (a +inf
or NaN m makes S NaN whatever the lane adds).

This module finds such pairs in a KernelSpec and plans which reduction rounds share a
pass over the row; fuser/codegen/{triton,cuda}/kernels.py render them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fuser.ir.dtypes import DType
from fuser.ir.graph import Node, Value
from fuser.ir.ops import Op
from fuser.schedulers.spec import KernelSpec
from fuser.segmenter import Kind

# float -> the dtypes it converts to exactly
_EXACT_WIDENING = {
    DType.float16: {DType.float16, DType.float32, DType.float64},
    DType.bfloat16: {DType.bfloat16, DType.float32, DType.float64},
    DType.float32: {DType.float32, DType.float64},
    DType.float64: {DType.float64},
}
# the dtype a max over values of a dtype accumulates in (as the renderers do)
_ACC = {
    DType.float16: DType.float32,
    DType.bfloat16: DType.float32,
    DType.float32: DType.float32,
    DType.float64: DType.float64,
}


@dataclass(frozen=True)
class OnlinePair:
    """M = max(X) (`max`) and S = sum(exp_op(scale * (X - M))) (`sum`), one pass."""

    max: Node
    sum: Node
    exp: Op  # Op.EXP or Op.EXP2
    scale: float  # c > 0

    @property
    def x(self) -> Value:
        return self.max.inputs[0]

    def describe(self) -> str:
        fn = "exp" if self.exp == Op.EXP else "exp2"
        c = "" if self.scale == 1.0 else f"{self.scale:g} * "
        m, total = self.max.out.name, self.sum.out.name
        return f"{m} = max({self.x.name}), {total} = sum({fn}({c}(x - {m})))"


@dataclass(frozen=True)
class LoopedPlan:
    """The passes over the row of a looped kernel: the reduction rounds each computes and
    the online pairs among its reductions."""

    passes: tuple[tuple[int, ...], ...]
    pairs: tuple[OnlinePair, ...]
    output_pass: bool

    def pairs_in(self, rounds: tuple[int, ...], spec: KernelSpec) -> list[OnlinePair]:
        return [p for p in self.pairs if spec.depth[p.sum.out.id] in rounds]

    def reductions(self, rounds: tuple[int, ...], spec: KernelSpec) -> list[Node]:
        """The plain reductions of a pass (the online pairs' max and sum excluded)."""
        paired = {id(p.max) for p in self.pairs} | {id(p.sum) for p in self.pairs}
        return [
            n for n in spec.reductions if spec.depth[n.out.id] in rounds and id(n) not in paired
        ]

    @property
    def count(self) -> int:
        return len(self.passes) + self.output_pass

    def reason(self, spec: KernelSpec) -> str | None:
        """The schedule reason, when the pairs save passes."""
        if not self.pairs:
            return None
        plain = spec.rounds + self.output_pass
        what = "; ".join(p.describe() for p in self.pairs)
        return (
            f"online max-and-sum: {self.count} passes over the row instead of {plain} "
            f"({what}: a running max and a rescaled running sum per lane)"
        )


def _const(spec: KernelSpec, prod: dict[int, Node], v: Value) -> float | None:
    n = prod.get(v.id)
    if n is None or n.op != Op.CONST:
        return None
    try:
        return float(n.attr("value"))
    except (TypeError, ValueError):
        return None


def _strip(prod: dict[int, Node], v: Value, broadcasts: bool) -> Value:
    """`v` without exact widening casts (and broadcasts, when asked) in front of it."""
    while True:
        n = prod.get(v.id)
        if n is None:
            return v
        src = n.inputs[0] if n.inputs else None
        exact = src is not None and n.out.dtype in _EXACT_WIDENING.get(src.dtype, ())
        if n.op == Op.CAST and exact:
            v = src
        elif broadcasts and n.op == Op.BROADCAST_IN_DIM:
            v = src
        else:
            return v


def match_pair(spec: KernelSpec, sum_node: Node, maxes: dict[int, Node]) -> OnlinePair | None:
    """The online pair `sum_node` closes, if its operand is exp(c * (X - M)) for one of
    `maxes` (M's value id -> its max node) over the same X."""
    prod = spec.producers
    v = _strip(prod, sum_node.inputs[0], broadcasts=False)
    n = prod.get(v.id)
    if n is None or n.op not in (Op.EXP, Op.EXP2):
        return None
    dtype = n.out.dtype
    if dtype not in (DType.float32, DType.float64):
        return None
    exp, scale, v = n.op, 1.0, n.inputs[0]
    while True:  # the constant factors: (X - M) * c, c * (X - M), (X - M) / c
        n = prod.get(v.id)
        if n is None or n.out.dtype != dtype:
            return None
        if n.op == Op.MUL:
            a, b = (_const(spec, prod, x) for x in n.inputs)
            c, v = (a, n.inputs[1]) if a is not None else (b, n.inputs[0])
        elif n.op == Op.DIV:
            c = _const(spec, prod, n.inputs[1])
            c = None if not c else 1.0 / c
            v = n.inputs[0]
        else:
            break
        if c is None or not (0 < c < math.inf):
            return None
        scale *= c
    if n.op != Op.SUB:
        return None
    m = maxes.get(_strip(prod, n.inputs[1], broadcasts=True).id)
    if m is None:
        return None
    x = m.inputs[0]
    if spec.kinds.get(x.id) != Kind.FULL or _ACC.get(x.dtype) != dtype:
        return None
    if _strip(prod, n.inputs[0], broadcasts=False).id != _strip(prod, x, broadcasts=False).id:
        return None
    if spec.kinds.get(n.inputs[0].id) != Kind.FULL:
        return None
    return OnlinePair(m, sum_node, exp, scale)


def looped_plan(spec: KernelSpec) -> LoopedPlan:
    """Which rounds share a pass: round r + 1 joins round r's pass when each of its
    reductions is a sum that pairs with a max of round r."""
    by_round: dict[int, list[Node]] = {}
    for n in spec.reductions:
        by_round.setdefault(spec.depth[n.out.id], []).append(n)
    passes: list[tuple[int, ...]] = []
    pairs: list[OnlinePair] = []
    r = 1
    while r <= spec.rounds:
        here = by_round.get(r, [])
        maxes = {
            n.out.id: n for n in here if n.op == Op.MAX and n.inputs[0].dtype in _EXACT_WIDENING
        }
        nxt = by_round.get(r + 1, [])
        found = [match_pair(spec, n, maxes) if n.op == Op.SUM else None for n in nxt]
        if nxt and maxes and all(found):
            passes.append((r, r + 1))
            pairs += [p for p in found if p is not None]
            r += 2
        else:
            passes.append((r,))
            r += 1
    output_pass = any(a.kind in (Kind.FULL, Kind.COL) for a in spec.outputs)
    return LoopedPlan(tuple(passes), tuple(pairs), output_pass)
