"""The patterns a random fusion is drawn from, and the draft case they grow.

A case lives in a domain D = [rows..., cols]. Every value it computes maps onto D's
axes (`_V.axes`): full tiles, row statistics, column vectors, scalars. Each pattern adds
a few ops over the values made so far (chains, and DAGs where an older value is picked
again); `PATTERN_FNS` names them for the generator (generator.py), which draws the
domain and the sequence of patterns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from hypothesis import strategies as st

from fuser.frontend.registry import BY_NAME, EXPONENT, NONZERO, drawn
from fuser.fuzz.case import LAYOUTS, InputSpec, Ref, Step
from fuser.ir.dtypes import dtype_of, promote

FLOATS = ("float32", "float16", "bfloat16")
# each group's ops, from the frontend op table (fuser/frontend/registry.py) in its order
UNARY = drawn("unary")
BINARY = drawn("binary")
COMPARE = drawn("compare")
LOGICAL = drawn("logical")
REDUCE = drawn("reduce")
COMPOSITE = drawn("composite")
SCALARS = (1.0, 0.5, -1.0, 2.0, 0.0, 3.0, -0.25, 1e-3, 100.0, 1.3, 0.1)


@dataclass
class _V:
    shape: tuple[int, ...]
    axes: tuple[int, ...]  # the domain axis each dim maps onto (strictly increasing)
    dtype: str
    is_input: bool = False
    # a dim's size is not the domain's (a slice on its way to a pad or a cat): never
    # picked as an operand, only as an output
    off_domain: bool = False

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS


@dataclass
class Draft:
    """The case being drawn: its values, steps and inputs so far."""

    draw: Any
    domain: tuple[int, ...]
    vals: list[_V] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    inputs: list[InputSpec] = field(default_factory=list)
    # which sizes every input keeps static: "" (as drawn), "last" or "all" (layout ops
    # need the size of the dim they work along; `static`)
    fixed: str = ""

    @property
    def rank(self) -> int:
        return len(self.domain)

    def full(self) -> tuple[int, ...]:
        return tuple(range(self.rank))

    # -- values -------------------------------------------------------------------
    def emit(self, op: str, args: tuple, kwargs: dict, outs: list[_V]) -> int:
        self.steps.append(Step(op, args, tuple(kwargs.items())))
        self.vals.extend(outs)
        return len(self.vals) - 1

    def new_input(self, axes: tuple[int, ...], dtype: str, ones: tuple[int, ...] = ()) -> int:
        """An input over domain `axes` (sizes 1 at the positions in `ones`)."""
        shape = tuple(1 if i in ones else self.domain[a] for i, a in enumerate(axes))
        layout = self.draw(_layouts)
        symbolic = not self.draw(st.booleans()) and self.fixed != "all"
        self.inputs.append(InputSpec(shape, dtype, layout, symbolic, self.fixed == "last"))
        self.steps.append(Step("input", (len(self.inputs) - 1,)))
        self.vals.append(_V(shape, axes, dtype, is_input=True))
        return len(self.vals) - 1

    def static(self, fixed: str) -> None:
        """Every input, drawn and to come, with static sizes along the last dim ("last")
        or all dims ("all"): a slice, pad or cat needs the size of its dim at compile
        time. Done when the layout pattern runs, so a case whose shrunk form drops it
        gets its symbolic sizes back."""
        if fixed == "all" or not self.fixed:
            self.fixed = fixed
        self.inputs = [
            replace(s, symbolic=s.symbolic and self.fixed != "all", static_last=True)
            for s in self.inputs
        ]

    def pick(self, want_float: bool = True, min_rank: int = 0) -> int | None:
        """A value, usually one of the last few (chains), sometimes any (DAGs)."""
        ok = [
            i
            for i, v in enumerate(self.vals)
            if v.is_float == want_float and len(v.shape) >= min_rank and not v.off_domain
        ]
        if not ok:
            return None
        back = self.draw(st.integers(0, len(ok) - 1))
        if back > 2 and self.draw(st.booleans()):
            back = self.draw(st.integers(0, 2))  # prefer the most recent
        return ok[len(ok) - 1 - min(back, len(ok) - 1)]

    def pick_float(self, min_rank: int = 0) -> int:
        i = self.pick(True, min_rank)
        if i is None:
            i = self.pick(True)
        assert i is not None, "the first input is a float tensor"
        return i

    # -- broadcasting -------------------------------------------------------------
    def _joint(self, idx: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """numpy broadcast of the values' shapes, if it keeps axes meaningful."""
        vs = [self.vals[i] for i in idx if self.vals[i].shape]
        if not vs:  # rank-0 values only
            return (), ()
        rank = max(len(v.shape) for v in vs)
        shape: list[int] = [1] * rank
        axes: list[int | None] = [None] * rank
        for v in vs:
            off = rank - len(v.shape)
            for k, (s, a) in enumerate(zip(v.shape, v.axes)):
                p = off + k
                if axes[p] is not None and s != 1 and shape[p] != 1 and axes[p] != a:
                    return None
                if s != 1:
                    if shape[p] not in (1, s):
                        return None
                    shape[p], axes[p] = s, a
                elif axes[p] is None:
                    axes[p] = a
        if any(a is None for a in axes):
            return None
        if any(x >= y for x, y in zip(axes, axes[1:])):
            return None
        return tuple(shape), tuple(a for a in axes if a is not None)

    def to_domain(self, i: int) -> int:
        v = self.vals[i]
        if v.shape == self.domain or not v.shape:
            return i
        kwargs = {"shape": "domain", "broadcast_dims": v.axes}
        out = _V(self.domain, self.full(), v.dtype)
        return self.emit("broadcast_in_dim", (Ref(i),), kwargs, [out])

    def align(self, idx: list[int]) -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
        """Operands that broadcast together (explicit broadcast_in_dim where numpy's
        trailing-dims rule would mean something else), and their joint shape and axes."""
        joint = self._joint(idx)
        force = self.draw(st.integers(0, 9)) == 0  # sometimes broadcast explicitly anyway
        if joint is None or force:
            idx = [self.to_domain(i) for i in idx]
            joint = self._joint(idx)
            assert joint is not None, "values broadcast to the domain always align"
        return idx, joint[0], joint[1]

    # -- small helpers ------------------------------------------------------------
    def positive(self, i: int) -> int:
        """abs(x) + c: an operand for a restricted domain (log's, a divisor, pow's)."""
        v = self.vals[i]
        if not v.shape:  # exp(tanh(x)): no Python scalar next to a rank-0 tensor (see above)
            t = self.emit("tanh", (Ref(i),), {}, [_V(v.shape, v.axes, v.dtype)])
            return self.emit("exp", (Ref(t),), {}, [_V(v.shape, v.axes, v.dtype)])
        a = self.emit("abs", (Ref(i),), {}, [_V(v.shape, v.axes, v.dtype)])
        c = self.draw(st.sampled_from((0.5, 1.0, 1e-2)))
        return self.emit("add", (Ref(a), c), {}, [_V(v.shape, v.axes, v.dtype)])

    def scalar(self) -> float:
        return self.draw(st.sampled_from(SCALARS))

    def other_dtype(self, dtype: str) -> str:
        return self.draw(st.sampled_from([d for d in FLOATS if d != dtype]))


