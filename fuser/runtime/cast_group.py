"""Several casts of whole contiguous tensors in one kernel launch (a horizontal fusion).

Under autocast every step casts each weight to bf16 in the forward and each weight
gradient back to float32 in the backward: ~160 launches a step for a 12-layer model, each
a tiny kernel that costs more host time than GPU time. The call program
(fuser/dynamo/program/casts.py) gathers such casts (of graph inputs, moved earlier; of
computed values, moved later) and launches them as one `CastGroup`: program p works on
the tensor whose program range holds p, a block of BLOCK elements of it.

The kernel is specialized on the number of tensors and their dtypes only; element counts
and program ranges are arguments, so a model whose layers repeat compiles one kernel per
group shape, not one per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from fuser.codegen.triton.render import cast_value
from fuser.codegen.triton.templates import HELPERS
from fuser.ir.dtypes import dtype_of
from fuser.runtime.kernel import _direct_launches, launch_hooked, raw_stream
from fuser.runtime.triton_backend import load_module

BLOCK = 1024  # elements a program casts: 8 a thread over 4 warps
NUM_WARPS = 4
MAX_TENSORS = 8  # tensors a launch takes (the kernel's branches)
MAX_ELEMENTS = 2**31 - BLOCK  # offsets are 32-bit


CASTABLE = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})


def source(casts: Sequence[tuple[torch.dtype, torch.dtype]], interpreted: bool = False) -> str:
    """The Triton source of a group of casts, (source dtype, destination dtype) each:
    arguments src_k, dst_k, n_k (its element count) and end_k (the first program past
    tensor k) for each k."""
    count = len(casts)
    params = ", ".join(f"src{k}, dst{k}, n{k}, end{k}" for k in range(count))
    what = ", ".join(f"{str(a).removeprefix('torch.')} -> {str(b).removeprefix('torch.')}"
                     for a, b in casts)  # fmt: skip
    lines = [
        f"# fuser cast group: {count} whole-tensor casts in one launch ({what})",
        "# (fuser/runtime/cast_group.py); program p casts a block of the tensor whose",
        "# program range [end_{k-1}, end_k) holds p",
        "import triton",
        "import triton.language as tl",
        "",
        f"BLOCK = tl.constexpr({BLOCK})",
        "",
    ]
    body = [
        "@triton.jit",
        f"def cast_group_{count}({params}):",
        "    pid = tl.program_id(0)",
    ]
    helpers: set[str] = set()
    for k, (src, dst) in enumerate(casts):
        start = "0" if k == 0 else f"end{k - 1}"
        word = "if" if k == 0 else "elif"
        # the IR cast's own conversion (float64 to a 16-bit float through float32, as
        # torch; the interpreter's bf16 helpers), as the single cast's kernel writes it
        y = cast_value("x", dtype_of(src), dtype_of(dst), interpreted, helpers)
        body += [
            f"    {word} pid < end{k}:",
            f"        offs = (pid - {start}) * BLOCK + tl.arange(0, BLOCK)",
            f"        x = tl.load(src{k} + offs, mask=offs < n{k})",
            f"        tl.store(dst{k} + offs, {y}, mask=offs < n{k})",
        ]
    for helper in sorted(helpers):
        lines += ["", HELPERS[helper].rstrip("\n"), ""]
    return "\n".join(lines + ["", *body]) + "\n"


def blocks(n: int) -> int:
    return -(-n // BLOCK)


@dataclass
class CastGroup:
    """The casts src_k -> dst_k of tensors of `sizes` elements (contiguous, the same
    element count each side) from and to `casts`' dtypes, launched together. `launch`
    takes the tensors in the order src0, dst0, src1, dst1, ..."""

    sizes: tuple[int, ...]
    casts: tuple[tuple[torch.dtype, torch.dtype], ...]
    _ends: tuple[int, ...] = field(init=False)
    _module: Any = field(default=None, repr=False)
    _fast: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 < len(self.sizes) <= MAX_TENSORS:
            raise ValueError(f"a cast group takes 1 to {MAX_TENSORS} tensors, not {self.sizes}")
        if len(self.casts) != len(self.sizes) or any(
            a not in CASTABLE or b not in CASTABLE for a, b in self.casts
        ):
            raise ValueError(f"cast group dtypes must be float pairs, one a tensor: {self.casts}")
        if any(n <= 0 or n > MAX_ELEMENTS for n in self.sizes):
            raise ValueError(f"cast group sizes must be in 1..{MAX_ELEMENTS}: {self.sizes}")
        ends, acc = [], 0
        for n in self.sizes:
            acc += blocks(n)
            ends.append(acc)
        self._ends = tuple(ends)

    @property
    def name(self) -> str:
        return f"cast_group_{len(self.sizes)}"

    @property
    def programs(self) -> int:
        return self._ends[-1]

    def _args(self, tensors: Sequence[Any]) -> list:
        out: list = []
        for k, (n, end) in enumerate(zip(self.sizes, self._ends)):
            out += [tensors[2 * k], tensors[2 * k + 1], n, end]
        return out

    def launch(self, tensors: Sequence[torch.Tensor], stream: int | None = None) -> None:
        """Cast src_k into dst_k for each k (`tensors`: src0, dst0, src1, dst1, ...), on
        `stream` (the call program's, read once per call) or torch's current one. The
        call program checks what the kernel is specialized to (dtypes, 16-byte alignment)
        before it calls this; nothing is checked here."""
        first = tensors[0]
        if self._fast is not None and not launch_hooked():
            if stream is None:
                stream = raw_stream(first.get_device())
            self._fast(stream, self._args([t.data_ptr() for t in tensors]))
            return
        interp = first.device.type != "cuda"
        if self._module is None:
            self._module = load_module(source(self.casts, interp), interp)
        kernel = getattr(self._module, self.name)
        args = self._args(tensors)
        # the JIT compiles for the current device: make it the tensors' (as Kernel does)
        with torch.cuda.device(first.device) if not interp else nullcontext():
            compiled = kernel[(self.programs,)](*args, num_warps=NUM_WARPS)
        if not interp and compiled is not None:
            fast = _direct_launches(compiled, (self.programs, 1, 1), None, (1, 1, 1), len(args))
            self._fast = fast[0] if fast else None
