"""Render the row scatter-add (embedding backward, index_add, index_put with accumulate):
one Triton module per ScatterPlan (fuser/schedulers/scatter.py decides; this prints).

  scatter_sorted    (runs, split) one program per (block of output rows, block of
                    columns[, piece]): each row's run of tokens in the sorted indices (its
                    bounds from torch.searchsorted), its src rows summed in fp32 in sorted
                    (token) order. runs: every row of the block written once (zeros, or
                    base, where no token names it). split: the program sums its piece of
                    each run into an fp32 partial, scatter_finalize adds them.
  scatter_table     (table) one program per (chunk of tokens, block of columns): the
                    chunk summed into an fp32 partial of the whole table by one-hot
                    products (tl.dot), token by token where a step holds an inf or a NaN.
  scatter_finalize  (split, table) each element's partials added in order, then what the
                    output needs (the count's scale, the padding row, alpha, base, the cast).
  scatter_atomic    one program per (block of tokens, block of columns): fp32 atomic adds
                    into an accumulator (the runtime zeroes it and casts it after).

The first three are deterministic: the order of every add is fixed by the plan. None
writes outside the output: a bad index (< 0 or >= rows) belongs to no row's run in the
sorted indices (they sort before row 0 or after the last row), matches no stored row of
the table, and the atomic kernel masks it; each reports it through the error record
every fuser kernel with checks uses (fuser/runtime/checks.py), so the runtime raises
OutOfBoundsError naming it. Only what the plan needs is printed: no padding test without
a padding_idx, no column mask when the column block divides the row.
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


def _epilogue(plan: ScatterPlan, interpreted: bool, out_mask: str, pad: str) -> list[str]:
    """What every output element gets after its sum `acc` (and its row's token `count`):
    scale_grad_by_freq's division, the padding row's zeros, alpha, base."""
    s = plan.shape
    lines = []
    if s.scale_by_freq:
        lines.append(
            f"{pad}# scale_grad_by_freq: each token's row divided by its index's count\n"
            f"{pad}acc = acc / tl.maximum(count, 1).to(tl.float32)"
        )
    if s.padding_idx is not None:
        lines.append(
            f"{pad}# the padding row gets no gradient\n"
            f"{pad}acc = tl.where(rows == padding_idx, 0.0, acc)"
        )
    if s.alpha != 1.0:
        lines.append(f"{pad}acc = acc * alpha")
    if s.has_base:
        base = _from(
            f"tl.load(base_ptr + rows * base_row_stride + cols, mask={out_mask}, other=0.0)",
            s.dtype,
            interpreted,
        )
        lines.append(f"{pad}acc = {base} + acc")
    return lines


def _sorted(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    s = plan.shape
    split = plan.kind == "split"
    exact = s.cols % plan.block_cols == 0
    col_ok = "" if exact else "\n        col_ok = cols < n_cols"
    cm = "" if exact else " & col_ok"
    out_mask = f"row_ok{cm}"
    skip_pad = ""
    if s.padding_idx is not None:
        skip_pad = (
            "\n    # the padding row is zeros whatever names it: its run is not summed (a "
            "padded\n    # batch would make it the longest)\n"
            "    count = tl.where(rows == padding_idx, 0, count)\n"
            "    end = start + count"
        )
    if split:
        run = (
            "    # this program's piece of each run: the run cut into tl.num_programs(2) "
            "pieces,\n    # piece pid_s its tokens [lo, hi)\n"
            "    pid_s = tl.program_id(2)\n"
            "    per = (count + tl.num_programs(2) - 1) // tl.num_programs(2)\n"
            "    lo = tl.minimum(start + pid_s * per, end)\n"
            "    hi = tl.minimum(lo + per, end)\n"
        )
        finish = [
            "        # the piece's fp32 partial: scatter_finalize adds the pieces in order",
            "        at_ws = pid_s.to(tl.int64) * n_rows * n_cols + rows * n_cols + cols",
            f"        tl.store(ws_ptr + at_ws, acc, mask={out_mask})",
        ]
        if s.scale_by_freq:
            run += (
                "    tl.store(cnt_ptr + pid_s * n_rows + rows, hi - lo, "
                "mask=row_ok & (pid_c == 0))\n"
            )
    else:
        run = "    lo = start\n    hi = end\n"
        finish = _epilogue(plan, interpreted, out_mask, " " * 8) + [
            f"        out = {_to_out('acc', s.dtype, interpreted)}",
            f"        tl.store(out_ptr + rows * out_row_stride + cols, out, mask={out_mask})",
        ]
    load = _from(
        "tl.load(src_ptr + tok * src_row_stride + cols * src_col_stride, "
        f"mask=live{cm}, other=0.0)",
        src_dtype,
        interpreted,
    )
    return f"""
@triton.jit
def scatter_sorted(
    src_ptr, sorted_ptr, perm_ptr, bounds_ptr, out_ptr, base_ptr, ws_ptr, cnt_ptr,
    err_ptr, flag_ptr, n_tokens, n_rows, n_cols,
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
    count = end - start{skip_pad}
{run}    longest = tl.max(tl.max(hi - lo, axis=1), axis=0)
    # column blocks pid_c, pid_c + grid[1], ...: the plan gives a program every column
    # block of its rows when there are rows enough to fill the GPU
    for c0 in range(pid_c * BLOCK_C, n_cols, tl.num_programs(1) * BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)[None, :]{col_ok}
        # the run's src rows summed in fp32, in sorted order (stable: token order): the
        # same order every call, so the same bits
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
        for j in range(0, longest):
            at = lo + j
            live = at < hi
            tok = tl.load(perm_ptr + at, mask=live, other=0)
            acc += {load}
{chr(10).join(finish)}
"""


def _dot_operand(dtype: str, interpreted: bool) -> tuple[str, str]:
    """(the one-hot's Triton dtype, tl.dot's input_precision) for src rows of `dtype`:
    16-bit rows multiply on tensor cores as they are (a one-hot product is exact, the sum
    fp32); fp32 (and fp64, summed in fp32 as every kernel here does) in exact fp32 FMAs
    ("ieee": tf32 would round each src element to 10 bits). The interpreter widens all."""
    if not interpreted and dtype in ("torch.bfloat16", "torch.float16"):
        return ("tl.bfloat16" if dtype == "torch.bfloat16" else "tl.float16"), "None"
    return "tl.float32", '"ieee"'


def _table(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    s = plan.shape
    exact = s.cols % plan.block_cols == 0
    col_ok = "" if exact else "\n    col_ok = cols < n_cols"
    cm = "" if exact else " & col_ok"
    one_ty, precision = _dot_operand(src_dtype, interpreted)
    tile = (
        "tl.load(src_ptr + toks[:, None] * src_row_stride + cols * src_col_stride, "
        f"mask=tok_ok[:, None]{cm}, other=0.0)"
    )
    tile = tile if one_ty != "tl.float32" else _from(tile, src_dtype, interpreted)
    one = _from(
        "tl.load(src_ptr + tok * src_row_stride + cols * src_col_stride, "
        f"mask=live{cm}, other=0.0)",
        src_dtype,
        interpreted,
    )
    counts = ("", "", "")
    if s.scale_by_freq:
        counts = (
            "\n    count = tl.zeros([TABLE_R, 1], dtype=tl.int32)",
            "\n        count += tl.sum(hit.to(tl.int32), axis=1, keep_dims=True)",
            "\n    tl.store(cnt_ptr + pid_t * n_rows + rows, count, "
            "mask=(rows < n_rows) & (pid_c == 0))",
        )
    return f"""
@triton.jit
def scatter_table(
    src_ptr, index_ptr, ws_ptr, cnt_ptr, err_ptr, flag_ptr,
    n_tokens, n_rows, n_cols, src_row_stride, src_col_stride, index_stride,
):
    pid_t = tl.program_id(0)
    pid_c = tl.program_id(1)
    # every row of the table, as a [TABLE_R, 1] column (a power of two >= 16 for tl.dot:
    # the rows past n_rows are never stored)
    rows = tl.arange(0, TABLE_R)[:, None]
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]{col_ok}
    acc = tl.zeros([TABLE_R, BLOCK_C], dtype=tl.float32){counts[0]}
    first = pid_t.to(tl.int64) * CHUNK_T
    # the chunk's tokens BLOCK_T at a time, in token order: the same order every call
    for t0 in range(0, CHUNK_T, BLOCK_T):
        toks = first + t0 + tl.arange(0, BLOCK_T)
        tok_ok = toks < n_tokens
        idx = tl.load(index_ptr + toks * index_stride, mask=tok_ok, other=-1)
        bad = tok_ok & ((idx < 0) | (idx >= n_rows))
        # reported once, by the first column block; a bad token adds to no stored row
        index_error(err_ptr, flag_ptr, toks, idx, bad & (pid_c == 0))
        # hit[v, t]: token t adds to row v (tokens past the end have index -1)
        hit = idx[None, :] == rows{counts[1]}
        rows_in = {tile}
        wild = tl.sum(tl.where(tl.abs(rows_in) < float("inf"), 0, 1))
        if wild > 0:
            # an inf or a NaN: 0 * inf in the product would reach every row, so the
            # step's tokens are added one by one, each to its own row only
            for j in range(0, BLOCK_T):
                tok = first + t0 + j
                live = tok < n_tokens
                at = tl.load(index_ptr + tok * index_stride, mask=live, other=-1)
                one = {one}
                acc = tl.where(rows == at, acc + one, acc)
        else:
            acc = tl.dot(hit.to({one_ty}), rows_in, acc, input_precision={precision})
    # the chunk's partial of the table: scatter_finalize adds the chunks in order
    at_ws = pid_t.to(tl.int64) * n_rows * n_cols + rows * n_cols + cols
    tl.store(ws_ptr + at_ws, acc, mask=(rows < n_rows){cm}){counts[2]}
"""


def _finalize(plan: ScatterPlan, interpreted: bool) -> str:
    s = plan.shape
    counts = ""
    if s.scale_by_freq:
        counts = """
    # the row's count: its partial counts added
    count = tl.zeros([FIN_P, FIN_E], dtype=tl.int32)
    for p0 in range(0, n_parts, FIN_P):
        parts = p0 + tl.arange(0, FIN_P)[:, None]
        count += tl.load(cnt_ptr + parts * n_rows + rows, mask=(parts < n_parts) & elem_ok,
                         other=0)
    count = tl.sum(count, axis=0, keep_dims=True)"""
    epilogue = "".join("\n" + line for line in _epilogue(plan, interpreted, "elem_ok", " " * 4))
    return f"""
@triton.jit
def scatter_finalize(
    ws_ptr, cnt_ptr, out_ptr, base_ptr, n_parts, n_rows, n_cols,
    out_row_stride, base_row_stride, padding_idx, alpha,
):
    pid = tl.program_id(0)
    # FIN_E elements of the [n_rows, n_cols] output, each the sum of its n_parts partials
    n_elems = n_rows.to(tl.int64) * n_cols
    elems = pid.to(tl.int64) * FIN_E + tl.arange(0, FIN_E)[None, :]
    elem_ok = elems < n_elems
    rows = elems // n_cols
    cols = elems % n_cols
    # partial p in lane p % FIN_P, in order, then the lanes' fixed tree: the same order
    # every call, so the same bits
    acc = tl.zeros([FIN_P, FIN_E], dtype=tl.float32)
    for p0 in range(0, n_parts, FIN_P):
        parts = p0 + tl.arange(0, FIN_P)[:, None]
        acc += tl.load(ws_ptr + parts.to(tl.int64) * n_elems + elems,
                       mask=(parts < n_parts) & elem_ok, other=0.0)
    acc = tl.sum(acc, axis=0, keep_dims=True){counts}{epilogue}
    out = {_to_out("acc", s.dtype, interpreted)}
    tl.store(out_ptr + rows * out_row_stride + cols, out, mask=elem_ok)
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


def _tiles(plan: ScatterPlan) -> str:
    if plan.kind == "table":
        consts = {"TABLE_R": plan.block_rows, "BLOCK_C": plan.block_cols,
                  "BLOCK_T": plan.block_tokens, "CHUNK_T": plan.chunk_tokens}  # fmt: skip
        what = "the table's rows (padded) x BLOCK_C columns a program, CHUNK_T tokens"
        what += " BLOCK_T at a time"
    elif plan.kind == "atomic":
        consts = {"BLOCK_T": plan.block_rows, "BLOCK_C": plan.block_cols}
        what = "BLOCK_T tokens x BLOCK_C columns a program"
    else:
        consts = {"BLOCK_R": plan.block_rows, "BLOCK_C": plan.block_cols}
        what = "BLOCK_R rows x BLOCK_C columns a program"
    if plan.finalize is not None:
        consts |= {"FIN_P": plan.finalize.block_parts, "FIN_E": plan.finalize.block_elems}
        what += "; finalize: FIN_P partials x FIN_E elements a step"
    lines = [f"# the plan's tiles: {what}"]
    lines += [f"{k} = tl.constexpr({v})" for k, v in consts.items()]
    return "\n".join(lines) + "\n"


def render_scatter(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    """The module of `plan`: its header, its tiles, the helpers it calls and its kernels.
    `src_dtype` is the dtype of the rows added (torch's name); `interpreted` selects the
    exact bf16 conversions Triton's interpreter needs."""
    helpers = ["index_error"]
    if plan.kind == "table":
        body = _table(plan, interpreted, src_dtype)
    elif plan.kind == "atomic":
        body = _atomic(plan, interpreted, src_dtype)
    else:
        body = _sorted(plan, interpreted, src_dtype)
    if plan.finalize is not None:
        body += _finalize(plan, interpreted)
    for name in ("bf16_rne", "bf16_wide"):
        if f"{name}(" in body:
            helpers.append(name)
    parts = [_header(plan), _PRELUDE, _tiles(plan), *(HELPERS[h] for h in helpers), body]
    return "\n".join(p.rstrip("\n") + "\n" for p in parts)