_layouts = st.sampled_from(LAYOUTS[:1] * 5 + LAYOUTS[1:])


def _promote(dtypes: list[str], scalar_dtypes: list[str] = ()) -> str:
    return promote([dtype_of(d) for d in dtypes], [dtype_of(d) for d in scalar_dtypes]).value


def _binary_dtype(d: Draft, idx: list[int], scalars: int = 0) -> str:
    ts = [d.vals[i].dtype for i in idx if d.vals[i].shape]
    zs = [d.vals[i].dtype for i in idx if not d.vals[i].shape] + ["float32"] * scalars
    return _promote(ts, zs) if ts else _promote(zs)


# -- patterns ---------------------------------------------------------------------------
def _unary(d: Draft) -> None:
    i = d.pick_float()
    op = d.draw(st.sampled_from(UNARY))
    if BY_NAME[op].domains[0].restricted:
        i = d.positive(i)
    v = d.vals[i]
    d.emit(op, (Ref(i),), {}, [_V(v.shape, v.axes, v.dtype)])


def _binary_on(d: Draft, a: int, b: int) -> None:
    op = d.draw(st.sampled_from(BINARY))
    lhs, rhs = BY_NAME[op].domains
    if rhs.restricted:
        b = d.positive(b)
    if lhs.restricted:
        a = d.positive(a)
    # a rank-0 tensor and a tensor: the rank-0 one takes the scalar's part in promotion
    (a, b), shape, axes = d.align([a, b])
    d.emit(op, (Ref(a), Ref(b)), {}, [_V(shape, axes, _binary_dtype(d, [a, b]))])


