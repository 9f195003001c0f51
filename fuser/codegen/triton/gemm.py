"""Render the GEMM template: one Triton kernel per GemmPlan.

One program computes a BLOCK_M x BLOCK_N tile of C = A @ B: it walks K in BLOCK_K steps
(tl.dot with an fp32 accumulator; on sm_90 Triton lowers it to wgmma and pipelines the
loads over num_stages), then applies the plan's epilogue to the fp32 tile and stores it.
Programs are numbered in GROUP_M row-block groups (each group walks the column blocks
together, so a column block of B is read from L2 by the whole group). Every operand is
read through its strides: a transposed A or B (the backward's Xᵀ and Wᵀ) is a stride
swap, never a copy. Masks for M, N or K bounds are printed only where the plan says the
tile does not divide the size. Decides nothing: every choice is the plan's.
"""

from __future__ import annotations

import textwrap

from fuser.codegen.writer import Writer
from fuser.schedulers.gemm import GemmPlan

_TL = {"fp16": "tl.float16", "bf16": "tl.bfloat16", "fp32": "tl.float32"}

_PRELUDE = """import triton
import triton.language as tl

SQRT1_2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
GELU_TANH_C = tl.constexpr(0.044715)
"""

# the activations and their derivatives, as ATen's gelu and gelu_backward compute them
_HELPERS = {
    "tanh": """
@triton.jit
def _tanh(x):
    # sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|): no overflow for large |x|
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)
""",
    "gelu": """
@triton.jit
def gelu(x):
    # x * Phi(x), the normal CDF by erf
    return 0.5 * x * (1.0 + tl.erf(x * SQRT1_2))
""",
    "gelu_tanh": """
@triton.jit
def gelu_tanh(x):
    u = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)
    return 0.5 * x * (1.0 + _tanh(u))
""",
    "dgelu": """
@triton.jit
def gelu_grad(x):
    # d/dx x * Phi(x) = Phi(x) + x * phi(x)
    return 0.5 * (1.0 + tl.erf(x * SQRT1_2)) + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI
""",
    "dgelu_tanh": """
@triton.jit
def gelu_tanh_grad(x):
    u = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x)
    t = _tanh(u)
    du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_C * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
""",
}


# Triton 3.6's interpreter truncates float32 -> bf16 and flushes bf16 subnormals when it
# widens them; a GPU rounds to nearest even. Interpreted plans (GemmPlan.exact_bf16)
# convert through these, which take the bits' way for bf16 and .to() otherwise.
_EXACT = """
@triton.jit
def _f32(x):
    # x widened to float32; bf16 by its bits (exact, subnormals kept)
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _cvt(x, dtype: tl.constexpr):
    # x as `dtype`; bf16 rounded to nearest even by its bits, NaN kept quiet
    if dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        top = tl.where(x != x, (bits >> 16) | 0x40, rounded)
        return top.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype)
"""


def _wide(plan: GemmPlan, x: str) -> str:
    """`x` widened to float32."""
    return f"_f32({x})" if plan.exact_bf16 else f"{x}.to(tl.float32)"


def _cast(plan: GemmPlan, x: str, dtype: str) -> str:
    """`x` converted to `dtype` (a tl dtype expression)."""
    return f"_cvt({x}, {dtype})" if plan.exact_bf16 else f"{x}.to({dtype})"


def _helpers(plan: GemmPlan) -> list[str]:
    e = plan.epilogue
    wanted = []
    if e.activation != "none":
        wanted.append(e.activation)
    if e.gelu_grad != "none":
        wanted.append("d" + e.gelu_grad)
    if any(w.endswith("gelu_tanh") for w in wanted):
        wanted.insert(0, "tanh")
    return ([_EXACT] if plan.exact_bf16 else []) + [_HELPERS[w] for w in wanted]


def header(plan: GemmPlan) -> str:
    lines = [
        f"fuser GEMM template {plan.name} (triton), generated: edit the plan, not this file",
        *plan.explain().splitlines(),
        f"arguments: {', '.join(plan.signature())}",
    ]
    if plan.split:
        lines.append(f"finalize arguments: {', '.join(plan.signature(finalize=True))}")
    return '"""' + "\n".join(lines) + '\n"""\n'


def _and(*parts: str) -> str:
    kept = [p for p in parts if p]
    return " & ".join(f"({p})" for p in kept) if len(kept) > 1 else (kept[0] if kept else "")


