"""One registry of op samples: every test per op draws from `SAMPLES`.

A sample says how to build the op with `fd.ops`, how to make random inputs for a shape
and dtype (never zeros; positive where the op needs it), and what plain torch computes
for it (written with torch directly, never through fuser's evaluator). `cases()` crosses
samples with their shapes and dtypes; every case carries a one-line repro.

The element-wise, reduction and composite ops come from the frontend op table
(fuser/frontend/registry.py): its entries give the plain samples their name, reference,
operand domains and dtypes, and the variants here (dims, params, scalars, broadcasts)
their references; the index maps and indexed reads, which the table leaves out, are here.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from fuser import FusionDefinition
from fuser.frontend.registry import (
    BY_NAME,
    PEAKED,
    SHIFTED,
    OpEntry,
    class_ids,
    entries,
    positive,
    randn,
    random_operand,
    random_operands,
)
from fuser.ir.dtypes import DType, dtype_of
from fuser.ir.evaluate import tolerance
from fuser.ir.graph import Graph
from fuser.ir.ops import BINARY, UNARY, Op

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
I32, I64, BOOL = torch.int32, torch.int64, torch.bool
FLOATS = (F32, F16, BF16)
INTS = (I32, I64)

# odd sizes on purpose: 1 and 7 (tails everywhere), 5140 (GPT-2 style hidden size that
# no power of two divides), 50257 (GPT-2 vocabulary, a prime-ish row too long to keep in
# registers); rows stay small so the CPU evaluator is fast
ELEMENTWISE_SHAPES = ((), (1,), (3, 7), (2, 5140), (1, 50257))
# a rank-0 *tensor* with a Python scalar promotes differently in torch (see test_ir_ops)
TENSOR_SHAPES = ELEMENTWISE_SHAPES[1:]
ROW_SHAPES = ((4, 1), (3, 7), (2, 5140), (2, 50257))
NORM_SHAPES = ((4, 1), (3, 7), (2, 5140))
SHAPES_3D = ((2, 3, 7), (2, 5, 1))

Inputs = Callable[[tuple, torch.dtype, torch.Generator], list[torch.Tensor]]


# -- random inputs (randn, positive: fuser/frontend/registry.py) ---------------------
def one(fn: Callable[..., torch.Tensor] = randn, **kw: Any) -> Inputs:
    return lambda shape, dtype, g: [fn(shape, dtype, g, **kw)]


def two(fn: Callable[..., torch.Tensor] = randn) -> Inputs:
    return lambda shape, dtype, g: [fn(shape, dtype, g), fn(shape, dtype, g)]


def operands(entry: OpEntry) -> Inputs:
    """Random operands in the domains the op table gives `entry`."""
    return lambda shape, dtype, g: random_operands(entry, shape, dtype, g)


# -- samples -------------------------------------------------------------------------
def _one_reduced(shape: tuple) -> int:
    return 1


@dataclass(frozen=True)
class OpSample:
    """One way of calling one op. `build(fd, *inputs)` returns an output or a tuple of them;
    `ref(*tensors)` returns what torch computes, a tensor or a tuple."""

    name: str
    build: Callable[..., Any]
    ref: Callable[..., Any]
    inputs: Inputs = field(default_factory=one)
    dtypes: tuple = FLOATS
    shapes: tuple = ELEMENTWISE_SHAPES
    # how many elements feed one output element, for the tolerance
    reduced: Callable[[tuple], int] = _one_reduced
    # define the inputs with static sizes instead of -1
    static: bool = False


@dataclass(frozen=True)
class Case:
    sample: OpSample
    shape: tuple
    dtype: torch.dtype

    @property
    def id(self) -> str:
        dims = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{self.sample.name}-{dtype_of(self.dtype).short}-{dims}"

    def repro(self, nodeid: str = "") -> str:
        """One line: op, shape, dtype and the command that reruns just this check."""
        target = nodeid or f"tests/test_ir_ops.py -k '{self.id}'"
        return (
            f"op={self.sample.name} shape={self.shape} dtype={self.dtype} "
            f"| repro: python -m pytest '{target}'"
        )

    def make_inputs(self) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(zlib.crc32(self.id.encode()))
        return self.sample.inputs(self.shape, self.dtype, g)

    def define(self, inputs: list[torch.Tensor]) -> FusionDefinition:
        with FusionDefinition(self.sample.name) as fd:
            handles = [fd.from_torch(t, static_shape=self.sample.static) for t in inputs]
            outs = self.sample.build(fd, *handles)
            for out in outs if isinstance(outs, tuple) else (outs,):
                fd.add_output(out)
        return fd

    def expected(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """What eager torch computes on `inputs` as they are."""
        out = self.sample.ref(*inputs)
        return list(out) if isinstance(out, tuple) else [out]

    def truth64(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The same torch function on float inputs upcast to float64."""
        return self.expected([t.double() if t.is_floating_point() else t for t in inputs])

    def truth(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The float64 result rounded once to eager's output dtypes: what a decomposition
        that computes in float32 and rounds at the end should be within one ulp of (eager
        half log_softmax on CPU, for one, is not: it is 2-3 ulps off)."""
        eager = self.expected(inputs)
        return [t.to(e.dtype) for t, e in zip(self.truth64(inputs), eager)]

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return output_tolerance(dtype, self.sample.reduced(self.shape))


def output_tolerance(dtype: torch.dtype, reduced: int = 1) -> tuple[float, float]:
    """(atol, rtol) for an output of `dtype` fed by `reduced` elements.

    Half and bfloat16 results are computed in float32 and rounded once, by eager ATen and
    by the decompositions alike: they may differ by the float32 error plus one rounding,
    i.e. one unit in the last place (rtol = eps). A fixed 2e-3 atol would accept anything
    for softmax over 5140 columns, whose outputs are about 2e-4.
    """
    d = dtype_of(dtype)
    if d in (DType.float16, DType.bfloat16):
        atol, rtol = tolerance(DType.float32, reduced)
        return atol, rtol + torch.finfo(dtype).eps
    return tolerance(d, reduced)


def cases(samples: list[OpSample] | None = None) -> list[Case]:
    return [
        Case(s, shape, dtype)
        for s in samples or SAMPLES
        for dtype in s.dtypes
        for shape in s.shapes
    ]


def by_name(name: str) -> OpSample:
    (s,) = [s for s in SAMPLES if s.name == name]
    return s


def binding(graph: Graph, inputs: list[torch.Tensor]) -> dict[sympy.Symbol, int]:
    """Symbolic input sizes of `graph` -> the sizes of `inputs` (what fd.bind substitutes)."""
    return {
        d: int(n)
        for v, t in zip(graph.inputs, inputs)
        for d, n in zip(v.shape, t.shape)
        if not isinstance(d, int)
    }


@contextmanager
def repro_on_error(case: Case, nodeid: str = "") -> Iterator[None]:
    """Errors raised inside fuser get the case's repro as their first line too."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{case.repro(nodeid)}\n{type(e).__name__}: {e}") from e


def assert_close(actual: list, expected: list, case: Case, what: str, nodeid: str = "") -> None:
    """Compare output lists; the first line of any failure is the case's repro."""
    head = f"{what}: {case.repro(nodeid)}"
    assert len(actual) == len(expected), f"{head}\n{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        atol, rtol = case.tolerance(e.dtype)
        torch.testing.assert_close(
            a,
            e,
            atol=atol,
            rtol=rtol,
            equal_nan=True,
            msg=lambda m, i=i, atol=atol, rtol=rtol: (
                f"{head}\noutput {i} (atol={atol:g}, rtol={rtol:g}): {m}"
            ),
        )


# -- the registry ----------------------------------------------------------------------
def _last(shape: tuple) -> int:
    return shape[-1] if shape else 1


def _sample(entry: OpEntry) -> OpSample:
    """The plain sample of an op-table entry: its operands, dtypes and reference."""
    name = entry.name
    return OpSample(
        name,
        lambda fd, *xs: getattr(fd.ops, name)(*xs),
        entry.reference,
        operands(entry),
        entry.dtypes,
    )


UNARY_SAMPLES = [_sample(e) for e in entries("elementwise", ops=UNARY)]


def _row_and_vector(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
    return [randn(shape, dtype, g), randn(shape[-1:], dtype, g)]


def _mixed(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
    return [randn(shape, dtype, g), randn(shape, F32, g)]


BINARY_SAMPLES = [
    *(_sample(e) for e in entries("elementwise", ops=BINARY)),
    # numpy broadcasting of a [H] operand against [rows, H], Python scalars, mixed dtypes
    OpSample(
        "add_row_bcast",
        lambda fd, x, v: fd.ops.add(x, v),
        torch.add,
        _row_and_vector,
        FLOATS + INTS,
        ROW_SHAPES,
    ),
    OpSample(
        "mul_scalar", lambda fd, x: x * 0.5, lambda x: x * 0.5, one(), FLOATS + INTS, TENSOR_SHAPES
    ),
    OpSample(
        "rsub_scalar", lambda fd, x: 2 - x, lambda x: 2 - x, one(), FLOATS + INTS, TENSOR_SHAPES
    ),
    OpSample(
        "rdiv_scalar",
        lambda fd, x: 1.5 / x,
        lambda x: 1.5 / x,
        one(positive),
        FLOATS,
        TENSOR_SHAPES,
    ),
    OpSample("add_mixed_f32", lambda fd, a, b: a + b, torch.add, _mixed, FLOATS[1:] + INTS),
    OpSample("add_static", lambda fd, a, b: a + b, torch.add, two(), static=True),
]


def _where_bcast_inputs(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list:
    return [randn(shape[:-1] + (1,), BOOL, g), randn(shape, dtype, g), randn(shape, dtype, g)]


WHERE = BY_NAME["where"]
WHERE_SAMPLES = [
    _sample(WHERE),
    OpSample(
        "where_scalar",
        lambda fd, c, a, b: fd.ops.where(c, a, 0.0),
        lambda c, a, b: WHERE.reference(c, a, 0.0),
        operands(WHERE),
        WHERE.dtypes,
        TENSOR_SHAPES,
    ),
    # the condition is the operand that broadcasts (static: a -1 size is never taken as 1)
    OpSample(
        "where_bcast_cond",
        lambda fd, c, a, b: fd.ops.where(c, a, b),
        WHERE.reference,
        _where_bcast_inputs,
        FLOATS,
        ROW_SHAPES,
        static=True,
    ),
]


def _cast(target: torch.dtype, sources: tuple) -> OpSample:
    name = f"cast_{dtype_of(target).short}"
    cast = BY_NAME["cast"]
    return OpSample(
        name,
        lambda fd, x: fd.ops.cast(x, target),
        lambda x: cast.reference(x, dtype=target),
        operands(cast),
        sources,
    )


CAST_SAMPLES = [
    _cast(F32, (F16, BF16, I32, BOOL)),
    _cast(F16, (F32, BF16, I64, BOOL)),
    _cast(BF16, (F32, F16, BOOL)),
    _cast(I32, (F32, F16, I64, BOOL)),
    _cast(I64, (F32, I32, BOOL)),
    _cast(BOOL, (F32, I32)),
]


def _bcast(name: str, src: Callable[[tuple], tuple], dims: Callable[[tuple], list]) -> OpSample:
    """broadcast_in_dim of x to the shape of y (y is only there to give the sizes)."""

    def inputs(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
        return [randn(src(shape), dtype, g), randn(shape, dtype, g)]

    def ref(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        view = [1] * y.dim()
        for i, d in enumerate(dims(y.shape)):
            view[d] = x.shape[i]
        return x.reshape(view).expand(y.shape)

    def build(fd: FusionDefinition, x: Any, y: Any) -> Any:
        return fd.ops.broadcast_in_dim(x, shape=y.shape, broadcast_dims=dims(y.shape))

    return OpSample(name, build, ref, inputs, FLOATS + (I64, BOOL), ROW_SHAPES)


MOVEMENT_SAMPLES = [
    _bcast("bcast_row", lambda s: s[-1:], lambda s: [len(s) - 1]),
    _bcast("bcast_col", lambda s: s[:1], lambda s: [0]),
    _bcast("bcast_size1", lambda s: s[:1] + (1,), lambda s: [0, 1]),
    _bcast("bcast_scalar", lambda s: (), lambda s: []),
]


def _layout(name: str, build: Callable, ref: Callable, inputs: Inputs | None = None) -> OpSample:
    """A slice, pad or cat (static sizes: layout ops are index maps known at compile time)."""
    shapes = ((3, 7), (2, 5140), (2, 3, 9))
    return OpSample(name, build, ref, inputs or one(), FLOATS + (I64,), shapes, static=True)


def _view_read(fd: FusionDefinition, x: Any) -> Any:
    """The kernel-level VIEW (what slices and cats become): columns 1, 3, ... of x, for
    the result's columns [1, n // 2 - 1) of n // 2 (zeros elsewhere)."""
    n, last = int(x.shape[-1]), len(x.shape) - 1
    attrs = {"dim": last, "size": n // 2, "scale": 2, "offset": -1, "lo": 1, "hi": n // 2}
    return fd.ops._b.add(Op.VIEW, [x], attrs)[0]


def _view_ref(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype)
    out[..., 1:] = x[..., 1 : 2 * (x.shape[-1] // 2) - 2 : 2]
    return out


LAYOUT_SAMPLES = [
    _layout(
        "slice_last_step2",
        lambda fd, x: fd.ops.slice(x, len(x.shape) - 1, 1, int(x.shape[-1]), 2),
        lambda x: x[..., 1::2],
    ),
    _layout("slice_dim0", lambda fd, x: fd.ops.slice(x, 0, 1, int(x.shape[0])), lambda x: x[1:]),
    _layout(
        "pad_last",
        lambda fd, x: fd.ops.pad(x, len(x.shape) - 1, 3, 2),
        lambda x: (
            torch.nn.functional.pad(x, (3, 2))
            if x.is_floating_point()
            else torch.cat((x[..., :3] * 0, x, x[..., :2] * 0), -1)
        ),
    ),
    _layout(
        "cat_last_neg",
        lambda fd, x, y: fd.ops.cat([fd.ops.neg(y), x, y], len(x.shape) - 1),
        lambda x, y: torch.cat((-y, x, y), -1),
        two(),
    ),
    _layout("view_read", _view_read, _view_ref),
]


def _iota_ref(dim: int, dtype: torch.dtype) -> Callable:
    def ref(x: torch.Tensor) -> torch.Tensor:
        view = [1] * x.dim()
        view[dim] = x.shape[dim]
        return torch.arange(x.shape[dim], dtype=dtype).reshape(view).expand(x.shape)

    return ref


def _iota(name: str, dim: int, dtype: torch.dtype, static: bool = False) -> OpSample:
    # x only gives the shape (symbolic, or static ints with static=True)
    return OpSample(
        name,
        lambda fd, x: fd.ops.iota(x.shape, dim=dim, dtype=dtype),
        _iota_ref(dim, dtype),
        dtypes=(F32,),
        shapes=((7,), (3, 7), (2, 5140)) if dim == 0 else ((3, 7), (2, 5140)),
        static=static,
    )


LEAF_SAMPLES = [
    _iota("iota_dim0_i64", 0, I64),
    _iota("iota_dim1_i32", 1, I32),
    _iota("iota_last_f32_static", 1, F32, static=True),
    OpSample(
        "iota_plus_x",
        lambda fd, x: x + fd.ops.cast(fd.ops.iota(x.shape, dim=1), x.dtype),
        lambda x: x + torch.arange(x.shape[1]).to(x.dtype),
        dtypes=FLOATS + (I64,),
        shapes=((3, 7), (2, 255)),  # bfloat16 holds integers exactly up to 256
    ),
]


def _picked_ref(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    keep = t != -100
    picked = x.gather(1, torch.where(keep, t, 0).long()[:, None])[:, 0]
    return torch.where(keep, picked, 0).to(x.dtype)


def _picked(fd: FusionDefinition, x: Any, t: Any) -> Any:
    """x[row, t[row]] (0 where t is -100), the class picked as cross-entropy picks it."""
    t = fd.ops.check_index(t, bound=x.shape[1], ignore=-100, what="target")
    cls = fd.ops.iota(x.shape, dim=1, dtype=t.dtype)
    hit = fd.ops.eq(cls, fd.ops.broadcast_in_dim(t, shape=x.shape, broadcast_dims=[0]))
    return fd.ops.sum(fd.ops.where(hit, x, 0.0), dims=[1])


GUARD_SAMPLES = [
    OpSample(
        "check_index_pick",
        _picked,
        _picked_ref,
        lambda shape, dtype, g: [randn(shape, dtype, g), class_ids(shape, g, -100)],
        shapes=((4, 1), (5, 7), (2, 50257)),
    ),
]


def _gather_inputs(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
    """A [rows + 3, H] table and a [rows] index into it (repeats likely)."""
    rows, h = shape
    table = randn((rows + 3, h), dtype, g)
    return [table, torch.randint(0, rows + 3, (rows,), generator=g)]


INDEXED_SAMPLES = [
    OpSample(
        "gather_rows",
        lambda fd, t, i: fd.ops.gather_rows(t, i),
        lambda t, i: t[i],
        _gather_inputs,
        dtypes=FLOATS + (I64,),
        shapes=((4, 1), (3, 7), (2, 5140)),
        static=True,
    ),
]


def _dims_name(dims: tuple) -> str:
    return "".join("L" if d == -1 else str(d) for d in dims)


def _count(shape: tuple, dims: tuple) -> int:
    return math.prod(shape[d] for d in dims) if shape else 1


def _reduce(op: str, dims: tuple, keep: bool, shapes: tuple = ROW_SHAPES) -> OpSample:
    name = f"{op}_dims{_dims_name(dims)}{'_keep' if keep else ''}"
    entry = BY_NAME[op]
    return OpSample(
        name,
        lambda fd, x: getattr(fd.ops, op)(x, dims=list(dims), keepdim=keep),
        lambda x: entry.reference(x, dims=list(dims), keepdim=keep),
        dtypes=entry.dtypes,
        shapes=shapes,
        reduced=lambda s: _count(s, dims),
    )


def _reductions(op: str) -> list[OpSample]:
    return [
        _reduce(op, (-1,), False),
        _reduce(op, (-1,), True),
        _reduce(op, (0,), False),
        _reduce(op, (0, 1), True),
        _reduce(op, (1,), False, SHAPES_3D),
    ]


def _var_mean(dims: tuple, correction: int, keep: bool, shapes: tuple) -> OpSample:
    name = f"var_mean_dims{_dims_name(dims)}_c{correction}"
    name += "_keep" if keep else ""
    kw = {"dims": list(dims), "correction": correction, "keepdim": keep}
    return OpSample(
        name,
        lambda fd, x: fd.ops.var_mean(x, **kw),
        lambda x: BY_NAME["var_mean"].reference(x, **kw),
        dtypes=BY_NAME["var_mean"].dtypes,
        shapes=shapes,
        reduced=lambda s: _count(s, dims),
    )


REDUCTION_SAMPLES = [
    *(s for e in entries("reduction") if e.name != "var_mean" for s in _reductions(e.name)),
    # correction=1 over a single element is 0/0; keep those shapes out of the c1 samples
    _var_mean((-1,), 1, False, ROW_SHAPES[1:]),
    _var_mean((-1,), 0, True, ROW_SHAPES),
    _var_mean((0,), 1, True, ROW_SHAPES),
    _var_mean((0, 2), 1, False, SHAPES_3D),
]


# -- composites ----------------------------------------------------------------------------
def _norm_inputs(weight: bool, bias: bool) -> Inputs:
    def inputs(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
        # an offset mean and a non-unit spread make the centring and scaling matter
        xs = [random_operand(SHIFTED, shape, dtype, g)]
        xs += [randn(shape[-1:], dtype, g) for flag in (weight, bias) if flag]
        return xs

    return inputs


LAYER_NORM, RMS_NORM = BY_NAME["layer_norm"], BY_NAME["rms_norm"]


def _layer_norm(weight: bool, bias: bool) -> OpSample:
    name = "layer_norm" + ("_w" if weight else "") + ("_b" if bias else "")

    def params(p: tuple) -> dict[str, Any]:
        it = iter(p)
        return {"weight": next(it) if weight else None, "bias": next(it) if bias else None}

    def build(fd: FusionDefinition, x: Any, *p: Any) -> Any:
        return fd.ops.layer_norm(x, **params(p), eps=1e-5)

    def ref(x: torch.Tensor, *p: torch.Tensor) -> torch.Tensor:
        return LAYER_NORM.reference(x, **params(p), eps=1e-5)

    return OpSample(
        name,
        build,
        ref,
        _norm_inputs(weight, bias),
        FLOATS,
        NORM_SHAPES + ((1, 50257),),
        reduced=_last,
    )


def _cross_entropy(name: str, ignore_index: int, target_dtype: torch.dtype = I64) -> OpSample:
    def inputs(shape: tuple, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
        logits = random_operand(PEAKED, shape, dtype, g)
        return [logits, class_ids(shape, g, ignore_index, target_dtype)]

    def build(fd: FusionDefinition, logits: Any, target: Any) -> Any:
        return fd.ops.cross_entropy(logits, target, ignore_index=ignore_index)

    def ref(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return BY_NAME["cross_entropy"].reference(logits, target, ignore_index=ignore_index)

    shapes = ((4, 1), (5, 7), (3, 5140), (2, 50257))
    return OpSample(name, build, ref, inputs, FLOATS, shapes, reduced=lambda s: s[0] * s[1])


def _softmax(op: str, dim: int, shapes: tuple) -> OpSample:
    entry = BY_NAME[op]
    return OpSample(
        f"{op}_dim{_dims_name((dim,))}",
        lambda fd, x: getattr(fd.ops, op)(x, dim=dim),
        lambda x: entry.reference(x, dim=dim),
        operands(entry),
        entry.dtypes,
        shapes,
        reduced=lambda s: s[dim],
    )


COMPOSITE_SAMPLES = [
    _layer_norm(False, False),
    _layer_norm(True, False),
    _layer_norm(False, True),
    _layer_norm(True, True),
    OpSample(
        "layer_norm_mean_rstd",
        lambda fd, x, w, b: fd.ops.layer_norm(x, w, b, eps=1e-3, return_mean_rstd=True),
        lambda x, w, b: LAYER_NORM.reference(x, w, b, eps=1e-3, return_mean_rstd=True),
        _norm_inputs(True, True),
        FLOATS,
        NORM_SHAPES,
        reduced=_last,
    ),
    OpSample(
        "layer_norm_static",
        lambda fd, x: fd.ops.layer_norm(x),
        LAYER_NORM.reference,
        _norm_inputs(False, False),
        FLOATS,
        ((3, 7), (2, 5140)),
        reduced=_last,
        static=True,
    ),
    OpSample(
        "rms_norm",
        lambda fd, x: fd.ops.rms_norm(x),
        RMS_NORM.reference,
        _norm_inputs(False, False),
        FLOATS,
        NORM_SHAPES,
        reduced=_last,
    ),
    OpSample(
        "rms_norm_w",
        lambda fd, x, w: fd.ops.rms_norm(x, w),
        RMS_NORM.reference,
        _norm_inputs(True, False),
        FLOATS,
        NORM_SHAPES,
        reduced=_last,
    ),
    _sample(BY_NAME["gelu"]),
    OpSample(
        "gelu_tanh",
        lambda fd, x: fd.ops.gelu(x, approximate="tanh"),
        lambda x: BY_NAME["gelu"].reference(x, approximate="tanh"),
        operands(BY_NAME["gelu"]),
    ),
    _softmax("softmax", -1, ROW_SHAPES),
    _softmax("softmax", 0, ROW_SHAPES),
    _softmax("softmax", 1, SHAPES_3D),
    _softmax("log_softmax", -1, ROW_SHAPES),
    _softmax("log_softmax", 0, ROW_SHAPES),
    _softmax("log_softmax", 1, SHAPES_3D),
    _softmax("safe_softmax", -1, ROW_SHAPES),
    _softmax("safe_softmax", 1, SHAPES_3D),
    _cross_entropy("cross_entropy", -100),
    _cross_entropy("cross_entropy_ignore3", 3),  # the ignored id is also a real class
    _cross_entropy("cross_entropy_i32_target", -100, I32),
]

SAMPLES: list[OpSample] = [
    *UNARY_SAMPLES,
    *BINARY_SAMPLES,
    *WHERE_SAMPLES,
    *CAST_SAMPLES,
    *MOVEMENT_SAMPLES,
    *LAYOUT_SAMPLES,
    *LEAF_SAMPLES,
    *GUARD_SAMPLES,
    *INDEXED_SAMPLES,
    *REDUCTION_SAMPLES,
    *COMPOSITE_SAMPLES,
]
assert len({s.name for s in SAMPLES}) == len(SAMPLES), "sample names must be unique"
