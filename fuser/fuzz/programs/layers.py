"""The layer-level ops a random program (generate.py) is grown from: matmuls, embeddings,
attention, batch and group norm (running statistics updated in place), losses, gathers
and index selects. Each appends a line or two, or nothing where the value it picked does
not fit."""

from __future__ import annotations

import math

from fuser.fuzz.programs.builder import Builder, Input


def matmul(b: Builder) -> None:
    a = b.pick()
    if not a.shape:
        return
    rng = b.rng
    k = a.shape[-1]
    n = rng.choice((k, 2 * k, 7, 16, 24)) if k > 1 else rng.choice((4, 9))
    shape = a.shape[:-1] + (n,)
    if math.prod(shape) > b.sizes.max_numel or n * k > b.sizes.max_numel:
        return
    w = b.param((n, k))
    if rng.random() < 0.5:
        bias = b.param((n,))
        b.emit(f"F.linear({a.name}, {w}, {bias})", shape)
    else:
        b.emit(f"{a.name} @ {w}.t()", shape)


def embedding(b: Builder) -> None:
    """Integer ids into a table: a new float value (the table requires grad)."""
    rng = b.rng
    rows = rng.choice((5, 16, 33))
    width = rng.choice((4, 8, 12))
    ids_shape = tuple(rng.choice((1, 2, 3, 7)) for _ in range(rng.choice((1, 2))))
    name = f"x{len(b.program.inputs)}"
    b.program.inputs.append(Input(name, ids_shape, "ids", high=rows))
    table = b.param((rows, width))
    b.emit(f"F.embedding({name}, {table})", ids_shape + (width,))


def cross_entropy(b: Builder) -> None:
    """A terminal loss over rows of logits (class dim last, merged to 2-d)."""
    a = b.pick()
    if len(a.shape) < 1 or a.shape[-1] < 2:
        return
    rows = math.prod(a.shape[:-1])
    name = f"x{len(b.program.inputs)}"
    b.program.inputs.append(Input(name, (rows,), "ids", high=a.shape[-1], ignore=True))
    smooth = b.rng.choice(("", ", label_smoothing=0.1"))
    red = b.rng.choice(("", ", reduction='sum'", ", reduction='none'"))
    expr = f"F.cross_entropy({a.name}.reshape({rows}, {a.shape[-1]}), {name}{smooth}{red})"
    b.emit(expr, (rows,) if "none" in red else ())


def attention(b: Builder) -> None:
    """scaled_dot_product_attention of a [..., T, D] value with itself."""
    a = b.pick()
    if len(a.shape) < 3:
        return
    causal = b.rng.choice((True, False))
    n = a.name
    b.emit(
        f"F.scaled_dot_product_attention({n}, torch.tanh({n}), {n}, is_causal={causal})", a.shape
    )


def batch_norm(b: Builder) -> None:
    """F.batch_norm in training mode over [N, C, ...]: the running statistics are inputs
    that require no grad, updated in place (the result compares them after the call)."""
    a = b.pick()
    if len(a.shape) < 2 or math.prod(a.shape) == a.shape[1]:
        return  # one value a channel: the batch variance is undefined
    c = a.shape[1]
    mean, var = b.buffer((c,)), b.buffer((c,), "positive")
    w, bias = b.param((c,)), b.param((c,))
    expr = f"F.batch_norm({a.name}, {mean}, {var}, {w}, {bias}, training=True, momentum=0.1)"
    b.emit(expr, a.shape)


