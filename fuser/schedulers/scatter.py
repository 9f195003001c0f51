"""The row scatter-add's scheduler: embedding backward, index_add and index_put(accumulate).

All three are one computation, out[v, :] = base[v, :] + alpha * sum of src[t, :] over the
tokens t whose index[t] == v (base absent: zeros; embedding backward: no base, alpha 1,
the padding row zero, optionally each token scaled by 1 / its index's count). Four ways
to run it (codegen/triton/scatter.py renders them); the first three are deterministic
(every run sums in the same order, so gives the same bits) and FUSER_SCATTER=sorted, the
default, picks among them from the shape:

  runs (many rows, few tokens each: GPT-2's 50257 x 768 at 16384 tokens): the indices
      sorted (ATen's stable sort, so equal indices keep token order), each output row's
      run of tokens in them found by torch.searchsorted (one thread a row: a binary
      search per program was 14 dependent L2 loads before any work), and one program
      owns a block of output rows x a block of columns: it sums each run's src rows in
      fp32 in sorted order and writes every row of its block once: rows with no token
      get zeros (or base), so no separate zero fill either. A run is one program's serial
      loop: fine for runs of a few tokens, hopeless for one of 8192.
  split (rows enough not to fit `table`, runs long on average): the runs kernel with
      each run cut into `parts` fixed pieces, each piece summed by its own program into
      an fp32 partial [parts, rows, cols]; a second small launch (finalize) adds the
      partials of each element in piece order.
  table (few rows, many tokens each: T5's relative position bias, 32 rows x 12 heads
      at 262144 tokens; BERT's token types, 2 x 768): no sort at all. Each program sums a
      fixed chunk of tokens into a partial of the whole (tiny) table, [rows, cols] in
      fp32, as a one-hot product: onehot[rows, tokens] @ src[tokens, cols] (tl.dot, on
      tensor cores for 16-bit rows, exact fp32 FMAs for fp32 ones); finalize then adds
      the chunks' partials of each element in chunk order (a column sum of
      [chunks, rows * cols]). A step whose rows hold an inf or a NaN is added token by
      token instead, so a non-finite row stays in its own output row (0 * inf in the
      product would make every row NaN).
  atomic (FUSER_SCATTER=atomic, opt-in): one program per block of tokens x columns adds
      its src rows into an fp32 accumulator with atomic adds, then ATen casts it to the
      output's dtype. No sort, but the order of the adds changes from run to run, so the
      result's last bits do too (not deterministic).

This module decides, once per call shape, which way and the tiles, as a ScatterPlan with
its reasons; the renderer only prints it. `how` (FUSER_SCATTER, scatter_add_rows's
argument) may also name runs, split or table to force one (tests, benchmarks); where that
one cannot take the shape, the plan says so and takes the default's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuser.explanation import Explanation

MODES = ("sorted", "atomic", "runs", "split", "table")
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
# table: at most this many rows (the one-hot product does rows multiply-adds per src
# element: 128 keeps bf16 on tensor cores far under the memory time), and runs of at
# least TABLE_MIN_RUN tokens on average (shorter runs: the runs kernel's loops are short
# and the table's rows-fold work buys nothing)
TABLE_MAX_ROWS = 128
TABLE_MIN_RUN = 8
# table: a program's accumulator [rows, columns], its src step [tokens, columns] and its
# one-hot [rows, tokens] at most this many elements each (32 fp32 registers a thread at
# 4 warps); tl.dot needs every side >= 16
TABLE_TILE = 4096
DOT_MIN = 16
# split: runs of at least SPLIT_MIN_RUN tokens on average are cut into pieces of about
# SPLIT_PIECE tokens (a piece is a serial loop of dependent gathered loads, ~1 us of
# latency each on an H100), at most SPLIT_MAX_PARTS of them
SPLIT_MIN_RUN = 32
SPLIT_PIECE = 16
SPLIT_MAX_PARTS = 64
# table: a chunk holds at least 4 tokens a table row, so its fp32 partial (4 bytes an
# element of each row) weighs no more than the chunk's 16-bit src rows: writing and
# reading the partials costs at most the src's own traffic
CHUNK_PER_ROW = 4
# the fp32 partials of split and table: at most 4M elements (16 MB written and read once)
WORKSPACE_ELEMS = 1 << 22
# finalize: [partials, elements] tiles of at most this many fp32 values
FINALIZE_TILE = 4096


def _pow2_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
class Finalize:
    """The second launch of split and table: each element's fp32 partials added in
    order, `block_parts` partials x `block_elems` elements of [rows * cols] at a time."""

    parts: int
    block_parts: int
    block_elems: int
    num_warps: int

    def grid(self, shape: ScatterShape) -> tuple[int]:
        return (_cdiv(shape.rows * shape.cols, self.block_elems),)

    def line(self, shape: ScatterShape) -> str:
        return (
            f"finalize: {self.parts} fp32 partials of each element added in order, "
            f"{self.block_parts} partials x {self.block_elems} elements a step, "
            f"{self.num_warps} warps, grid {self.grid(shape)}"
        )


@dataclass(frozen=True)
class ScatterPlan:
    """The tiles of one scatter-add and why."""

    shape: ScatterShape
    mode: str  # what was asked: one of MODES (ScatterCall asks it again)
    kind: str  # what runs: runs | split | table | atomic
    block_rows: int  # runs/split: output rows a program owns; table: the table's rows,
    # padded; atomic: tokens a program adds
    block_cols: int  # columns a program covers at a time
    col_programs: int  # runs/split: programs sharing a row block's column blocks
    num_warps: int
    deterministic: bool
    reasons: tuple[str, ...]
    parts: int = 1  # split: pieces a run is cut into; table: token chunks (programs)
    block_tokens: int = 0  # table: tokens of one one-hot product (its K)
    chunk_tokens: int = 0  # table: tokens a program sums
    finalize: Finalize | None = None  # split and table: adding the partials

    @property
    def name(self) -> str:
        tail = f"_p{self.parts}" if self.finalize else ""
        return f"scatter_{self.kind}_r{self.block_rows}_c{self.block_cols}_w{self.num_warps}{tail}"

    def grid(self) -> tuple[int, ...]:
        s = self.shape
        if self.kind in ("runs", "split"):
            g = (_cdiv(s.rows, self.block_rows), self.col_programs)
            return g + (self.parts,) if self.kind == "split" else g
        if self.kind == "table":
            return (self.parts, _cdiv(s.cols, self.block_cols))
        return (_cdiv(s.tokens, self.block_rows), _cdiv(s.cols, self.block_cols))

    def line(self) -> str:
        det = "deterministic" if self.deterministic else "NOT deterministic (atomic adds)"
        g = self.grid()
        if self.kind == "table":
            what = (
                f"chunks of {self.chunk_tokens} tokens into a [{self.block_rows}, "
                f"{self.block_cols}] partial table a program, one-hot products of "
                f"{self.block_tokens} tokens"
            )
        elif self.kind == "atomic":
            what = f"{self.block_rows} tokens x {self.block_cols} columns a program"
        else:
            what = f"{self.block_rows} rows x {self.block_cols} columns a program"
            if self.kind == "split":
                what += f", each run cut into {self.parts} pieces"
        label = {"runs": "sorted", "split": "sorted split"}.get(self.kind, self.kind)
        fin = f"; {self.finalize.line(self.shape)}" if self.finalize else ""
        return f"{label} scatter-add [triton], {det}: {what}, {self.num_warps} warps, grid {g}{fin}"

    def explain(self) -> Explanation:
        lines = [f"scatter-add {self.shape.line()}", self.line()]
        lines += [f"  - {r}" for r in self.reasons]
        return Explanation("\n".join(lines))


def _block_cols(cols: int, cap: int = MAX_BLOCK_H, floor: int = 1) -> int:
    """The widest power-of-two column block (<= cap) whose padding of the row wastes at
    most 1/8 of its lanes (768 -> 256: three exact blocks; 600 -> 128: five, 6% masked;
    13 -> 16), at least `floor`."""
    block = 32
    for c in (512, 256, 128, 64, 32):
        padded = _cdiv(cols, c) * c
        if c <= cap and 8 * (padded - cols) <= padded:
            block = c
            break
    block = min(block, cap)
    if cols < block:
        block = _next_pow2(cols)
    return max(floor, block)


def _cols_reason(cols: int, block: int) -> str:
    return f"{block} columns a program at a time: " + (
        "divides the row" if cols % block == 0 else f"the row of {cols} masked"
    )


def _finalize(shape: ScatterShape, parts: int) -> Finalize:
    # element blocks enough to fill the GPU where the table has elements for it, at least
    # 16 contiguous fp32 (64 bytes of each partial row)
    elems = shape.rows * shape.cols
    block_elems = max(16, min(512, _pow2_at_most(elems // FILL_PROGRAMS)))
    block_elems = min(block_elems, max(16, _next_pow2(elems)))
    block_parts = max(1, min(_next_pow2(parts), FINALIZE_TILE // block_elems))
    warps = 4 if block_parts * block_elems >= 1024 else 1
    return Finalize(parts, block_parts, block_elems, warps)


def _choose(shape: ScatterShape, mode: str) -> tuple[str, str]:
    """The deterministic kind for `shape` and why (mode: sorted, or the kind asked)."""
    rows, tokens = shape.rows, shape.tokens
    avg = tokens / max(1, rows)
    fits_table = 0 < rows <= TABLE_MAX_ROWS
    split_parts = _split_parts(shape)
    if mode == "table" and fits_table:
        return "table", "asked for (how=table)"
    if mode == "split" and split_parts >= 2:
        return "split", "asked for (how=split)"
    if mode == "runs":
        return "runs", "asked for (how=runs)"
    why_not = ""
    if mode == "table":
        why_not = f"table asked for, but {rows} rows > {TABLE_MAX_ROWS}: "
    elif mode == "split":
        why_not = "split asked for, but the workspace or the runs leave no pieces: "
    if fits_table and avg >= TABLE_MIN_RUN:
        return "table", why_not + (
            f"{rows} rows (<= {TABLE_MAX_ROWS}) with {avg:.0f} tokens each on average: "
            "partial tables of token chunks, no sort, no serial run"
        )
    if split_parts >= 2:
        return "split", why_not + (
            f"runs of {avg:.0f} tokens on average (>= {SPLIT_MIN_RUN}) in {rows} rows: "
            f"each cut into {split_parts} pieces summed by separate programs"
        )
    return "runs", why_not + (
        f"runs of {avg:.1f} tokens on average in {rows} rows: one program's loop each"
    )


def _split_parts(shape: ScatterShape) -> int:
    avg = shape.tokens / max(1, shape.rows)
    if avg < SPLIT_MIN_RUN:
        return 1
    room = WORKSPACE_ELEMS // max(1, shape.rows * shape.cols)
    return max(1, min(SPLIT_MAX_PARTS, _cdiv(int(avg), SPLIT_PIECE), room))


def plan_scatter(shape: ScatterShape, mode: str) -> ScatterPlan:
    """The plan of `shape` run `mode`'s way (sorted: deterministic, the kind chosen from
    the shape; atomic; or runs, split, table forced where they can take it)."""
    if mode not in MODES:
        raise ValueError(f"scatter mode {mode!r}; expected one of {MODES}")
    if mode == "atomic" and shape.scale_by_freq:
        # the per-index counts need the sort (or a second pass) anyway
        kind, why = _choose(shape, "sorted")
        why = "scale_grad_by_freq needs each index's count: a deterministic way gives it; " + why
    elif mode == "atomic":
        return _atomic(shape)
    else:
        kind, why = _choose(shape, mode)
    if kind == "table":
        return _table(shape, mode, why)
    return _runs(shape, mode, kind, why)


def _runs(shape: ScatterShape, mode: str, kind: str, why_kind: str) -> ScatterPlan:
    why_mode = (
        "stable sort of the indices and each row's run in them (torch.sort, "
        "torch.searchsorted), each output row sums its tokens in fp32 in sorted order; two "
        "runs give the same bits"
    )
    cols = shape.cols
    block_cols = _block_cols(cols)
    # a tile of ~TILE elements, but blocks enough to fill the GPU when there are rows for
    # it (a narrow row would otherwise give a few programs of thousands of rows); at
    # least 16 rows a program (Triton's interpreter pays per program)
    block_rows = min(TILE // block_cols, max(16, _pow2_at_most(shape.rows // FILL_PROGRAMS)))
    block_rows = max(1, min(block_rows, _next_pow2(max(1, shape.rows))))
    row_blocks = _cdiv(shape.rows, block_rows)
    reasons = [
        why_kind,
        why_mode,
        _cols_reason(cols, block_cols),
        f"{block_rows} output rows a program: a tile of at most ~{TILE} fp32 accumulators, "
        f"{row_blocks} blocks",
    ]
    if shape.padding_idx is not None:
        reasons.append("the padding row's run is not summed (its row is zeros)")
    warps = 8 if block_rows * block_cols >= 2048 else 4 if block_rows * block_cols >= 512 else 1
    col_blocks = _cdiv(cols, block_cols)
    parts = _split_parts(shape) if kind == "split" else 1
    col_programs = 1
    if col_blocks > 1:
        if row_blocks * parts < FILL_PROGRAMS:
            col_programs = col_blocks
            reasons.append(
                f"{row_blocks * parts} row blocks (and pieces) cannot fill the GPU: each of "
                f"the {col_blocks} column blocks gets its own program"
            )
        else:
            reasons.append(
                f"{row_blocks * parts} row blocks (and pieces) fill the GPU: a program walks "
                f"its {col_blocks} column blocks"
            )
    fin = None
    if kind == "split":
        fin = _finalize(shape, parts)
        reasons.append(
            f"each run cut into {parts} pieces of ~{_cdiv(shape.tokens, shape.rows * parts)} "
            f"tokens: {parts} x [{shape.rows}, {cols}] fp32 partials, added in piece order by "
            "a second launch (the same order every run)"
        )
    return ScatterPlan(
        shape, mode, kind, block_rows, block_cols, col_programs, warps, True, tuple(reasons),
        parts=parts, finalize=fin,
    )  # fmt: skip


def _table(shape: ScatterShape, mode: str, why_kind: str) -> ScatterPlan:
    rows, cols, tokens = shape.rows, shape.cols, shape.tokens
    table_rows = max(DOT_MIN, _next_pow2(rows))
    block_cols = _block_cols(cols, cap=max(DOT_MIN, TABLE_TILE // table_rows), floor=DOT_MIN)
    block_tokens = max(DOT_MIN, min(TABLE_TILE // block_cols, TABLE_TILE // table_rows, 128))
    block_tokens = min(block_tokens, max(DOT_MIN, _next_pow2(tokens)))
    col_blocks = _cdiv(cols, block_cols)
    # chunks: about two programs an SM in all, each a whole number of one-hot steps, at
    # least CHUNK_PER_ROW tokens a table row, and no more partials than the workspace holds
    steps = _cdiv(tokens, block_tokens)
    want = max(1, 2 * FILL_PROGRAMS // col_blocks)
    per = max(1, _cdiv(steps, want), _cdiv(CHUNK_PER_ROW * rows, block_tokens))
    per = max(per, _cdiv(steps * rows * cols, WORKSPACE_ELEMS))
    chunk_tokens = per * block_tokens
    parts = max(1, _cdiv(tokens, chunk_tokens))
    tile = table_rows * block_cols
    warps = 8 if tile >= 4096 else 4
    fin = _finalize(shape, parts)
    reasons = [
        why_kind,
        "no sort: each program sums a chunk of tokens into an fp32 partial of the whole "
        f"table, onehot[{table_rows}, {block_tokens}] @ src[{block_tokens}, {block_cols}] "
        "a step (tensor cores for 16-bit rows, fp32 FMAs for fp32), chunks in token order",
        _cols_reason(cols, block_cols) + f" (the [{table_rows}, {block_cols}] accumulator "
        f"within {TABLE_TILE} fp32)",
        f"{parts} chunks of {chunk_tokens} tokens x {col_blocks} column blocks: "
        f"{parts * col_blocks} programs, {parts} x [{rows}, {cols}] fp32 partials",
        "a step holding an inf or a NaN is added token by token (exact IEEE sums: 0 * inf "
        "in the product would reach every row)",
        f"finalize adds the {parts} partials of each element in chunk order: the same order "
        "every run, so the same bits",
    ]
    return ScatterPlan(
        shape, mode, "table", table_rows, block_cols, col_blocks, warps, True,
        tuple(reasons), parts=parts, block_tokens=block_tokens, chunk_tokens=chunk_tokens,
        finalize=fin,
    )  # fmt: skip


def _atomic(shape: ScatterShape) -> ScatterPlan:
    why_mode = (
        "FUSER_SCATTER=atomic: fp32 atomic adds into an accumulator, no sort; the order "
        "of the adds varies, so the last bits of the result may differ between runs"
    )
    block_cols = _block_cols(shape.cols)
    block_tokens = min(TILE // block_cols, max(16, _pow2_at_most(shape.tokens // FILL_PROGRAMS)))
    block_tokens = max(1, min(block_tokens, _next_pow2(max(1, shape.tokens))))
    warps = 8 if block_tokens * block_cols >= 2048 else 4 if block_tokens * block_cols >= 512 else 1
    reasons = (
        why_mode,
        _cols_reason(shape.cols, block_cols),
        f"{block_tokens} tokens a program: a tile of at most ~{TILE} fp32 values, "
        f"{_cdiv(shape.tokens, block_tokens)} blocks",
    )
    return ScatterPlan(
        shape, "atomic", "atomic", block_tokens, block_cols, 1, warps, False, reasons
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
