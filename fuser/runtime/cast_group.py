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

from fuser.codegen.triton.templates import HELPERS
from fuser.runtime.kernel import _direct_launches, launch_hooked, raw_stream
from fuser.runtime.triton_backend import load_module

BLOCK = 1024  # elements a program casts: 8 a thread over 4 warps
NUM_WARPS = 4
MAX_TENSORS = 8  # tensors a launch takes (the kernel's branches)
MAX_ELEMENTS = 2**31 - BLOCK  # offsets are 32-bit


_TL = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
}
CASTABLE = frozenset(_TL)


_HALF = (torch.float16, torch.bfloat16)


def _convert(x: str, src: torch.dtype, dst: torch.dtype, interpreted: bool) -> str:
    """`x` (of `src`) as `dst`. Triton's interpreter truncates to bfloat16 and flushes
    bf16 subnormals when it widens, where a GPU and torch round to nearest even: there
    the bf16_rne / bf16_wide helpers convert (as the generated kernels do). float64 goes
    to a 16-bit float through float32, as torch (c10 converts a double to float first)
    and the single cast's kernel (codegen/triton/render.py) do: straight, numpy (the
    interpreter) and a GPU round once, and 1 + 2**-11 + 2**-40 became float16
    1.0009765625 instead of torch's 1.0."""
    if src == dst:
        return x
    if dst in _HALF and src not in (torch.float32, dst):
        return _convert(_convert(x, src, torch.float32, interpreted), torch.float32, dst,
                        interpreted)  # fmt: skip
    if interpreted and dst == torch.bfloat16:
        return f"bf16_rne({x})"
    if interpreted and src == torch.bfloat16:
        wide = f"bf16_wide({x})"
        return wide if dst == torch.float32 else f"{wide}.to({_TL[dst]})"
    return f"{x}.to({_TL[dst]})"


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
    for k, (src, dst) in enumerate(casts):
        start = "0" if k == 0 else f"end{k - 1}"
        word = "if" if k == 0 else "elif"
        body += [
            f"    {word} pid < end{k}:",
            f"        offs = (pid - {start}) * BLOCK + tl.arange(0, BLOCK)",
            f"        x = tl.load(src{k} + offs, mask=offs < n{k})",
            f"        tl.store(dst{k} + offs, {_convert('x', src, dst, interpreted)}, "
            f"mask=offs < n{k})",
        ]
    text = "\n".join(body)
    for helper in ("bf16_rne", "bf16_wide"):
        if f"{helper}(" in text:
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

    def launch(self, tensors: Sequence[torch.Tensor]) -> None:
        """Cast src_k into dst_k for each k (`tensors`: src0, dst0, src1, dst1, ...), on
        torch's current stream. The call program checks what the kernel is specialized
        to (dtypes, 16-byte alignment) before it calls this; nothing is checked here."""
        first = tensors[0]
        if self._fast is not None and not launch_hooked():
            pointers = [t.data_ptr() for t in tensors]
            self._fast(raw_stream(first.get_device()), self._args(pointers))
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