def _binary(d: Draft) -> None:
    a = d.pick_float()
    b = d.pick_float()
    _binary_on(d, a, b)


def _binary_scalar(d: Draft) -> None:
    a = d.pick_float(min_rank=1)
    v = d.vals[a]
    if not v.shape:  # f16[] * 0.5 is a known promotion gap (the test_ir_ops xfail)
        return _unary(d)
    op = d.draw(st.sampled_from(BINARY))
    rhs = BY_NAME[op].domains[1]
    s = d.scalar()
    if rhs == EXPONENT:  # a power: integer ones of any base, the others of a positive one
        s = d.draw(st.sampled_from((2.0, 3.0, 0.5, -1.0, 1.5)))
        if s not in (2.0, 3.0):
            a = d.positive(a)
    if rhs == NONZERO and s == 0.0:
        s = 4.0
    # the scalar takes the restricted operand's place (a divisor, an exponent)
    args = (Ref(a), s) if d.draw(st.booleans()) or rhs.restricted else (s, Ref(a))
    d.emit(op, args, {}, [_V(v.shape, v.axes, v.dtype)])


def _binary_input(d: Draft) -> None:
    """A value combined with a new input: a bias, a row scale, a full tensor."""
    a = d.pick_float()
    v = d.vals[a]
    n = d.rank
    forms = ["full", "col", "col_kept", "row_kept", "row", "one"]
    form = d.draw(st.sampled_from(forms if n >= 2 else ["full", "col", "one"]))
    dtype = v.dtype if d.draw(st.integers(0, 3)) else d.draw(st.sampled_from(FLOATS))
    if form == "full":
        b = d.new_input(d.full(), dtype)
    elif form == "col":
        b = d.new_input((n - 1,), dtype)
    elif form == "col_kept":
        b = d.new_input(d.full(), dtype, ones=tuple(range(n - 1)))
    elif form == "row_kept":
        b = d.new_input(d.full(), dtype, ones=(n - 1,))
    elif form == "row":
        b = d.new_input(tuple(range(n - 1)), dtype)
    else:
        b = d.new_input((n - 1,), dtype, ones=(0,))
    if d.draw(st.booleans()):
        a, b = b, a
    _binary_on(d, a, b)


def _older(d: Draft) -> None:
    """Join the newest value with an older one: a DAG, not a chain."""
    a = len(d.vals) - 1
    if not d.vals[a].is_float:
        a = d.pick_float()
    floats = [i for i, v in enumerate(d.vals) if v.is_float and not v.off_domain]
    b = floats[d.draw(st.integers(0, len(floats) - 1))]
    _binary_on(d, a, b)


def _reduce_dims(d: Draft, v: _V) -> tuple[int, ...]:
    r = len(v.shape)
    how = d.draw(st.sampled_from(("last", "last", "last", "leading", "all", "one")))
    if how == "last" or r == 1:
        return (r - 1,)
    if how == "leading":
        return tuple(range(r - 1))
    if how == "all":
        return tuple(range(r))
    return (d.draw(st.integers(0, r - 1)),)


def _reduced(v: _V, dims: tuple[int, ...], keep: bool) -> tuple[tuple, tuple]:
    if keep:
        return tuple(1 if k in dims else s for k, s in enumerate(v.shape)), v.axes
    kept = [k for k in range(len(v.shape)) if k not in dims]
    return tuple(v.shape[k] for k in kept), tuple(v.axes[k] for k in kept)