def group_norm(b: Builder) -> None:
    a = b.pick()
    if len(a.shape) < 2:
        return
    c = a.shape[1]
    per_channel = math.prod(a.shape[2:])
    # a group of one value normalizes to its bias whatever it is: a gradient that is 0 in
    # exact arithmetic, and rounding times 1/sqrt(eps) in any other summation order than
    # ATen's (no model has such groups)
    groups = [g for g in (1, 2, 3, 4) if c % g == 0 and c // g * per_channel >= 2]
    if not groups:
        return
    groups = b.rng.choice(groups)
    w, bias = b.param((c,)), b.param((c,))
    b.emit(f"F.group_norm({a.name}, {groups}, {w}, {bias}, eps=1e-5)", a.shape)


def loss(b: Builder) -> None:
    """A pointwise loss against another value of the same shape, reduced or not."""
    a = b.pick()
    other = b.same_shape(a.shape)
    if other is None or other is a:
        return
    red = b.rng.choice(("mean", "sum", "none"))
    kind = b.rng.choice(("mse_loss", "smooth_l1_loss", "l1_loss", "bce"))
    target = other.name
    if kind == "bce":  # probabilities as targets
        kind, target = "binary_cross_entropy_with_logits", f"torch.sigmoid({other.name})"
    b.emit(f"F.{kind}({a.name}, {target}, reduction='{red}')", a.shape if red == "none" else ())


def gather(b: Builder) -> None:
    """torch.gather along the last dim, or index_select of rows: integer ids in range."""
    a = b.pick()
    if not a.shape or a.shape[-1] < 1 or 0 in a.shape:
        return
    name = f"x{len(b.program.inputs)}"
    if b.rng.random() < 0.5:
        k = b.rng.choice((1, 2, 5))
        shape = a.shape[:-1] + (k,)
        b.program.inputs.append(Input(name, shape, "ids", high=a.shape[-1]))
        b.emit(f"torch.gather({a.name}, -1, {name})", shape)
    else:
        k = b.rng.choice((1, 3, 7))
        b.program.inputs.append(Input(name, (k,), "ids", high=a.shape[0]))
        b.emit(f"{a.name}.index_select(0, {name})", (k,) + a.shape[1:])


def chunks(b: Builder) -> None:
    """torch.chunk / split of the last dim into pieces used apart (q and k out of one
    projection), or torch.stack of a value with another of its shape."""
    a = b.pick()
    if not a.shape or a.shape[-1] < 2:
        return
    c = a.shape[-1]
    if b.rng.random() < 0.3 and (other := b.same_shape(a.shape)) is not None:
        shape = a.shape[:-1] + (2,) + a.shape[-1:]
        b.emit(f"torch.stack([{a.name}, torch.sigmoid({other.name})], dim=-2)", shape)
        return
    first = c // 2 if b.rng.random() < 0.5 else 1
    p = b.emit(f"{a.name}.split([{first}, {c - first}], dim=-1)[0]", a.shape[:-1] + (first,))
    q = b.emit(f"{a.name}.chunk(2, dim=-1)[-1]", a.shape[:-1] + (c - (c + 1) // 2,))
    if q.shape == p.shape:
        b.emit(f"{p.name} * {q.name}", p.shape)


def masked_softmax(b: Builder) -> None:
    """Scores masked to -inf before a softmax, a causal mask or a random one: a row masked
    whole gives NaN in eager, which fuser must give too."""
    a = b.pick()
    if not a.shape:
        return
    n, c = a.name, a.shape[-1]
    if len(a.shape) >= 2 and b.rng.random() < 0.5:
        r = a.shape[-2]
        mask = f"torch.ones({r}, {c}, dtype=torch.bool, device={n}.device).triu(1)"
    else:
        mask = f"{n} > 0.8"
    b.emit(f"torch.softmax({n}.masked_fill({mask}, float('-inf')), dim=-1)", a.shape)


def repeat_heads(b: Builder) -> None:
    """repeat_interleave over a middle dim (grouped-query attention's repeat_kv)."""
    a = b.pick()
    if len(a.shape) < 3:
        return
    k = b.rng.choice((2, 3))
    shape = a.shape[:1] + (a.shape[1] * k,) + a.shape[2:]
    if math.prod(shape) > b.sizes.max_numel:
        return
    b.emit(f"{a.name}.repeat_interleave({k}, dim=1)", shape)


def conv(b: Builder) -> None:
    """A 1-d convolution over [N, C, L] (a patch embedding's kind of op: ATen's, with
    fused work around it)."""
    a = b.pick()
    if len(a.shape) != 3 or a.shape[2] < 3:
        return
    n, c, length = a.shape
    out = b.rng.choice((4, c))
    w = b.param((out, c, 3))
    if math.prod((n, out, length)) > b.sizes.max_numel:
        return
    b.emit(f"F.conv1d({a.name}, {w}, padding=1)", (n, out, length))