def _load(ptr: str, mask: str) -> str:
    return f"tl.load({ptr}, mask={mask}, other=0.0)" if mask else f"tl.load({ptr})"


def _store(ptr: str, value: str, mask: str) -> str:
    return f"tl.store({ptr}, {value}, mask={mask})" if mask else f"tl.store({ptr}, {value})"


def _def(w: Writer, name: str, signature: list[str], consts: list[str]) -> None:
    w.line("@triton.jit")
    args = ", ".join(signature)
    with w.block(f"def {name}("):
        for line in textwrap.wrap(args + ",", 88, break_long_words=False):
            w.line(line)
        w.line(", ".join(f"{c}: tl.constexpr" for c in consts) + ",")
    w.line("):")


def render_gemm(plan: GemmPlan) -> str:
    """The Triton source of the plan's kernel (and its split-K finalize), with its header."""
    w = Writer()
    consts = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"]
    _def(w, plan.name, plan.signature(), consts + (["SPLIT_K"] if plan.split else []))
    with w.block():
        _program_tile(w, plan)
        _main_loop(w, plan)
        if plan.swap_ab:
            w.line("acc = tl.trans(acc)  # the dot's Cᵀ, back to [BLOCK_M, BLOCK_N]")
        if plan.split:
            _store_partials(w, plan)
        else:
            _epilogue(w, plan)
    if plan.split:
        w.line()
        w.line()
        _finalize(w, plan)
    return "\n".join([header(plan), _PRELUDE, *_helpers(plan), "", w.text()])