def _reduce(d: Draft) -> None:
    i = d.pick_float(min_rank=1)
    v = d.vals[i]
    if not v.shape:
        return _unary(d)
    dims = _reduce_dims(d, v)
    keep = d.draw(st.booleans())
    op = d.draw(st.sampled_from(REDUCE))
    shape, axes = _reduced(v, dims, keep)
    if op == "var_mean":
        kwargs = {"dims": dims, "correction": d.draw(st.sampled_from((1, 0))), "keepdim": keep}
        outs = [_V(shape, axes, v.dtype), _V(shape, axes, v.dtype)]
        d.emit("var_mean", (Ref(i),), kwargs, outs)
        return
    d.emit(op, (Ref(i),), {"dims": dims, "keepdim": keep}, [_V(shape, axes, v.dtype)])


def _norm(d: Draft) -> None:
    """reduce over the last dim (or the leading ones), broadcast back, combine."""
    i = d.pick_float(min_rank=1)
    v = d.vals[i]
    if not v.shape:
        return _unary(d)
    r = len(v.shape)
    outer = r >= 2 and d.draw(st.integers(0, 3)) == 0
    dims = tuple(range(r - 1)) if outer else (r - 1,)
    op = d.draw(st.sampled_from(("mean", "sum", "max", "min", "var")))
    keep = d.draw(st.booleans())
    shape, axes = _reduced(v, dims, keep)
    if op == "var":
        kwargs = {"dims": dims, "correction": 0, "keepdim": keep}
        s = d.emit("var_mean", (Ref(i),), kwargs, [_V(shape, axes, v.dtype)] * 2) - 1
    else:
        s = d.emit(op, (Ref(i),), {"dims": dims, "keepdim": keep}, [_V(shape, axes, v.dtype)])
    if not keep or d.draw(st.booleans()):
        s = d.to_domain(s)  # broadcast back explicitly
    combine = d.draw(st.sampled_from(("sub", "div", "mul", "add", "rsqrt_mul")))
    if combine == "rsqrt_mul":
        s = d.positive(s)
        sv = d.vals[s]
        s = d.emit("rsqrt", (Ref(s),), {}, [_V(sv.shape, sv.axes, sv.dtype)])
        combine = "mul"
    elif combine == "div":
        s = d.positive(s)
    (a, b), shape, axes = d.align([i, s])
    d.emit(combine, (Ref(a), Ref(b)), {}, [_V(shape, axes, _binary_dtype(d, [a, b]))])


def _inner_outer(d: Draft) -> None:
    """A row statistic combined back into the row (dx-like), and that row, maybe times an
    older value, summed over the leading dims (dw-like): one kernel with row and column
    reductions (the inner-outer scheduler)."""
    i = d.pick_float(min_rank=2)
    v = d.vals[i]
    r = len(v.shape)
    if r < 2:
        return _norm(d)
    op = d.draw(st.sampled_from(("mean", "sum", "max")))
    shape, axes = _reduced(v, (r - 1,), True)
    s = d.emit(op, (Ref(i),), {"dims": (r - 1,), "keepdim": True}, [_V(shape, axes, v.dtype)])
    s = d.to_domain(s)
    combine = d.draw(st.sampled_from(("sub", "mul")))
    (a, b), shape, axes = d.align([i, s])
    y = d.emit(combine, (Ref(a), Ref(b)), {}, [_V(shape, axes, _binary_dtype(d, [a, b]))])
    if d.draw(st.booleans()):  # dw = sum(dy * xhat): the row times another value
        (a, b), shape, axes = d.align([y, d.pick_float(min_rank=2)])
        y = d.emit("mul", (Ref(a), Ref(b)), {}, [_V(shape, axes, _binary_dtype(d, [a, b]))])
    w = d.vals[y]
    lead = tuple(range(len(w.shape) - 1))
    if not lead:
        return None
    cop = d.draw(st.sampled_from(("sum", "sum", "mean", "max")))
    shape, axes = _reduced(w, lead, False)
    d.emit(cop, (Ref(y),), {"dims": lead, "keepdim": False}, [_V(shape, axes, w.dtype)])
    return None


def _compare(d: Draft) -> int:
    a = d.pick_float()
    op = d.draw(st.sampled_from(COMPARE))
    if d.draw(st.booleans()) and d.vals[a].shape:
        v = d.vals[a]
        return d.emit(op, (Ref(a), d.scalar()), {}, [_V(v.shape, v.axes, "bool")])
    b = d.pick_float()
    (a, b), shape, axes = d.align([a, b])
    return d.emit(op, (Ref(a), Ref(b)), {}, [_V(shape, axes, "bool")])


