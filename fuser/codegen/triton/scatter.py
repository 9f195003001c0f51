"""Render the row scatter-add (embedding backward, index_add, index_put with accumulate):
one Triton module per ScatterPlan (fuser/schedulers/scatter.py decides; this prints).

  scatter_sorted  one program per (block of output rows, block of columns): each row's
                  run of tokens in the sorted indices (its bounds from torch.searchsorted),
                  its src rows summed in fp32 in sorted (token) order, every row of the
                  block written once (zeros, or base, where no token names it).
                  Deterministic.
  scatter_atomic  one program per (block of tokens, block of columns): fp32 atomic adds
                  into an accumulator (the runtime zeroes it and casts it after).

Neither writes outside the output: a bad index (< 0 or >= rows) belongs to no row's run
in the sorted indices (they sort before row 0 or after the last row), and the atomic
kernel masks it; both report it through the error record every fuser kernel with checks
uses (fuser/runtime/checks.py), so the runtime raises OutOfBoundsError naming it. Only
what the plan needs is printed: no padding test without a padding_idx, no column mask
when the column block divides the row.
"""

from __future__ import annotations

from fuser.codegen.triton.templates import HELPERS
from fuser.schedulers.scatter import ScatterPlan


def _header(plan: ScatterPlan) -> str:
    lines = [
        f"fuser scatter-add {plan.name} (triton), generated: edit the plan, not this file",
        *plan.explain().splitlines(),
    ]
    return '"""' + "\n".join(lines) + '\n"""\n'


_PRELUDE = """import triton
import triton.language as tl

"""


def _to_out(x: str, dtype: str, interpreted: bool) -> str:
    # Triton's interpreter truncates float32 -> bfloat16 where a GPU rounds to nearest
    # even: there the bf16_rne helper rounds (codegen/triton/render.py does the same)
    if dtype == "torch.bfloat16" and interpreted:
        return f"bf16_rne({x})"
    return f"{x}.to(out_ptr.dtype.element_ty)"


def _from(x: str, dtype: str, interpreted: bool) -> str:
    if dtype == "torch.bfloat16" and interpreted:
        return f"bf16_wide({x})"
    return f"{x}.to(tl.float32)"


