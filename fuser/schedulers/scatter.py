"""The row scatter-add's scheduler: embedding backward, index_add and index_put(accumulate).

All three are one computation, out[v, :] = base[v, :] + alpha * sum of src[t, :] over the
tokens t whose index[t] == v (base absent: zeros; embedding backward: no base, alpha 1,
the padding row zero, optionally each token scaled by 1 / its index's count). Two ways to
run it (codegen/triton/scatter.py renders both):

  sorted (the default, deterministic): the indices are sorted (ATen's stable sort, so
      equal indices keep token order), each output row's run of tokens in them found by
      torch.searchsorted (one thread a row: a binary search per program was 14 dependent
      L2 loads before any work), and one program owns a block of output rows x a block
      of columns: it sums each run's src rows in fp32 in sorted order (the same order
      every run, so two runs give the same bits) and writes every row of its block once:
      rows with no token get zeros (or base), so no separate zero fill either.
  atomic (FUSER_SCATTER=atomic, opt-in): one program per block of tokens x columns adds
      its src rows into an fp32 accumulator with atomic adds, then ATen casts it to the
      output's dtype. No sort, but the order of the adds changes from run to run, so the
      result's last bits do too (not deterministic).

This module decides, once per call shape, which way and the tiles, as a ScatterPlan with
its reasons; the renderer only prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuser.explanation import Explanation

MODES = ("sorted", "atomic")
# elements per program's tile: 2048, 8 fp32 accumulators a thread at 8 warps. ptxas for
# sm_90 (Triton 3.6, no GPU needed) gave the sorted kernel at 768 bf16 columns 62
# registers for an 8 x 256 tile and 125 for 16 x 256 (each element carries its own
# 64-bit address of a gathered row): the smaller tile keeps 4 blocks (32 warps) an SM
TILE = 2048
# the widest column block: 512 fp32 accumulators a row; wider rows take several blocks
MAX_BLOCK_H = 512
# row blocks enough to fill a GPU on their own: two programs per SM of an H100 (132 SMs).
# Fewer, and each column block of a row block gets its own program
FILL_PROGRAMS = 264


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


@dataclass(frozen=True)
class ScatterShape:
    """One call: `tokens` src rows of `cols` elements added into `rows` output rows."""

    tokens: int
    rows: int
    cols: int
    dtype: str  # the output's dtype, as torch names it
    index_dtype: str
    scale_by_freq: bool = False
    padding_idx: int | None = None
    has_base: bool = False
    alpha: float = 1.0

    def line(self) -> str:
        extra = []
        if self.padding_idx is not None:
            extra.append(f"padding_idx={self.padding_idx}")
        if self.scale_by_freq:
            extra.append("scale_grad_by_freq")
        if self.has_base:
            extra.append("into a base")
        if self.alpha != 1.0:
            extra.append(f"alpha={self.alpha}")
        tail = f" ({', '.join(extra)})" if extra else ""
        return (
            f"{self.tokens} tokens x {self.cols} -> [{self.rows}, {self.cols}] "
            f"{self.dtype.replace('torch.', '')}, {self.index_dtype.replace('torch.', '')} "
            f"index{tail}"
        )


@dataclass(frozen=True)
class ScatterPlan:
    """The tiles of one scatter-add and why."""

    shape: ScatterShape
    mode: str  # sorted | atomic
    block_rows: int  # sorted: output rows a program owns; atomic: tokens a program adds
    block_cols: int  # columns a program covers at a time
    col_programs: int  # sorted: programs sharing a row block's column blocks (grid[1])
    num_warps: int
    deterministic: bool
    reasons: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"scatter_{self.mode}_r{self.block_rows}_c{self.block_cols}_w{self.num_warps}"

    def grid(self) -> tuple[int, int]:
        s = self.shape
        if self.mode == "sorted":
            return (-(-s.rows // self.block_rows), self.col_programs)
        return (-(-s.tokens // self.block_rows), -(-s.cols // self.block_cols))

    def line(self) -> str:
        det = "deterministic" if self.deterministic else "NOT deterministic (atomic adds)"
        g = self.grid()
        return (
            f"{self.mode} scatter-add [triton], {det}: {self.block_rows} "
            f"{'rows' if self.mode == 'sorted' else 'tokens'} x {self.block_cols} columns a "
            f"program, {self.num_warps} warps, grid {g}"
        )

    def explain(self) -> Explanation:
        lines = [f"scatter-add {self.shape.line()}", self.line()]
        lines += [f"  - {r}" for r in self.reasons]
        return Explanation("\n".join(lines))


def plan_scatter(shape: ScatterShape, mode: str) -> ScatterPlan:
    """The plan of `shape` run `mode`'s way (sorted or atomic)."""
    if mode not in MODES:
        raise ValueError(f"scatter mode {mode!r}; expected one of {MODES}")
    if mode == "atomic" and shape.scale_by_freq:
        # the per-index counts need the sort (or a second pass) anyway
        mode = "sorted"
        why_mode = "scale_grad_by_freq needs each index's count: the sorted way gives it"
    elif mode == "atomic":
        why_mode = (
            "FUSER_SCATTER=atomic: fp32 atomic adds into an accumulator, no sort; the order "
            "of the adds varies, so the last bits of the result may differ between runs"
        )
    else:
        why_mode = (
            "sorted (default): stable sort of the indices and each row's run in them "
            "(torch.sort, torch.searchsorted), each output row sums its tokens in fp32 in "
            "sorted order; two runs give the same bits"
        )
    cols = shape.cols
    # the widest power-of-two column block whose padding of the row wastes at most 1/8 of
    # its lanes (768 -> 256: three exact blocks; 600 -> 128: five, 6% masked; 13 -> 16)
    block_cols = 32
    for c in (MAX_BLOCK_H, 256, 128, 64, 32):
        padded = -(-cols // c) * c
        if 8 * (padded - cols) <= padded:
            block_cols = c
            break
    if cols < block_cols:
        block_cols = _next_pow2(cols)
    why_cols = f"{block_cols} columns a program at a time: " + (
        "divides the row" if cols % block_cols == 0 else f"the row of {cols} masked"
    )
    across = shape.rows if mode == "sorted" else shape.tokens
    # a tile of ~TILE elements, but blocks enough to fill the GPU when there are rows for
    # it (a narrow row would otherwise give a few programs of thousands of rows); at
    # least 16 rows a program (Triton's interpreter pays per program)
    block_rows = min(TILE // block_cols, max(16, _pow2_at_most(across // FILL_PROGRAMS)))
    block_rows = max(1, min(block_rows, _next_pow2(max(1, across))))
    what = "output rows" if mode == "sorted" else "tokens"
    why_rows = (
        f"{block_rows} {what} a program: a tile of at most ~{TILE} fp32 accumulators, "
        f"{-(-across // block_rows)} blocks"
    )
    warps = 8 if block_rows * block_cols >= 2048 else 4 if block_rows * block_cols >= 512 else 1
    reasons = [why_mode, why_cols, why_rows]
    col_blocks = -(-cols // block_cols)
    col_programs = 1
    if mode == "sorted" and col_blocks > 1:
        row_blocks = -(-shape.rows // block_rows)
        if row_blocks < FILL_PROGRAMS:
            col_programs = col_blocks
            reasons.append(
                f"{row_blocks} row blocks cannot fill the GPU: each of the {col_blocks} "
                "column blocks gets its own program"
            )
        else:
            reasons.append(
                f"{row_blocks} row blocks fill the GPU: a program walks its {col_blocks} "
                "column blocks"
            )
    return ScatterPlan(
        shape, mode, block_rows, block_cols, col_programs, warps, mode == "sorted",
        tuple(reasons),
    )  # fmt: skip


def shape_of(
    src: torch.Tensor,
    index: torch.Tensor,
    rows: int,
    out_dtype: torch.dtype,
    scale_by_freq: bool = False,
    padding_idx: int | None = None,
    has_base: bool = False,
    alpha: float = 1.0,
) -> ScatterShape:
    cols = int(src.shape[-1]) if src.dim() else 1
    return ScatterShape(
        index.numel(), int(rows), cols, str(out_dtype), str(index.dtype), bool(scale_by_freq),
        padding_idx, has_base, float(alpha),
    )  # fmt: skip