def _where(d: Draft) -> None:
    c = d.pick(want_float=False) if d.draw(st.booleans()) else None
    if c is None:
        c = _compare(d)
    a = d.pick_float()
    if d.draw(st.integers(0, 2)) == 0 and d.vals[a].shape:  # a Python scalar operand
        s = d.draw(st.sampled_from((0.0, -math.inf, 1.0, math.inf, math.nan)))
        (c, a), shape, axes = d.align([c, a])
        args = (Ref(c), Ref(a), s) if d.draw(st.booleans()) else (Ref(c), s, Ref(a))
        dtype = _binary_dtype(d, [a])
    else:
        b = d.pick_float()
        (c, a, b), shape, axes = d.align([c, a, b])
        args = (Ref(c), Ref(a), Ref(b))
        dtype = _binary_dtype(d, [a, b])
    d.emit("where", args, {}, [_V(shape, axes, dtype)])


def _logical(d: Draft) -> None:
    a = _compare(d)
    op = d.draw(st.sampled_from(LOGICAL + ("cast",)))
    v = d.vals[a]
    if op == "cast":  # a count or a mask as numbers, as cross_entropy does
        dtype = d.draw(st.sampled_from(FLOATS))
        d.emit("cast", (Ref(a),), {"dtype": dtype}, [_V(v.shape, v.axes, dtype)])
    elif BY_NAME[op].arity == 2:  # of two comparisons
        b = _compare(d)
        (a, b), shape, axes = d.align([a, b])
        d.emit(op, (Ref(a), Ref(b)), {}, [_V(shape, axes, "bool")])
    elif BY_NAME[op].dtypes == (torch.bool,):  # of the comparison
        d.emit(op, (Ref(a),), {}, [_V(v.shape, v.axes, "bool")])
    else:  # a predicate of a float value
        x = d.pick_float()
        xv = d.vals[x]
        d.emit(op, (Ref(x),), {}, [_V(xv.shape, xv.axes, "bool")])


def _cast(d: Draft) -> None:
    i = d.pick_float()
    v = d.vals[i]
    to = d.other_dtype(v.dtype)
    j = d.emit("cast", (Ref(i),), {"dtype": to}, [_V(v.shape, v.axes, to)])
    if d.draw(st.booleans()):  # a round trip: float(half(x)) rounds, it is no identity
        d.emit("cast", (Ref(j),), {"dtype": v.dtype}, [_V(v.shape, v.axes, v.dtype)])


def _composite(d: Draft) -> None:
    i = d.pick_float(min_rank=1)
    v = d.vals[i]
    if not v.shape:
        return _unary(d)
    op = d.draw(st.sampled_from(COMPOSITE))
    same = [_V(v.shape, v.axes, v.dtype)]
    if op in ("softmax", "log_softmax", "safe_softmax"):
        dim = -1 if d.draw(st.integers(0, 3)) else d.draw(st.integers(0, len(v.shape) - 1))
        d.emit(op, (Ref(i),), {"dim": dim}, same)
    elif op == "gelu":
        d.emit(op, (Ref(i),), {"approximate": d.draw(st.sampled_from(("none", "tanh")))}, same)
    else:
        last = (v.axes[-1],)
        kwargs: dict[str, Any] = {}
        for p in BY_NAME[op].params:
            if d.draw(st.booleans()):
                kwargs[p] = Ref(d.new_input(last, v.dtype, ones=(0,) if v.shape[-1] == 1 else ()))
        if op == "layer_norm" and d.draw(st.integers(0, 3)) == 0:
            kwargs["return_mean_rstd"] = True
            stat_shape = v.shape[:-1] + (1,)
            stat = _V(stat_shape, v.axes, "float64" if v.dtype == "float64" else "float32")
            same = same + [stat, stat]
        args = (Ref(i),)
        d.steps.append(Step(op, args, tuple(kwargs.items())))
        d.vals.extend(same)