def _sorted(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    s = plan.shape
    exact = s.cols % plan.block_cols == 0
    col_ok = "" if exact else "\n        col_ok = cols < n_cols"
    cm = "" if exact else " & col_ok"
    out_mask = f"row_ok{cm}"
    epilogue = []
    if s.scale_by_freq:
        epilogue.append(
            "        # scale_grad_by_freq: each token's row divided by its index's count, the "
            "run's length\n"
            "        acc = acc / tl.maximum(count, 1).to(tl.float32)"
        )
    if s.padding_idx is not None:
        epilogue.append(
            "        # the padding row gets no gradient\n"
            "        acc = tl.where(rows == padding_idx, 0.0, acc)"
        )
    if s.alpha != 1.0:
        epilogue.append("        acc = acc * alpha")
    if s.has_base:
        base = _from(
            f"tl.load(base_ptr + rows * base_row_stride + cols, mask={out_mask}, other=0.0)",
            s.dtype,
            interpreted,
        )
        epilogue.append(f"        acc = {base} + acc")
    load = _from(
        "tl.load(src_ptr + tok * src_row_stride + cols * src_col_stride, "
        f"mask=live{cm}, other=0.0)",
        src_dtype,
        interpreted,
    )
    return f"""
@triton.jit
def scatter_sorted(
    src_ptr, sorted_ptr, perm_ptr, bounds_ptr, out_ptr, base_ptr, err_ptr, flag_ptr,
    n_tokens, n_rows, n_cols,
    src_row_stride, src_col_stride, out_row_stride, base_row_stride,
    padding_idx, alpha,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    # rows as a [BLOCK_R, 1] column of the tile: every per-row value keeps the tile's
    # layout (1-D row vectors made ptxas shuffle between layouts, and Triton 3.6 failed to
    # compile one such load for 128 x 16 tiles)
    rows = pid_r.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    row_ok = rows < n_rows
    # a bad index sorts before row 0 or after the last row: the first program looks at
    # both ends of the sorted indices and reports one (no row's run holds it, so nothing
    # is written for it)
    ends = tl.where(tl.arange(0, 2) == 0, 0, n_tokens - 1)
    first = (pid_r == 0) & (pid_c == 0) & (n_tokens > 0)
    end_vals = tl.load(sorted_ptr + ends, mask=first, other=0)
    end_toks = tl.load(perm_ptr + ends, mask=first, other=0)
    end_bad = first & ((end_vals < 0) | (end_vals >= n_rows))
    index_error(err_ptr, flag_ptr, end_toks, end_vals, end_bad)
    # each row's run [start, start + count) in the sorted indices: the lower bounds of row
    # and row + 1 (torch.searchsorted, one thread a row, before this kernel)
    start = tl.load(bounds_ptr + rows, mask=row_ok, other=0)
    end = tl.load(bounds_ptr + rows + 1, mask=row_ok, other=0)
    count = end - start
    longest = tl.max(tl.max(count, axis=1), axis=0)
    # column blocks pid_c, pid_c + grid[1], ...: the plan gives a program every column
    # block of its rows when there are rows enough to fill the GPU
    for c0 in range(pid_c * BLOCK_C, n_cols, tl.num_programs(1) * BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)[None, :]{col_ok}
        # the run's src rows summed in fp32, in sorted order (stable: token order): the
        # same order every call, so the same bits
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
        for j in range(0, longest):
            at = start + j
            live = at < end
            tok = tl.load(perm_ptr + at, mask=live, other=0)
            acc += {load}
{chr(10).join(epilogue)}
        out = {_to_out("acc", s.dtype, interpreted)}
        tl.store(out_ptr + rows * out_row_stride + cols, out, mask={out_mask})
"""


def _atomic(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    s = plan.shape
    exact = s.cols % plan.block_cols == 0
    col_ok = "" if exact else "\n    col_ok = cols < n_cols"
    cm = "" if exact else " & col_ok[None, :]"
    skip = " & (idx != padding_idx)" if s.padding_idx is not None else ""
    scale = " * alpha" if s.alpha != 1.0 else ""
    load = _from(
        "tl.load(src_ptr + toks[:, None] * src_row_stride + cols[None, :] * src_col_stride, "
        f"mask=ok[:, None]{cm}, other=0.0)",
        src_dtype,
        interpreted,
    )
    return f"""
@triton.jit
def scatter_atomic(
    src_ptr, index_ptr, acc_ptr, err_ptr, flag_ptr,
    n_tokens, n_rows, n_cols, src_row_stride, src_col_stride, index_stride, acc_row_stride,
    padding_idx, alpha,
):
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    toks = pid_t.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    tok_ok = toks < n_tokens{col_ok}
    idx = tl.load(index_ptr + toks * index_stride, mask=tok_ok, other=0).to(tl.int64)
    bad = tok_ok & ((idx < 0) | (idx >= n_rows))
    # reported once, by the first column block; a bad token adds nothing
    index_error(err_ptr, flag_ptr, toks, idx, bad & (pid_c == 0))
    ok = tok_ok & ~bad{skip}
    rows = {load}{scale}
    # not deterministic: the order of these adds varies between runs
    tl.atomic_add(acc_ptr + idx[:, None] * acc_row_stride + cols[None, :], rows,
                  mask=ok[:, None]{cm}, sem="relaxed")
"""


def render_scatter(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    """The module of `plan`: its header, its tile, the helpers it calls and its kernel.
    `src_dtype` is the dtype of the rows added (torch's name); `interpreted` selects the
    exact bf16 conversions Triton's interpreter needs."""
    helpers = ["index_error"]
    body = (_sorted if plan.mode == "sorted" else _atomic)(plan, interpreted, src_dtype)
    for name in ("bf16_rne", "bf16_wide"):
        if f"{name}(" in body:
            helpers.append(name)
    across = "BLOCK_R" if plan.mode == "sorted" else "BLOCK_T"
    tile = (
        f"# the plan's tile: {across} {'rows' if plan.mode == 'sorted' else 'tokens'} x "
        f"BLOCK_C columns a program\n{across} = tl.constexpr({plan.block_rows})\n"
        f"BLOCK_C = tl.constexpr({plan.block_cols})\n"
    )
    parts = [_header(plan), _PRELUDE, tile, *(HELPERS[h] for h in helpers), body]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)
