"""The ops a random program (generate.py) is grown from, each a function of the Builder
that appends a line or two (or nothing, where the value it picked does not fit)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from fuser.fuzz.programs.builder import Builder, Shape

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
    "F.softplus({a})",
    "F.elu({a})",
    "F.hardtanh({a})",
    "F.mish({a})",
    "F.hardswish({a})",
    "F.logsigmoid({a})",
    "torch.erf({a})",
    # bf16 rounding, back in the run's own dtype: `.float()` would make the float64
    # reference mix float32 into ops that refuse mixed dtypes (batch norm's running stats)
    "{a}.to(torch.bfloat16).to({a}.dtype)",
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


def unary(b: Builder) -> None:
    a = b.pick()
    b.emit(b.rng.choice(UNARY).format(a=a.name), a.shape)


def binary(b: Builder) -> None:
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


def reduce(b: Builder) -> None:
    a = b.pick()
    if not a.shape:
        return
    rng = b.rng
    dim = rng.randrange(len(a.shape)) if rng.random() < 0.4 else len(a.shape) - 1
    keep = rng.random() < 0.5
    kind = rng.choice(("sum", "mean", "amax", "var", "logsumexp", "norm", "std", "max", "cumsum"))
    if kind == "cumsum":
        b.emit(f"{a.name}.cumsum({dim})", a.shape)
        return
    if rng.random() < 0.1:  # everything to one value
        b.emit(f"{a.name}.{rng.choice(('sum', 'mean'))}()", ())
        return
    arg = f"dim={dim}, keepdim={keep}"
    expr = {
        "sum": f"{a.name}.sum({arg})",
        "mean": f"{a.name}.mean({arg})",
        "amax": f"{a.name}.amax({arg})",
        "var": f"torch.var({a.name}, {arg}, correction=0)",
        "logsumexp": f"torch.logsumexp({a.name}, {arg})",
        "norm": f"torch.linalg.vector_norm({a.name} + 0.25, {arg})",
        "std": f"torch.std({a.name}, {arg})",
        "max": f"torch.max({a.name}, {arg}).values",
    }[kind]
    shape = a.shape[:dim] + ((1,) if keep else ()) + a.shape[dim + 1 :]
    v = b.emit(expr, shape)
    if keep and rng.random() < 0.7:  # the reduction used again against its rows
        op = rng.choice(("-", "*", "/"))
        rhs = f"({v.name} * {v.name} + 1.0)" if op == "/" else v.name
        b.emit(f"{a.name} {op} {rhs}", a.shape)


def row_op(b: Builder) -> None:
    """softmax, log_softmax, LayerNorm, RMSNorm (the library's and written out), and
    F.normalize."""
    a = b.pick()
    if not a.shape:
        return
    rng = b.rng
    n, c = a.name, a.shape[-1]
    kinds = ("softmax", "log_softmax", "layer_norm", "rms_norm", "rms_written", "ln_written")
    kind = rng.choice(kinds + ("normalize",))
    if kind == "normalize":
        b.emit(f"F.normalize({n}, dim=-1)", a.shape)
    elif kind in ("softmax", "log_softmax"):
        dim = rng.randrange(len(a.shape)) if rng.random() < 0.3 else -1
        b.emit(f"torch.{kind}({n}, dim={dim})", a.shape)
    elif kind == "layer_norm":
        if c < 2:  # a row of one normalizes to its bias: see layers.group_norm
            return
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


def view(b: Builder) -> None:
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
        if math.prod(shape) > b.sizes.max_numel:
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
        if other is None or math.prod(s) * 2 > b.sizes.max_numel:
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

    def pad() -> tuple[str, Shape] | None:
        return (f"F.pad({a.name}, (1, 2))", s[:-1] + (s[-1] + 3,)) if r else None

    def roll() -> tuple[str, Shape] | None:
        return (f"{a.name}.roll(1, -1)", s) if r else None

    def tril() -> tuple[str, Shape] | None:
        return (f"{a.name}.tril()", s) if r >= 2 else None

    options = [merge, split, transpose, permute, step_slice, narrow, unsqueeze_expand]
    options += [squeeze, cat, rotate_half, contiguous, flip, pad, roll, tril]
    rng.shuffle(options)
    for option in options:
        got = option()
        if got is not None:
            b.emit(got[0], got[1])
            return


def in_place(b: Builder) -> None:
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


def positions(b: Builder) -> None:
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


def argmax(b: Builder) -> None:
    """An integer result (no gradient), returned beside the rest. The values are rounded
    to quarters first: ties are then exact and many (the first index must win, as in
    eager), and near-ties that rounding alone decides are as rare as a value within an
    ulp of a rounding boundary (a program symmetric under flip had them at every row)."""
    a = b.pick()
    if not a.shape:
        return
    name = f"i{b.count}"
    b.program.lines.append(f"{name} = torch.round({a.name} * 4).argmax(dim=-1)")
    b.ints.append(name)