# -- layout: slices, pads and cats that map back onto the domain ------------------------
# each keeps the width of the dim it works along, so its result is a value of the domain
# again (a rotary embedding's rotate_half, its backward's pads)
# an op between a slice and its pad or cat; exp, cos and + c are not 0 at 0, so a kernel
# that computes a column from the wrong source column shows even where a pad's zeros go
BETWEEN = ("none", "neg", "exp", "mul", "cos", "add", "sin")


def _resized(d: Draft, v: _V, dim: int, size: int) -> _V:
    shape = list(v.shape)
    shape[dim % len(shape)] = size
    return _V(tuple(shape), v.axes, v.dtype, off_domain=tuple(shape) != d.domain)


def _slice_of(d: Draft, i: int, dim: int, start: int, stop: int, step: int = 1) -> int:
    args = (Ref(i), dim, start, stop) + ((step,) if step != 1 else ())
    out = _resized(d, d.vals[i], dim, len(range(start, stop, step)))
    return d.emit("slice", args, {}, [out])


def _pad_of(d: Draft, i: int, dim: int, lo: int, hi: int) -> int:
    v = d.vals[i]
    out = _resized(d, v, dim, lo + v.shape[dim % len(v.shape)] + hi)
    return d.emit("pad", (Ref(i), dim, lo, hi), {}, [out])


def _cat_of(d: Draft, idx: list[int], dim: int) -> int:
    v = d.vals[idx[0]]
    size = sum(d.vals[i].shape[dim % len(v.shape)] for i in idx)
    return d.emit("cat", (tuple(Ref(i) for i in idx), dim), {}, [_resized(d, v, dim, size)])


def _between(d: Draft, i: int, ops: tuple[str, ...] = BETWEEN) -> int:
    """Maybe an elementwise op on a slice before it is padded or joined."""
    op = d.draw(st.sampled_from(ops))
    v = d.vals[i]
    out = [_V(v.shape, v.axes, v.dtype, off_domain=v.off_domain)]
    if op == "none":
        return i
    if op in ("mul", "add"):
        c = d.draw(st.sampled_from((2.0, -0.5, 3.0) if op == "mul" else (1.0, -0.5)))
        return d.emit(op, (Ref(i), c), {}, out)
    return d.emit(op, (Ref(i),), {}, out)


def _domain_value(d: Draft, dtype: str | None = None) -> int:
    """A float value over the whole domain (a picked one, broadcast out if it is not),
    in `dtype` if given (a cat's pieces share one)."""
    i = d.pick_float(min_rank=1)
    if not d.vals[i].shape:
        i = 0  # the first input: a float over the domain
    i = d.to_domain(i)
    v = d.vals[i]
    if dtype is not None and v.dtype != dtype:
        i = d.emit("cast", (Ref(i),), {"dtype": dtype}, [_V(v.shape, v.axes, dtype)])
    return i


def _source(d: Draft) -> int:
    """The value a layout form reads: a picked one broadcast to the domain, or now and
    then, as a rotary embedding's cos and sin [T, D] over [B, T, D], a new input over
    the trailing axes, maybe through an op before its broadcast (the op's kernel then
    reads the input through the index map on its own, and its result is broadcast)."""
    if d.rank >= 3 and d.draw(st.integers(0, 2)) == 0:
        i = d.new_input(tuple(range(1, d.rank)), d.draw(st.sampled_from(FLOATS)))
        return d.to_domain(_between(d, i))
    return _domain_value(d)


def _shift_left(d: Draft, x: int, dim: int, n: int) -> None:
    k = d.draw(st.integers(1, n - 1))
    _pad_of(d, _between(d, _slice_of(d, x, dim, k, n)), dim, 0, k)


def _shift_right(d: Draft, x: int, dim: int, n: int) -> None:
    k = d.draw(st.integers(1, n - 1))
    _pad_of(d, _between(d, _slice_of(d, x, dim, 0, n - k)), dim, k, 0)