def _program_tile(w: Writer, plan: GemmPlan) -> None:
    w.line("pid = tl.program_id(0)")
    if plan.split:
        w.comment("split-K: the SPLIT_K programs of a tile are neighbours, each a K range")
        w.line("split = pid % SPLIT_K")
        w.line("pid = pid // SPLIT_K")
    w.line("grid_m = tl.cdiv(M, BLOCK_M)")
    w.line("grid_n = tl.cdiv(N, BLOCK_N)")
    w.comment("GROUP_M row blocks take the column blocks in turn: B's tiles are reused from L2")
    w.line("in_group = GROUP_M * grid_n")
    w.line("first_m = (pid // in_group) * GROUP_M")
    w.line("group_rows = tl.minimum(grid_m - first_m, GROUP_M)")
    w.line("pid_m = first_m + (pid % in_group) % group_rows")
    w.line("pid_n = (pid % in_group) // group_rows")
    w.line("rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
    w.line("cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
    w.line("ks = tl.arange(0, BLOCK_K)")
    if plan.shape.index64:
        w.comment("an operand spans more than 2**31 elements: 64-bit offsets")
        w.line("rows64 = rows.to(tl.int64)")
        w.line("cols64 = cols.to(tl.int64)")
        w.line("ks64 = ks.to(tl.int64)")


def _idx(plan: GemmPlan, name: str) -> str:
    """The offsets `name` (rows, cols, ks) as pointer arithmetic takes them."""
    return f"{name}64" if plan.shape.index64 else name


def _masks(plan: GemmPlan) -> dict[str, str]:
    return {
        "m": "" if plan.even_m else "rows[:, None] < M",
        "n": "" if plan.even_n else "cols[None, :] < N",
        "ka": "" if plan.even_k else "ks[None, :] < k_left",
        "kb": "" if plan.even_k else "ks[:, None] < k_left",
    }


def _main_loop(w: Writer, plan: GemmPlan) -> None:
    e, s, m = plan.epilogue, plan.shape, _masks(plan)
    r, c, k = (_idx(plan, n) for n in ("rows", "cols", "ks"))
    w.line(f"a_ptrs = A + {r}[:, None] * s_am + {k}[None, :] * s_ak")
    w.line(f"b_ptrs = B + {k}[:, None] * s_bk + {c}[None, :] * s_bn")
    if plan.swap_ab:
        w.comment("Cᵀ = Bᵀ·Aᵀ: A's prologue output is the dot's second operand (shared memory)")
        w.line("acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)")
    else:
        w.line("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
    loop = "for k in range(0, tl.cdiv(K, BLOCK_K)):"
    if plan.split:
        w.comment("this program's K range: whole BLOCK_K steps, the last range the shortest")
        w.line("k_steps = tl.cdiv(K, BLOCK_K)")
        w.line("per_split = tl.cdiv(k_steps, SPLIT_K)")
        w.line("k_first = split * per_split")
        w.line("k_end = tl.minimum(k_first + per_split, k_steps)")
        w.line("a_ptrs += k_first * BLOCK_K * s_ak")
        w.line("b_ptrs += k_first * BLOCK_K * s_bk")
        loop = "for k in range(k_first, k_end):"
    if e.reduce == "a_rows":
        w.line("a_sum = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum_k A[m, k], the bias grad")
    elif e.reduce == "b_cols":
        w.line("b_sum = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum_k B[k, n], the bias grad")
    with w.block(loop):
        if not plan.even_k:
            w.line("k_left = K - k * BLOCK_K")
        w.line(f"a = {_load('a_ptrs', _and(m['m'], m['ka']))}")
        w.line(f"b = {_load('b_ptrs', _and(m['kb'], m['n']))}")
        if e.reduce == "a_rows":
            w.comment("only the first program of a row block sums (it stores the sums)")
            with w.block("if pid_n == 0:"):
                w.line(f"a_sum += tl.sum({_wide(plan, 'a')}, 1)")
        elif e.reduce == "b_cols":
            w.comment("only the first program of a column block sums (it stores the sums)")
            with w.block("if pid_m == 0:"):
                w.line(f"b_sum += tl.sum({_wide(plan, 'b')}, 0)")
        dot = _TL[s.dtype]
        if e.a_cast and e.a_scale:
            scaled = f"({_wide(plan, _cast(plan, 'a', dot))} * scale)"
            w.line(f"a = {_cast(plan, scaled, dot)}  # prologue: cast, scale")
        elif e.a_cast:
            w.line(f"a = {_cast(plan, 'a', dot)}  # prologue: cast")
        elif e.a_scale:
            scaled = f"({_wide(plan, 'a')} * scale)"
            w.line(f"a = {_cast(plan, scaled, dot)}  # prologue: scale")
        x, y = (_wide(plan, "a"), _wide(plan, "b")) if plan.dot_upcast else ("a", "b")
        ab = f"tl.trans({y}), tl.trans({x})" if plan.swap_ab else f"{x}, {y}"
        if plan.dot_upcast:
            w.comment("Triton 3.6's interpreter computes bf16 dots wrongly: exact in fp32")
            w.line(f'acc = tl.dot({ab}, acc, input_precision="ieee")')
        elif s.dtype == "fp32":
            w.line(f'acc = tl.dot({ab}, acc, input_precision="ieee")  # fp32 as ATen: no tf32')
        else:
            w.line(f"acc = tl.dot({ab}, acc)")
        w.line("a_ptrs += BLOCK_K * s_ak")
        w.line("b_ptrs += BLOCK_K * s_bk")


def _tile_ptr(plan: GemmPlan, base: str, sm: str, sn: str) -> str:
    return f"{base} + {_idx(plan, 'rows')}[:, None] * {sm} + {_idx(plan, 'cols')}[None, :] * {sn}"


def _tile_mask(w: Writer, plan: GemmPlan) -> str:
    """Prints the tile's bounds mask where it needs one; its name or ""."""
    m = _masks(plan)
    mask = _and(m["m"], m["n"])
    if mask:
        w.line(f"mask = {mask}")
        return "mask"
    return ""


def _store_partials(w: Writer, plan: GemmPlan) -> None:
    """Split-K: the program's fp32 partial tile (and sums) to the workspaces."""
    e = plan.epilogue
    w.comment("split-K: this K range's fp32 partial tile; the finalize adds the ranges")
    mask = _tile_mask(w, plan)
    part = (
        f"PART + split * M * N + {_idx(plan, 'rows')}[:, None] * N + {_idx(plan, 'cols')}[None, :]"
    )
    w.line(_store(part, "acc", mask))
    if e.reduce == "a_rows":
        with w.block("if pid_n == 0:"):
            w.line(_store("PSUMS + split * M + rows", "a_sum", "" if plan.even_m else "rows < M"))
    elif e.reduce == "b_cols":
        with w.block("if pid_m == 0:"):
            w.line(_store("PSUMS + split * N + cols", "b_sum", "" if plan.even_n else "cols < N"))


def _finalize(w: Writer, plan: GemmPlan) -> None:
    """Split-K's second kernel: a tile's partials added in split order, then the epilogue."""
    e = plan.epilogue
    _def(
        w, f"{plan.name}_finalize", plan.signature(finalize=True), ["BLOCK_M", "BLOCK_N", "SPLIT_K"]
    )
    with w.block():
        w.line("pid = tl.program_id(0)")
        w.line("grid_n = tl.cdiv(N, BLOCK_N)")
        w.line("pid_m = pid // grid_n")
        w.line("pid_n = pid % grid_n")
        w.line("rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)")
        w.line("cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        if plan.shape.index64:
            w.line("rows64 = rows.to(tl.int64)")
            w.line("cols64 = cols.to(tl.int64)")
        mask = _tile_mask(w, plan)
        offs = f"{_idx(plan, 'rows')}[:, None] * N + {_idx(plan, 'cols')}[None, :]"
        w.line(f"part = PART + {offs}")
        w.comment("the K ranges' partials added in split order: the same bits every run")
        w.line("acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)")
        with w.block("for split in tl.static_range(SPLIT_K):"):
            w.line(f"acc += {_load('part + split * M * N', mask)}")
        if e.reduce != "none":
            size, idx, even = (
                ("M", "rows", plan.even_m) if e.reduce == "a_rows" else ("N", "cols", plan.even_n)
            )
            total = "a_sum" if e.reduce == "a_rows" else "b_sum"
            w.line(f"{total} = tl.zeros([BLOCK_{size}], dtype=tl.float32)")
            with w.block("for split in tl.static_range(SPLIT_K):"):
                load = _load(f"PSUMS + split * {size} + {idx}", "" if even else f"{idx} < {size}")
                w.line(f"{total} += {load}")
        _epilogue(w, plan, mask)


def _epilogue(w: Writer, plan: GemmPlan, mask: str | None = None) -> None:
    """The fused work on the fp32 tile `acc`, then the stores; `mask`: the tile's
    bounds mask when the caller printed it already."""
    e = plan.epilogue
    w.comment("epilogue, on the fp32 tile")
    if mask is None:
        mask = _tile_mask(w, plan)
    w.line("x = acc")
    if e.bias:
        bias = _load(f"BIAS + {_idx(plan, 'cols')} * s_bias", "" if plan.even_n else "cols < N")
        w.line(f"x += {_wide(plan, bias)}[None, :]")
    if e.aux:
        w.comment("the pre-activation, for the backward")
        aux = _cast(plan, "x", "AUX.dtype.element_ty")
        w.line(_store(_tile_ptr(plan, "AUX", "s_xm", "s_xn"), aux, mask))
    if e.activation != "none":
        w.line(f"x = {e.activation}(x)")
    if e.mask:
        keep = _wide(plan, _load(_tile_ptr(plan, "MASK", "s_dm", "s_dn"), mask))
        w.line(f"x = x * {keep} * mask_scale  # dropout, its saved mask")
    if e.gelu_grad != "none":
        w.line(f"pre = {_wide(plan, _load(_tile_ptr(plan, 'PRE', 's_pm', 's_pn'), mask))}")
        w.line(f"x = x * {e.gelu_grad}_grad(pre)  # the GELU backward")
    if e.residual:
        w.line(f"x += {_wide(plan, _load(_tile_ptr(plan, 'RES', 's_rm', 's_rn'), mask))}")
    w.line(
        _store(_tile_ptr(plan, "C", "s_cm", "s_cn"), _cast(plan, "x", "C.dtype.element_ty"), mask)
    )
    if e.reduce == "a_rows":
        w.comment("one program of each row block stores its rows' sums: a fixed order")
        with w.block("if pid_n == 0:"):
            row_mask = "" if plan.even_m else "rows < M"
            w.line(
                _store(
                    f"SUMS + {_idx(plan, 'rows')} * s_sum",
                    _cast(plan, "a_sum", "SUMS.dtype.element_ty"),
                    row_mask,
                )
            )
    elif e.reduce == "b_cols":
        w.comment("one program of each column block stores its columns' sums: a fixed order")
        with w.block("if pid_m == 0:"):
            col_mask = "" if plan.even_n else "cols < N"
            w.line(
                _store(
                    f"SUMS + {_idx(plan, 'cols')} * s_sum",
                    _cast(plan, "b_sum", "SUMS.dtype.element_ty"),
                    col_mask,
                )
            )
