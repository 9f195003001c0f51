"""The frontend op table: one entry per `fd.ops` method that computes on values.

Each `OpEntry` says, for one element-wise, reduction or composite op of `fd.ops`: the IR op
it adds, the torch function that computes the same thing (called as `fd.ops.<name>` is,
on tensors), where its operands' random values must lie (`Domain`, one per tensor
operand), the operand dtypes it is checked in, the claimed ATen ops and the OpInfos of
PyTorch's op_db that reach it through `torch.compile`, and which of the fuzzer's op groups
draws it. Who reads it:

- the fuzzer (fuser/fuzz/patterns.py) draws each pattern's ops from `drawn(group)` and
  gives an operand with a restricted domain abs(x) + c (positive, so never zero);
  its checker (fuser/fuzz/reference.py) reads `error`, how a GPU's version of the op errs;
- the op_db pass (fuser/opdb/claims.py) runs an entry's OpInfos for its `aten` ops
  (x.double() is _to_copy; relu's gradient is threshold_backward);
- the tests: tests/op_registry.py builds its per-op samples from the entries (their data
  from `random_operands`), tests/test_numerics.py takes its row ops by `kind`, and
  tests/test_op_table.py runs every entry's kernels against its reference and checks the
  table against fd.ops and op_db.

Order matters: the fuzzer draws a group's ops in table order and hypothesis shrinks toward
the first, so the simplest come first within a group.

The reference evaluator (fuser/ir/evaluate.py) keeps its own Op -> ATen table on purpose:
the references here are what tests check it against. The fd.ops methods that move, index
or check values (`STRUCTURAL`) take sizes and index maps rather than data with a domain;
tests/op_registry.py has a sample of each (tests/test_embedding.py of embedding and
index_select, gather_rows by other names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fuser.ir.ops import Op

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
I32, I64, BOOL = torch.int32, torch.int64, torch.bool
FLOATS = (F32, F16, BF16)
INTS = (I32, I64)

# normalization: a row reduced and combined back into it (softmax, the norms)
KINDS = ("elementwise", "reduction", "normalization", "loss")
# how a GPU's version of an op errs, for the fuzz checker's allowance: a few ulps of the
# result (relative), of 1 near the result's zeros (absolute: log(1 + tiny) through an
# approximate log2, erf), or of the argument too (argument: sin(1e30) is anyone's guess)
ERRORS = ("relative", "absolute", "argument")


@dataclass(frozen=True)
class Domain:
    """Where an operand's random values lie (`random_operand` draws them).

    normal: normal floats times `scale`, integers in +-[1, 9], random booleans;
    positive: floats in [0.25, 4.25), integers in [1, 9] (log, sqrt);
    nonzero: as normal (a normal float is never 0, the integers skip it) (divisors);
    exponent: normal floats, integers in [1, 3] (torch refuses negative integer powers);
    nan: normal floats, NaN at about 30% of the positions (isnan);
    ties: normal, but equal to the first operand at about half the positions, so
    eq/ne/le/ge see both outcomes;
    shifted: normal floats times `scale` plus 3: a row's mean and spread matter (norms);
    mask: random booleans whatever dtype is checked (where's condition);
    target: int64 class ids into the first operand's last dim, every third row ignored
    (-100) (cross_entropy).
    """

    kind: str
    scale: float = 1.0

    @property
    def restricted(self) -> bool:
        """The op is undefined or ill-conditioned outside: the fuzzer feeds abs(x) + c."""
        return self.kind in ("positive", "nonzero", "exponent")


ANY = Domain("normal")
WIDE = Domain("normal", 4.0)  # sin and cos over several periods, floor over several integers
PEAKED = Domain("normal", 3.0)  # gelu's tails, softmax's peaks
POSITIVE = Domain("positive")
NONZERO = Domain("nonzero")
EXPONENT = Domain("exponent")
NAN = Domain("nan")
TIES = Domain("ties")
SHIFTED = Domain("shifted", 2.0)
MASK = Domain("mask")
TARGET = Domain("target")


@dataclass(frozen=True, eq=False)
class OpEntry:
    """One op of fd.ops (see the module docstring for who reads which field)."""

    name: str  # the fd.ops method
    op: Op  # the IR op it adds
    kind: str  # one of KINDS
    reference: Callable[..., Any]  # torch, called as fd.ops.<name> is, on tensors
    domains: tuple[Domain, ...]  # one per tensor operand
    dtypes: tuple[torch.dtype, ...]  # operand dtypes checked against the reference
    outputs: int = 1
    # optional keyword tensors over the last dim (a norm's weight and bias)
    params: tuple[str, ...] = ()
    # the keyword arguments its checks call it with
    calls: tuple[dict[str, Any], ...] = ({},)
    # OpInfos of op_db that exercise this op through torch.compile, and the claimed ATen
    # ops (base names) each of them exercises (a backward one through its gradients)
    aten: tuple[str, ...] = ()
    opdb: tuple[str, ...] = ()
    fuzz: str | None = None  # the fuzzer's op group that draws it (None: not drawn)
    weight: int = 1  # its share of the group's draws
    error: str = "relative"  # one of ERRORS

    @property
    def arity(self) -> int:
        return len(self.domains)


# -- references: torch, with fd.ops's signatures ------------------------------------------
def _dims(dims: Any, dim: Any) -> list[int]:
    d = dims if dims is not None else dim
    return [d] if isinstance(d, int) else list(d)


def _reduction(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def ref(x: torch.Tensor, dims: Any = None, keepdim: bool = False, *, dim: Any = None) -> Any:
        return fn(x, _dims(dims, dim), keepdim=keepdim)

    return ref


def _var_mean(
    x: torch.Tensor,
    dims: Any = None,
    correction: int = 1,
    keepdim: bool = False,
    *,
    dim: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, _dims(dims, dim), correction=correction, keepdim=keepdim)


def _acc(x: torch.Tensor) -> torch.Tensor:
    """x in the dtype ATen accumulates it in: float64 stays, the rest go to float32."""
    return x if x.dtype == torch.float64 else x.float()


def _layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    return_mean_rstd: bool = False,
) -> Any:
    y = F.layer_norm(x, x.shape[-1:], weight, bias, eps=eps)
    if not return_mean_rstd:
        return y
    # mean and rstd in float32 for half inputs, as nvFuser and CUDA ATen give them
    xf = _acc(x)
    mean = xf.mean(-1, keepdim=True)
    return y, mean, torch.rsqrt(xf.var(-1, correction=0, keepdim=True) + eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> Any:
    return F.rms_norm(x, x.shape[-1:], weight, eps=eps)


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> Any:
    loss = F.cross_entropy(_acc(logits), target.long(), ignore_index=ignore_index)
    return loss.to(logits.dtype)


# -- the table --------------------------------------------------------------------------------
def _entry(
    name: str, kind: str, reference: Callable, domains: tuple, dtypes: tuple, **kw: Any
) -> OpEntry:
    """An entry for the IR op of the same name; its own ATen op and OpInfo unless given."""
    kw = {"aten": (name,), "opdb": (name,), **kw}
    return OpEntry(name, Op(name), kind, reference, domains, dtypes, **kw)


def _unary(name: str, domain: Domain = ANY, dtypes: tuple = FLOATS + (I32,), **kw: Any) -> OpEntry:
    # integer operands of the float ops promote to float32, as in torch
    kw = {"fuzz": "unary", **kw}
    return _entry(name, "elementwise", getattr(torch, name), (domain,), dtypes, **kw)


def _binary(name: str, fuzz: str, domains: tuple = (ANY, ANY), dtypes: tuple = FLOATS + INTS):
    return _entry(name, "elementwise", getattr(torch, name), domains, dtypes, fuzz=fuzz)


def _reduce(name: str, fn: Callable, dtypes: tuple, aten: str) -> OpEntry:
    calls = ({"dims": [-1]}, {"dims": [0], "keepdim": True})
    kw = {"calls": calls, "aten": (aten,), "opdb": (aten,), "fuzz": "reduce"}
    return _entry(name, "reduction", _reduction(fn), (ANY,), dtypes, **kw)


def _softmax(name: str, fn: Callable) -> OpEntry:
    return _entry(
        name,
        "normalization",
        lambda x, dim=-1: fn(x, dim),
        (PEAKED,),
        FLOATS,
        calls=({"dim": -1}, {"dim": 0}),
        aten=(f"_{name}", f"_{name}_backward_data"),
        fuzz="composite",
    )


ENTRIES: tuple[OpEntry, ...] = (
    # unary, in the fuzzer's order: any operand, a positive one, the step functions
    _unary("neg", dtypes=FLOATS + INTS),
    _unary("abs", dtypes=FLOATS + INTS),
    # relu's gradient is threshold_backward
    _unary(
        "relu",
        dtypes=FLOATS + INTS,
        aten=("relu", "threshold_backward"),
        opdb=("nn.functional.relu",),
    ),
    _unary("exp"),
    _unary("tanh"),
    _unary("sigmoid"),
    _unary("erf", error="absolute"),
    _unary("sin", WIDE, error="argument"),
    _unary("cos", WIDE, error="argument"),
    _unary("exp2"),
    _unary("log", POSITIVE, error="absolute"),
    _unary("sqrt", POSITIVE),
    _unary("rsqrt", POSITIVE),
    _unary("reciprocal", POSITIVE),
    _unary("log2", POSITIVE, error="absolute"),
    _unary("log1p", POSITIVE, error="absolute"),
    _unary("floor", WIDE, FLOATS),
    _unary("ceil", WIDE, FLOATS),
    # binary
    _binary("add", "binary"),
    _binary("sub", "binary"),
    _binary("mul", "binary"),
    _binary("maximum", "binary"),
    _binary("minimum", "binary"),
    _binary("div", "binary", (ANY, NONZERO)),  # true division: integers give float32
    _binary("pow", "binary", (POSITIVE, EXPONENT)),
    *(_binary(n, "compare", (ANY, TIES)) for n in ("gt", "lt", "ge", "le", "eq", "ne")),
    # logical: of comparisons, and of a float value (isnan)
    _binary("logical_and", "logical", dtypes=(BOOL,)),
    _binary("logical_or", "logical", dtypes=(BOOL,)),
    _unary("logical_not", dtypes=(BOOL,), fuzz="logical"),
    _unary("isnan", NAN, FLOATS, fuzz="logical"),
    _entry("where", "elementwise", torch.where, (MASK, ANY, ANY), FLOATS + INTS, fuzz="where"),
    # scaled so that truncation to integers keeps a spread of values; x.double() is _to_copy
    _entry(
        "cast",
        "elementwise",
        lambda x, dtype: x.to(dtype),
        (Domain("normal", 8.0),),
        FLOATS + INTS + (BOOL,),
        calls=({"dtype": F16}, {"dtype": F32}, {"dtype": I32}),
        aten=("_to_copy",),
        opdb=("to", "double", "float", "half", "bfloat16"),
        fuzz="cast",
    ),
    # reductions
    _reduce("sum", torch.sum, FLOATS + INTS + (BOOL,), "sum"),
    _reduce("max", torch.amax, FLOATS + INTS, "amax"),
    _reduce("min", torch.amin, FLOATS + INTS, "amin"),
    _reduce("mean", torch.mean, FLOATS, "mean"),
    _entry(
        "var_mean",
        "reduction",
        _var_mean,
        (ANY,),
        FLOATS,
        outputs=2,
        calls=({"dims": [-1], "correction": 0}, {"dims": [0], "keepdim": True}),
        fuzz="reduce",
    ),
    # composites, in the fuzzer's order
    _softmax("softmax", torch.softmax),
    _entry(
        "layer_norm",
        "normalization",
        _layer_norm,
        (SHIFTED,),
        FLOATS,
        params=("weight", "bias"),
        calls=({}, {"eps": 1e-3, "return_mean_rstd": True}),
        aten=("native_layer_norm", "native_layer_norm_backward"),
        opdb=("nn.functional.layer_norm",),
        fuzz="composite",
    ),
    _entry(
        "gelu",
        "elementwise",
        lambda x, approximate="none": F.gelu(x, approximate=approximate),
        (PEAKED,),
        FLOATS,
        calls=({}, {"approximate": "tanh"}),
        aten=("gelu", "gelu_backward"),
        opdb=("nn.functional.gelu",),
        fuzz="composite",
    ),
    _softmax("log_softmax", torch.log_softmax),
    _entry(
        "rms_norm",
        "normalization",
        _rms_norm,
        (SHIFTED,),
        FLOATS,
        params=("weight",),
        calls=({}, {"eps": 1e-5}),
        aten=("_fused_rms_norm", "_fused_rms_norm_backward"),
        opdb=("nn.functional.rms_norm",),
        fuzz="composite",
    ),
    # last of the composites: the fuzzer's draws of the others stay as they were
    _entry(
        "safe_softmax",
        "normalization",
        lambda x, dim=-1: torch.ops.aten._safe_softmax(x, dim),
        (PEAKED,),
        FLOATS,
        calls=({"dim": -1}, {"dim": 0}),
        # its gradient is softmax's (_softmax_backward_data of its result): compared too
        aten=("_safe_softmax", "_softmax_backward_data"),
        opdb=("torch.ops.aten._safe_softmax.default",),
        fuzz="composite",
    ),
    _entry(
        "cross_entropy",
        "loss",
        _cross_entropy,
        (PEAKED, TARGET),
        FLOATS,
        opdb=("nn.functional.cross_entropy",),
    ),
)
BY_NAME: dict[str, OpEntry] = {e.name: e for e in ENTRIES}
BY_OP: dict[Op, OpEntry] = {e.op: e for e in ENTRIES}

# fd.ops methods that move, index or check values: no entries (see the module docstring)
STRUCTURAL = frozenset(
    {
        "broadcast_in_dim",
        "slice",
        "pad",
        "cat",
        "view",
        "iota",
        "check_index",
        "gather_rows",
        "embedding",  # gather_rows by torch's name (tests/test_embedding.py)
        "index_select",  # gather_rows along dim 0 (tests/test_embedding.py)
    }
)


def drawn(group: str) -> tuple[str, ...]:
    """The ops the fuzzer's `group` draws from, in table order, each `weight` times."""
    return tuple(e.name for e in ENTRIES if e.fuzz == group for _ in range(e.weight))


def entries(kind: str | None = None, *, ops: frozenset[Op] | None = None) -> list[OpEntry]:
    """The entries of `kind` (or all), of IR ops among `ops` (or any), in table order."""
    return [e for e in ENTRIES if kind in (None, e.kind) and (ops is None or e.op in ops)]


# -- random operands --------------------------------------------------------------------------
def randn(shape: Sequence[int], dtype: torch.dtype, g: torch.Generator, scale: float = 1.0) -> Any:
    """Normal floats (never exactly zero in practice); ints in [-9, 9] without 0; random bools."""
    shape = tuple(shape)
    if dtype == BOOL:
        return torch.randn(shape, generator=g) > 0
    if not dtype.is_floating_point:
        mag = torch.randint(1, 10, shape, generator=g)
        sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1, 1)
        return (mag * sign).to(dtype)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def positive(shape: Sequence[int], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Floats in [0.25, 4.25) (log, sqrt, rsqrt, pow bases); ints in [1, 9]."""
    shape = tuple(shape)
    if not dtype.is_floating_point:
        return torch.randint(1, 10, shape, generator=g).to(dtype)
    return (torch.rand(shape, generator=g) * 4 + 0.25).to(dtype)


def class_ids(
    shape: Sequence[int], g: torch.Generator, ignore_index: int = -100, dtype: torch.dtype = I64
) -> torch.Tensor:
    """Class ids for [rows, classes] logits; every third row (row 0 first) is ignored."""
    rows, classes = shape
    t = torch.randint(0, classes, (rows,), generator=g)
    t[::3] = ignore_index
    return t.to(dtype)


def random_operand(
    domain: Domain,
    shape: Sequence[int],
    dtype: torch.dtype,
    g: torch.Generator,
    first: torch.Tensor | None = None,
) -> torch.Tensor:
    """Random values of `domain` (`first`: the op's first operand, for ties and targets)."""
    kind, shape = domain.kind, tuple(shape)
    if kind in ("normal", "nonzero"):
        return randn(shape, dtype, g, domain.scale)
    if kind == "positive":
        return positive(shape, dtype, g)
    if kind == "exponent":
        if dtype.is_floating_point:
            return randn(shape, dtype, g)
        return torch.randint(1, 4, shape, generator=g).to(dtype)
    if kind == "nan":
        x = randn(shape, dtype, g)
        return torch.where(torch.rand(shape, generator=g) < 0.3, float("nan"), x).to(dtype)
    if kind == "ties":
        assert first is not None, "ties: equal to the first operand in places"
        b = randn(shape, dtype, g)
        return torch.where(torch.rand(shape, generator=g) < 0.5, first, b)
    if kind == "shifted":
        return (torch.randn(shape, generator=g) * domain.scale + 3).to(dtype)
    if kind == "mask":
        return randn(shape, BOOL, g)
    if kind == "target":
        assert first is not None and first.dim() == 2, "target: class ids of [rows, classes]"
        return class_ids(tuple(first.shape), g)
    raise ValueError(f"unknown domain {kind!r}")


def random_operands(
    entry: OpEntry, shape: Sequence[int], dtype: torch.dtype, g: torch.Generator
) -> list[torch.Tensor]:
    """One random tensor per operand of `entry`, of `shape` (a target: one per row)."""
    out: list[torch.Tensor] = []
    for d in entry.domains:
        out.append(random_operand(d, shape, dtype, g, out[0] if out else None))
    return out


def random_params(
    entry: OpEntry, shape: Sequence[int], dtype: torch.dtype, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """Normal values for each of `entry`'s params, over the last dim of `shape`."""
    return {p: randn(tuple(shape)[-1:], dtype, g) for p in entry.params}