def _rotate(d: Draft, x: int, dim: int, n: int) -> None:
    """rotate_half: cat(-x[h:], x[:h]), at the half or anywhere."""
    h = d.draw(st.just(n // 2) | st.integers(1, n - 1))
    upper = _between(d, _slice_of(d, x, dim, h, n), ("neg", *BETWEEN))
    lower = _between(d, _slice_of(d, x, dim, 0, h))
    _cat_of(d, [upper, lower], dim)


def _halves(d: Draft, x: int, dim: int, n: int) -> None:
    """x's columns up to h, another value's after: a splice of two values."""
    h = d.draw(st.integers(1, n - 1))
    y = x if d.draw(st.booleans()) else _domain_value(d, d.vals[x].dtype)
    first = _between(d, _slice_of(d, x, dim, 0, h))
    _cat_of(d, [first, _between(d, _slice_of(d, y, dim, h, n))], dim)


def _window(d: Draft, x: int, dim: int, n: int) -> None:
    """Any run of columns, moved anywhere, zeros around it."""
    w = d.draw(st.integers(1, n - 1))
    start = d.draw(st.integers(0, n - w))
    lo = d.draw(st.integers(0, n - w))
    _pad_of(d, _between(d, _slice_of(d, x, dim, start, start + w)), dim, lo, n - w - lo)


def _deinterleave(d: Draft, x: int, dim: int, n: int) -> None:
    """The even columns, then the odd ones (or the other way round): step-2 slices."""
    pieces = [_between(d, _slice_of(d, x, dim, s, n, 2)) for s in (0, 1)]
    if d.draw(st.booleans()):
        pieces.reverse()
    _cat_of(d, pieces, dim)


def _stride_pad(d: Draft, x: int, dim: int, n: int) -> None:
    """Every second or third column, padded back to the width."""
    start = d.draw(st.integers(0, 1))
    step = d.draw(st.sampled_from((2, 3)))
    w = len(range(start, n, step))
    lo = d.draw(st.integers(0, n - w))
    _pad_of(d, _between(d, _slice_of(d, x, dim, start, n, step)), dim, lo, n - w - lo)


def _blocks(d: Draft, x: int, dim: int, n: int) -> None:
    """Three runs of columns in another order."""
    a = d.draw(st.integers(1, n - 2))
    b = d.draw(st.integers(a + 1, n - 1))
    order = d.draw(st.permutations([(0, a), (a, b), (b, n)]))
    _cat_of(d, [_between(d, _slice_of(d, x, dim, lo, hi)) for lo, hi in order], dim)


# the forms along the last dim, simplest first: (least width, the form)
LAST_DIM = {
    "shift_left": (2, _shift_left),
    "shift_right": (2, _shift_right),
    "rotate": (2, _rotate),
    "halves": (2, _halves),
    "window": (2, _window),
    "deinterleave": (2, _deinterleave),
    "stride_pad": (2, _stride_pad),
    "blocks": (3, _blocks),
}
LAYOUT_FORMS = (*LAST_DIM, "leading")  # and a leading dim's, left to ATen


def _layout(d: Draft) -> None:
    """Slices, pads and cats that keep a value's width: along the last dim (the kernels
    read them through index maps, fuser/passes/views.py), or now and then along a
    leading one (left to ATen). Inputs become static along the dims these ops need."""
    form = d.draw(st.sampled_from(LAYOUT_FORMS))
    if form == "leading":
        return _layout_leading(d)
    least, fn = LAST_DIM[form]
    n = d.domain[-1]
    if n < least:
        return _unary(d)
    d.static("last")
    x = _source(d)
    fn(d, x, d.draw(st.sampled_from((d.rank - 1, -1))), n)
    return None


def _layout_leading(d: Draft) -> None:
    dims = [k for k in range(d.rank - 1) if d.domain[k] >= 2]
    if not dims:
        return _unary(d)
    d.static("all")
    dim = d.draw(st.sampled_from(dims))
    fn = d.draw(st.sampled_from((_shift_left, _shift_right, _rotate)))
    fn(d, _domain_value(d), dim, d.domain[dim])
    return None


PATTERN_FNS = {
    "skip": lambda d: None,
    "unary": _unary,
    "binary": _binary,
    "binary_scalar": _binary_scalar,
    "binary_input": _binary_input,
    "older": _older,
    "norm": _norm,
    "inner_outer": _inner_outer,
    "reduce": _reduce,
    "where": _where,
    "logical": _logical,
    "cast": _cast,
    "composite": _composite,
    "layout": _layout,
}
