"""Random PyTorch programs, as Python source: what torch.compile hands fuser.

A program is a function of a few float inputs (activations that require grad, parameters,
sometimes integer ids) whose body is a random chain of the ops transformer models are made
of (ops.py): pointwise math, row and column reductions, norms (library and written out),
softmax, views (reshape, transpose, permute, slices with a step, narrow, expand, cat,
unsqueeze), matmuls and embeddings, in-place ops, ending in one to three returned values.
The builder (builder.py) tracks every value's shape, so each program runs in eager; values
stay bounded (exp of a tanh, division by 1 + x^2), so a difference is the compiler's, not
overflow's.

Everything is drawn from one `random.Random(seed)`: a seed is a repro.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from fuser.fuzz.programs import layers, ops
from fuser.fuzz.programs.blocks import draw_block_program
from fuser.fuzz.programs.builder import CPU, GPU, Builder, Input, Program, Sizes
from fuser.fuzz.programs.ops import unary

OPS: tuple[tuple[Callable[[Builder], None], float], ...] = (
    (unary, 3.0),
    (ops.binary, 3.0),
    (ops.reduce, 1.5),
    (ops.row_op, 1.5),
    (ops.view, 3.0),
    (ops.in_place, 0.4),
    (ops.positions, 0.3),
    (ops.argmax, 0.15),
    (layers.matmul, 1.0),
    (layers.embedding, 0.3),
    (layers.cross_entropy, 0.3),
    (layers.attention, 0.3),
    (layers.batch_norm, 0.2),
    (layers.group_norm, 0.2),
    (layers.loss, 0.2),
    (layers.gather, 0.3),
    (layers.chunks, 0.3),
    (layers.masked_softmax, 0.3),
    (layers.repeat_heads, 0.15),
    (layers.conv, 0.15),
)

__all__ = ["CPU", "GPU", "Input", "Program", "Sizes", "draw_program"]


def _start(b: Builder) -> None:
    """The first input: [B, T, C]-like, 1 to 4 dims, within half the largest size."""
    rng = b.rng
    while True:
        shape = tuple(rng.choice(b.sizes.dims) for _ in range(rng.choice((1, 2, 3, 3, 4))))
        if 1 < math.prod(shape) <= b.sizes.max_numel // 2:
            break
    if rng.random() < 0.03:  # an empty batch
        shape = (0,) + shape[1:]
    b.input(shape, grad=rng.random() < 0.8)
    if rng.random() < 0.4:  # a second activation of the same shape (a residual stream)
        b.input(shape, grad=rng.random() < 0.5)


BLOCKS_EVERY = 5  # one seed in five draws a transformer program (blocks.py)


def draw_program(seed: int, length: int | None = None, sizes: Sizes = CPU) -> Program:
    """The program of `seed`: a transformer (blocks.py) for one seed in BLOCKS_EVERY,
    else a chain of 3 to 14 ops (or `length`) with one to three returns; its dims drawn
    from `sizes`."""
    if length is None and seed % BLOCKS_EVERY == 0:
        return draw_block_program(seed, sizes).program
    rng = random.Random(seed)
    b = Builder(rng, seed, sizes)
    _start(b)
    n = length if length is not None else rng.randint(3, 14)
    fns, weights = zip(*OPS)
    for _ in range(n):
        rng.choices(fns, weights)[0](b)
    computed = [v for v in b.values if v.name.startswith("v")]
    if not computed:
        unary(b)
        computed = [b.values[-1]]
    returns = [computed[-1]]
    extra = [v for v in computed[:-1] if rng.random() < 0.25]
    returns += extra[:2]
    b.program.returns = [v.name for v in returns] + b.ints[:1]
    return b.program
