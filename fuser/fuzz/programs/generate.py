"""Random PyTorch programs, as Python source: what torch.compile hands fuser.

A program is a function of a few float inputs (activations that require grad, parameters,
sometimes integer ids) whose body is a random chain of the ops transformer models are made
of: pointwise math, row and column reductions, norms (library and written out), softmax,
views (reshape, transpose, permute, slices with a step, narrow, expand, cat, unsqueeze),
matmuls and embeddings, ending in one to three returned values. The generator tracks every
value's shape, so each program runs in eager; values stay bounded (exp of a tanh, division
by 1 + x^2), so a difference is the compiler's, not overflow's.

Everything is drawn from one `random.Random(seed)`: a seed is a repro.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Sizes:
    """What dims are drawn from (odd sizes, 1 for broadcasts and squeezes, powers of two)
    and the most elements a value may hold."""

    dims: tuple[int, ...]
    max_numel: int


# the CPU interpreter runs every kernel element by element
CPU = Sizes((1, 2, 3, 4, 5, 7, 8, 12, 16, 17, 33), 6144)
# a GPU's schedules change with the row: persistent, looped, several rows a block
GPU = Sizes((1, 2, 3, 5, 8, 17, 33, 64, 127, 256, 768, 1000, 2048, 5000), 1 << 22)
LAYOUTS = ("contiguous", "contiguous", "contiguous", "transposed", "sliced", "offset")


@dataclass(frozen=True)
class Input:
    """A program argument: `kind` "float" (randn) or "ids" (int64 in [0, high));
    `layout` how its storage is laid out (contiguous, the last two dims transposed, a
    slice of wider rows, one element past an aligned start)."""

    name: str
    shape: Shape
    kind: str = "float"
    grad: bool = False
    layout: str = "contiguous"
    high: int = 0  # ids: the exclusive upper bound
    ignore: bool = False  # ids: cross-entropy targets, one of them the ignore index


@dataclass
class Program:
    """A random program: `source` defines `program(*inputs)`, which returns `outputs`
    values (a tuple); `seed` drew it."""

    seed: int
    inputs: list[Input]
    lines: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = "\n".join(f"    {line}" for line in self.lines)
        return f"def program({args}):\n{body}\n    return ({', '.join(self.returns)},)\n"


@dataclass
class _Value:
    name: str
    shape: Shape


def _numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class _Builder:
    """The program being drawn: its inputs, lines and live float values."""

    def __init__(self, rng: random.Random, seed: int, sizes: Sizes):
        self.rng = rng
        self.sizes = sizes
        self.program = Program(seed, [])
        self.values: list[_Value] = []
        self.count = 0
        self.mutable: set[str] = set()  # inputs that do not require grad
        self.ints: list[str] = []  # integer results (argmax)

    def input(self, shape: Shape, grad: bool, layout: str | None = None) -> _Value:
        name = f"x{len(self.program.inputs)}"
        lay = layout or self.rng.choice(LAYOUTS)
        if lay == "transposed" and len(shape) < 2:
            lay = "contiguous"
        self.program.inputs.append(Input(name, shape, "float", grad, lay))
        if not grad:
            self.mutable.add(name)
        v = _Value(name, shape)
        self.values.append(v)
        return v

    def param(self, shape: Shape) -> str:
        name = f"w{len(self.program.inputs)}"
        self.program.inputs.append(Input(name, shape, "float", True))
        return name

    def emit(self, expr: str, shape: Shape) -> _Value:
        self.count += 1
        v = _Value(f"v{self.count}", shape)
        self.program.lines.append(f"{v.name} = {expr}")
        self.values.append(v)
        return v

    def pick(self) -> _Value:
        """A live value, the latest most often (chains, which fusion grows on)."""
        if self.rng.random() < 0.6:
            return self.values[-1]
        return self.rng.choice(self.values)

    def same_shape(self, shape: Shape) -> _Value | None:
        got = [v for v in self.values if v.shape == shape]
        return self.rng.choice(got) if got else None


# --------------------------------------------------------------------------- the ops

UNARY = (
    "torch.tanh({a})",
    "torch.sigmoid({a})",
    "F.gelu({a})",
    "F.gelu({a}, approximate='tanh')",
    "F.silu({a})",
    "torch.relu({a})",
    "{a} * {a}",
    "torch.exp(torch.tanh({a}))",
    "torch.sin({a})",
    "torch.abs({a})",
    "torch.sqrt({a}.abs() + 0.5)",
    "torch.rsqrt({a} * {a} + 1.0)",
    "torch.log1p({a} * {a})",
    "-{a}",
    "{a} * 0.5 + 1.0",
    "{a}.pow(2)",
    "torch.clamp({a}, -0.5, 0.7)",
    "F.leaky_relu({a}, 0.1)",
    "{a} / 3.0",
)
BINARY = (
    "{a} + {b}",
    "{a} - {b}",
    "{a} * {b}",
    "torch.maximum({a}, {b})",
    "torch.where({a} > 0, {a}, {b})",
    "{a} / ({b} * {b} + 1.0)",
)
EPS = "1e-5"


def _unary(b: _Builder) -> None:
    a = b.pick()
    b.emit(b.rng.choice(UNARY).format(a=a.name), a.shape)


def _binary(b: _Builder) -> None:
    a = b.pick()
    rng = b.rng
    choice = rng.random()
    if choice < 0.4 and (other := b.same_shape(a.shape)) is not None:
        other_name = other.name
    elif choice < 0.7 and a.shape:
        # a broadcast operand: a row (bias), a column, or the shape with ones in it
        if rng.random() < 0.5:
            bshape: Shape = (a.shape[-1],)
        else:
            bshape = tuple(s if rng.random() < 0.5 else 1 for s in a.shape)
        other_name = b.param(bshape)
    else:  # a Python scalar: only where torch takes one, and never as the condition
        scalar = f"{rng.choice((0.5, -1.5, 2.0))}"
        expr = rng.choice(BINARY[:3] + BINARY[4:])
        swap = expr in BINARY[:3] and rng.random() < 0.5
        a_name, b_name = (scalar, a.name) if swap else (a.name, scalar)
        b.emit(expr.format(a=a_name, b=b_name), a.shape)
        return
    expr = rng.choice(BINARY)
    if rng.random() < 0.5:  # the broadcast operand on either side
        b.emit(expr.format(a=a.name, b=other_name), a.shape)
    else:
        b.emit(expr.format(a=other_name, b=a.name), a.shape)


def _reduce(b: _Builder) -> None:
    a = b.pick()
    if not a.shape:
        return
    rng = b.rng
    dim = rng.randrange(len(a.shape)) if rng.random() < 0.4 else len(a.shape) - 1
    keep = rng.random() < 0.5
    kind = rng.choice(("sum", "mean", "amax", "var", "logsumexp", "norm"))
    arg = f"dim={dim}, keepdim={keep}"
    expr = {
        "sum": f"{a.name}.sum({arg})",
        "mean": f"{a.name}.mean({arg})",
        "amax": f"{a.name}.amax({arg})",
        "var": f"torch.var({a.name}, {arg}, correction=0)",
        "logsumexp": f"torch.logsumexp({a.name}, {arg})",
        "norm": f"torch.linalg.vector_norm({a.name} + 0.25, {arg})",
    }[kind]
    shape = a.shape[:dim] + ((1,) if keep else ()) + a.shape[dim + 1 :]
    v = b.emit(expr, shape)
    if keep and rng.random() < 0.7:  # the reduction used again against its rows
        op = rng.choice(("-", "*", "/"))
        rhs = f"({v.name} * {v.name} + 1.0)" if op == "/" else v.name
        b.emit(f"{a.name} {op} {rhs}", a.shape)


def _row_op(b: _Builder) -> None:
    """softmax, log_softmax, LayerNorm, RMSNorm (the library's and written out)."""
    a = b.pick()
    if not a.shape:
        return
    rng = b.rng
    n, c = a.name, a.shape[-1]
    kind = rng.choice(
        ("softmax", "log_softmax", "layer_norm", "rms_norm", "rms_written", "ln_written")
    )
    if kind in ("softmax", "log_softmax"):
        dim = rng.randrange(len(a.shape)) if rng.random() < 0.3 else -1
        b.emit(f"torch.{kind}({n}, dim={dim})", a.shape)
    elif kind == "layer_norm":
        w, bias = (b.param((c,)), b.param((c,))) if rng.random() < 0.7 else ("None", "None")
        b.emit(f"F.layer_norm({n}, ({c},), {w}, {bias}, eps={EPS})", a.shape)
    elif kind == "rms_norm":
        w = b.param((c,)) if rng.random() < 0.7 else "None"
        b.emit(f"F.rms_norm({n}, ({c},), {w}, eps={EPS})", a.shape)
    elif kind == "rms_written":  # as transformers writes it, upcast and all
        w = b.param((c,))
        v = b.emit(f"{n}.pow(2).mean(-1, keepdim=True)", a.shape[:-1] + (1,))
        b.emit(f"{w} * ({n} * torch.rsqrt({v.name} + {EPS}))", a.shape)
    else:
        m = b.emit(f"{n}.mean(-1, keepdim=True)", a.shape[:-1] + (1,))
        d = b.emit(f"{n} - {m.name}", a.shape)
        var = b.emit(f"({d.name} * {d.name}).mean(-1, keepdim=True)", m.shape)
        b.emit(f"{d.name} * torch.rsqrt({var.name} + {EPS})", a.shape)


def _factor(n: int, rng: random.Random) -> tuple[int, int] | None:
    fs = [f for f in range(2, n) if n % f == 0]
    if not fs:
        return None
    f = rng.choice(fs)
    return f, n // f


def _view(b: _Builder) -> None:
    a = b.pick()
    rng = b.rng
    s = a.shape
    r = len(s)
    options: list[Callable[[], tuple[str, Shape] | None]] = []

    def merge() -> tuple[str, Shape] | None:
        if r < 2:
            return None
        i = rng.randrange(r - 1)
        shape = s[:i] + (s[i] * s[i + 1],) + s[i + 2 :]
        return f"{a.name}.reshape{shape}", shape

    def split() -> tuple[str, Shape] | None:
        if r == 0 or r >= 4:
            return None
        i = rng.randrange(r)
        f = _factor(s[i], rng)
        if f is None:
            return None
        shape = s[:i] + f + s[i + 1 :]
        return f"{a.name}.reshape{shape}", shape

    def transpose() -> tuple[str, Shape] | None:
        if r < 2:
            return None
        i, j = rng.sample(range(r), 2)
        shape = list(s)
        shape[i], shape[j] = shape[j], shape[i]
        return f"{a.name}.transpose({i}, {j})", tuple(shape)

    def permute() -> tuple[str, Shape] | None:
        if r < 3:
            return None
        p = list(range(r))
        rng.shuffle(p)
        return f"{a.name}.permute{tuple(p)}", tuple(s[i] for i in p)

    def step_slice() -> tuple[str, Shape] | None:
        if r == 0:
            return None
        i = rng.randrange(r)
        if s[i] < 2:
            return None
        start, step = rng.choice(((0, 2), (1, 2), (1, 1), (0, 3)))
        n = len(range(start, s[i], step))
        if n == 0:
            return None
        idx = ", ".join([":"] * i + [f"{start}::{step}"])
        return f"{a.name}[{idx}]", s[:i] + (n,) + s[i + 1 :]

    def narrow() -> tuple[str, Shape] | None:
        if r == 0 or s[-1] < 2:
            return None
        length = rng.randrange(1, s[-1])
        start = rng.randrange(s[-1] - length + 1)
        return f"{a.name}.narrow({r - 1}, {start}, {length})", s[:-1] + (length,)

    def unsqueeze_expand() -> tuple[str, Shape] | None:
        if r >= 4:
            return None
        i = rng.randrange(r + 1)
        k = rng.choice((2, 3))
        shape = s[:i] + (k,) + s[i:]
        if _numel(shape) > b.sizes.max_numel:
            return None
        return f"{a.name}.unsqueeze({i}).expand{shape}", shape

    def squeeze() -> tuple[str, Shape] | None:
        ones = [i for i, d in enumerate(s) if d == 1]
        if not ones:
            return None
        i = rng.choice(ones)
        return f"{a.name}.squeeze({i})", s[:i] + s[i + 1 :]

    def cat() -> tuple[str, Shape] | None:
        if r == 0:
            return None
        i = rng.randrange(r)
        other = b.same_shape(s)
        if other is None or _numel(s) * 2 > b.sizes.max_numel:
            return None
        parts = (
            [a.name, other.name] if rng.random() < 0.5 else [a.name, f"torch.tanh({other.name})"]
        )
        return f"torch.cat([{', '.join(parts)}], dim={i})", s[:i] + (2 * s[i],) + s[i + 1 :]

    def rotate_half() -> tuple[str, Shape] | None:
        if r == 0 or s[-1] % 2:
            return None
        h = s[-1] // 2
        n = a.name
        return f"torch.cat((-{n}[..., {h}:], {n}[..., :{h}]), dim=-1)", s

    def contiguous() -> tuple[str, Shape] | None:
        return f"{a.name}.contiguous()", s

    def flip() -> tuple[str, Shape] | None:
        return (f"{a.name}.flip(-1)", s) if r else None

    options = [merge, split, transpose, permute, step_slice, narrow, unsqueeze_expand]
    options += [squeeze, cat, rotate_half, contiguous, flip]
    rng.shuffle(options)
    for option in options:
        got = option()
        if got is not None:
            b.emit(got[0], got[1])
            return


def _matmul(b: _Builder) -> None:
    a = b.pick()
    if not a.shape:
        return
    rng = b.rng
    k = a.shape[-1]
    n = rng.choice((k, 2 * k, 7, 16, 24)) if k > 1 else rng.choice((4, 9))
    shape = a.shape[:-1] + (n,)
    if _numel(shape) > b.sizes.max_numel or n * k > b.sizes.max_numel:
        return
    w = b.param((n, k))
    if rng.random() < 0.5:
        bias = b.param((n,))
        b.emit(f"F.linear({a.name}, {w}, {bias})", shape)
    else:
        b.emit(f"{a.name} @ {w}.t()", shape)


def _embedding(b: _Builder) -> None:
    """Integer ids into a table: a new float value (the table requires grad)."""
    rng = b.rng
    rows = rng.choice((5, 16, 33))
    width = rng.choice((4, 8, 12))
    ids_shape = tuple(rng.choice((1, 2, 3, 7)) for _ in range(rng.choice((1, 2))))
    name = f"x{len(b.program.inputs)}"
    b.program.inputs.append(Input(name, ids_shape, "ids", high=rows))
    table = b.param((rows, width))
    b.emit(f"F.embedding({name}, {table})", ids_shape + (width,))


def _cross_entropy(b: _Builder) -> None:
    """A terminal loss over rows of logits (class dim last, merged to 2-d)."""
    a = b.pick()
    if len(a.shape) < 1 or a.shape[-1] < 2:
        return
    rows = _numel(a.shape[:-1])
    name = f"x{len(b.program.inputs)}"
    b.program.inputs.append(Input(name, (rows,), "ids", high=a.shape[-1], ignore=True))
    smooth = b.rng.choice(("", ", label_smoothing=0.1"))
    red = b.rng.choice(("", ", reduction='sum'", ", reduction='none'"))
    expr = f"F.cross_entropy({a.name}.reshape({rows}, {a.shape[-1]}), {name}{smooth}{red})"
    b.emit(expr, (rows,) if "none" in red else ())


def _in_place(b: _Builder) -> None:
    """An in-place op on a clone, or on an input that does not require grad (a graph
    input mutation, which the compiled program must carry back to the caller's tensor)."""
    rng = b.rng
    op = rng.choice(("mul_(0.5)", "add_(1.0)", "clamp_(-1.0, 1.0)", "sigmoid_()"))
    targets = [v for v in b.values if v.name in b.mutable]
    if targets and rng.random() < 0.5:
        t = rng.choice(targets)
        b.program.lines.append(f"{t.name}.{op}")
        b.mutable.discard(t.name)  # once: a later view of it would see the new values
        b.emit(f"{t.name} * 1.0", t.shape)
        return
    a = b.pick()
    v = b.emit(f"{a.name}.clone()", a.shape)
    b.program.lines.append(f"{v.name}.{op}")


def _positions(b: _Builder) -> None:
    """Math on torch.arange (positions, masks): values the graph makes itself."""
    a = b.pick()
    if not a.shape:
        return
    c, n = a.shape[-1], a.name
    rng = b.rng
    if rng.random() < 0.5:
        expr = f"torch.where(torch.arange({c}, device={n}.device) % 3 == 0, {n}, 0.0)"
    else:  # a rotary-like table: sin and cos of positions times frequencies
        expr = f"{n} * torch.cos(torch.arange({c}, device={n}.device) * 0.37) + torch.sin({n})"
    b.emit(expr, a.shape)


def _attention(b: _Builder) -> None:
    """scaled_dot_product_attention of a [..., T, D] value with itself."""
    a = b.pick()
    if len(a.shape) < 3:
        return
    causal = b.rng.choice((True, False))
    n = a.name
    b.emit(
        f"F.scaled_dot_product_attention({n}, torch.tanh({n}), {n}, is_causal={causal})", a.shape
    )


def _argmax(b: _Builder) -> None:
    """An integer result (no gradient), returned beside the rest."""
    a = b.pick()
    if not a.shape:
        return
    name = f"i{b.count}"
    b.program.lines.append(f"{name} = {a.name}.argmax(dim=-1)")
    b.ints.append(name)


OPS: tuple[tuple[Callable[[_Builder], None], float], ...] = (
    (_unary, 3.0),
    (_binary, 3.0),
    (_reduce, 1.5),
    (_row_op, 1.5),
    (_view, 3.0),
    (_matmul, 1.0),
    (_embedding, 0.3),
    (_cross_entropy, 0.3),
    (_in_place, 0.4),
    (_positions, 0.3),
    (_attention, 0.3),
    (_argmax, 0.15),
)


def _start(b: _Builder) -> None:
    """The first input: [B, T, C]-like, 1 to 4 dims, within half the largest size."""
    rng = b.rng
    while True:
        shape = tuple(rng.choice(b.sizes.dims) for _ in range(rng.choice((1, 2, 3, 3, 4))))
        if 1 < _numel(shape) <= b.sizes.max_numel // 2:
            break
    if rng.random() < 0.03:  # an empty batch
        shape = (0,) + shape[1:]
    b.input(shape, grad=rng.random() < 0.8)
    if rng.random() < 0.4:  # a second activation of the same shape (a residual stream)
        b.input(shape, grad=rng.random() < 0.5)


def draw_program(seed: int, length: int | None = None, sizes: Sizes = CPU) -> Program:
    """The program of `seed`: 3 to 14 ops (or `length`), one to three returns, its dims
    drawn from `sizes`."""
    rng = random.Random(seed)
    b = _Builder(rng, seed, sizes)
    _start(b)
    n = length if length is not None else rng.randint(3, 14)
    fns, weights = zip(*OPS)
    for _ in range(n):
        rng.choices(fns, weights)[0](b)
    computed = [v for v in b.values if v.name.startswith("v")]
    if not computed:
        _unary(b)
        computed = [b.values[-1]]
    returns = [computed[-1]]
    extra = [v for v in computed[:-1] if rng.random() < 0.25]
    returns += extra[:2]
    b.program.returns = [v.name for v in returns] + b.ints[:1]
    return b.program
