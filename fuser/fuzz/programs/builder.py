"""The program being drawn (fuzz/programs): its inputs, its lines, the shapes of its live
values, and the sizes dims are drawn from. The ops that grow it are ops.py's."""

from __future__ import annotations

import random
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
    """A program argument: `kind` "float" (randn), "positive" (in [0.5, 1.5)) or "ids"
    (int64 in [0, high));
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
class Value:
    name: str
    shape: Shape


class Builder:
    """The program being drawn: its inputs, lines and live float values."""

    def __init__(self, rng: random.Random, seed: int, sizes: Sizes):
        self.rng = rng
        self.sizes = sizes
        self.program = Program(seed, [])
        self.values: list[Value] = []
        self.count = 0
        self.mutable: set[str] = set()  # inputs that do not require grad
        self.ints: list[str] = []  # integer results (argmax)

    def input(self, shape: Shape, grad: bool, layout: str | None = None) -> Value:
        name = f"x{len(self.program.inputs)}"
        lay = layout or self.rng.choice(LAYOUTS)
        if lay == "transposed" and len(shape) < 2:
            lay = "contiguous"
        self.program.inputs.append(Input(name, shape, "float", grad, lay))
        if not grad:
            self.mutable.add(name)
        v = Value(name, shape)
        self.values.append(v)
        return v

    def buffer(self, shape: Shape, kind: str = "float") -> str:
        """An input that requires no grad (running statistics: `kind` "positive" for a
        variance), which a program may update in place."""
        name = f"x{len(self.program.inputs)}"
        self.program.inputs.append(Input(name, shape, kind, False))
        return name

    def param(self, shape: Shape) -> str:
        name = f"w{len(self.program.inputs)}"
        self.program.inputs.append(Input(name, shape, "float", True))
        return name

    def emit(self, expr: str, shape: Shape) -> Value:
        self.count += 1
        v = Value(f"v{self.count}", shape)
        self.program.lines.append(f"{v.name} = {expr}")
        self.values.append(v)
        return v

    def pick(self) -> Value:
        """A live value, the latest most often (chains, which fusion grows on)."""
        if self.rng.random() < 0.6:
            return self.values[-1]
        return self.rng.choice(self.values)

    def same_shape(self, shape: Shape) -> Value | None:
        got = [v for v in self.values if v.shape == shape]
        return self.rng.choice(got) if got else None
