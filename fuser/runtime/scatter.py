"""Launch the row scatter-add: embedding backward, index_add and index_put(accumulate).

`scatter_add_rows(src, index, rows)` is out[v, :] = base[v, :] + alpha * sum of
src[t, :] over tokens t with index[t] == v, computed by fuser's Triton kernels
(codegen/triton/scatter.py) the way the plan says (schedulers/scatter.py): deterministic
by default (runs, split or table, from the shape), with fp32 atomic adds under
FUSER_SCATTER=atomic. For runs and split the sort of the indices (torch.sort, stable) and
each row's run bounds in them (torch.searchsorted) are ATen's; table sorts nothing. split
and table write fp32 partials to a workspace made here, and a second launch adds them.
The kernels read src through its strides
(a [N, H] view of any [..., H] gradient whose leading dims collapse; otherwise ATen's
reshape copies it, and `last_notes` says so). A bad index raises OutOfBoundsError: at
once on CPU, at the next fuser call (or fuser.check_errors()) on a GPU, where reading
the record at once would synchronize the host (runtime/checks.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from fuser.codegen.triton.scatter import render_scatter
from fuser.config import config, use_interpreter
from fuser.errors import FuserError, OutOfBoundsError
from fuser.ir.dtypes import dtype_of
from fuser.ir.graph import Node, Value, freeze_attrs
from fuser.ir.guards import index_attrs, message
from fuser.ir.ops import Op
from fuser.runtime.checks import check_args, poll, raise_claimed
from fuser.runtime.jit_launch import launch
from fuser.runtime.resources import _compile_triton, resources_in_child
from fuser.runtime.triton_backend import load_module
from fuser.schedulers.scatter import ScatterPlan, ScatterShape, plan_scatter, shape_of

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _Checks:
    """What runtime/checks.py needs of a kernel with one index check: a name, its check
    node (the message names the index, its element and the valid range) and records."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, rows: int):
        self.name = name
        index = Value(0, tuple(shape), dtype_of(dtype))
        node = Node(Op.CHECK_INDEX, (index,), (index,), freeze_attrs(index_attrs(rows)))
        self.spec = _Spec((node,))
        self._records: dict = {}


class _Spec:
    def __init__(self, checks: tuple[Node, ...]):
        self.checks = checks


@functools.lru_cache(maxsize=512)
def _checks(name: str, shape: tuple[int, ...], dtype: torch.dtype, rows: int) -> _Checks:
    return _Checks(name, shape, dtype, rows)


@functools.lru_cache(maxsize=256)
def _source(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> str:
    return render_scatter(plan, interpreted, src_dtype)


def source_of(plan: ScatterPlan, src_dtype: str = "torch.float32") -> str:
    """The generated module of `plan` (as this process would run it)."""
    return _source(plan, use_interpreter(), src_dtype)


_ROW_IDS: dict[tuple, torch.Tensor] = {}


def _row_ids(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """arange(n) on `device`, made once (searchsorted's queries: every output row)."""
    key = (n, dtype, str(device))
    got = _ROW_IDS.get(key)
    if got is None:
        if len(_ROW_IDS) > 64:
            _ROW_IDS.clear()
        got = _ROW_IDS[key] = torch.arange(n, dtype=dtype, device=device)
    return got


def mode() -> str:
    """How scatter-adds run: "sorted" (deterministic, default) or "atomic"
    (FUSER_SCATTER=atomic)."""
    return config.scatter


def _rows_view(src: torch.Tensor, cols: int) -> tuple[torch.Tensor, str]:
    """src as [N, cols] with its own strides when its leading dims collapse, else a
    contiguous copy (and the note saying so)."""
    if src.dim() == 1:
        src = src.reshape(-1, 1) if cols == 1 else src.reshape(1, -1)
    try:
        return src.view(-1, cols), ""
    except RuntimeError:
        return src.reshape(-1, cols), "src's leading dims do not collapse: ATen copied it"


def plan_for(
    src: torch.Tensor,
    index: torch.Tensor,
    rows: int,
    out_dtype: torch.dtype,
    scale_by_freq: bool = False,
    padding_idx: int | None = None,
    has_base: bool = False,
    alpha: float = 1.0,
    how: str | None = None,
) -> ScatterPlan:
    shape = shape_of(src, index, rows, out_dtype, scale_by_freq, padding_idx, has_base, alpha)
    return _planned(shape, how or mode())


# A model's scatter-adds (an embedding's backward) come back every step with the same
# shape: the plan and the loaded module are looked up, not made again (planning and
# hashing the source cost ~40-60 us a call on the host, a step's 3 embeddings in BERT)
@functools.lru_cache(maxsize=256)
def _planned(shape: ScatterShape, how: str) -> ScatterPlan:
    return plan_scatter(shape, how)


@functools.lru_cache(maxsize=256)
def _module(plan: ScatterPlan, interpreted: bool, src_dtype: str) -> Any:
    return load_module(_source(plan, interpreted, src_dtype), interpret=interpreted)


def _check_operands(src: torch.Tensor, index: torch.Tensor, rows: int, base: Any) -> None:
    if index.dtype not in (torch.int32, torch.int64):
        raise FuserError(f"scatter-add: index of dtype {index.dtype}; expected int32 or int64")
    if src.dtype not in FLOATS:
        raise FuserError(f"scatter-add: rows of dtype {src.dtype}; expected a float dtype")
    if src.dim() < 1 or src.shape[:-1].numel() != index.numel():
        raise FuserError(
            f"scatter-add: src of shape {list(src.shape)} does not hold one row per index "
            f"element (index of shape {list(index.shape)})"
        )
    if base is not None and (base.dim() != 2 or base.shape[0] != rows):
        raise FuserError(f"scatter-add: base of shape {list(base.shape)}; expected [{rows}, H]")
    if src.device != index.device:
        raise FuserError(f"scatter-add: src on {src.device}, index on {index.device}")


def scatter_add_rows(
    src: torch.Tensor,
    index: torch.Tensor,
    rows: int,
    *,
    padding_idx: int | None = None,
    scale_by_freq: bool = False,
    base: torch.Tensor | None = None,
    alpha: float = 1.0,
    out_dtype: torch.dtype | None = None,
    how: str | None = None,
) -> torch.Tensor:
    """out [rows, H] = base + alpha * (rows of src [..., H] added at index [...]).

    padding_idx: that row gets zeros (tokens naming it add nothing). scale_by_freq: each
    token's row divided by the number of tokens naming the same row (embedding's
    scale_grad_by_freq). out_dtype: default base's dtype, else src's. how: "sorted"
    (deterministic, the plan's kind), "atomic", or "runs", "split", "table" to force a
    deterministic kind (default: FUSER_SCATTER, "sorted")."""
    _check_operands(src, index, rows, base)
    cols = int(src.shape[-1])
    dtype = out_dtype or (base.dtype if base is not None else src.dtype)
    if padding_idx is not None and padding_idx < 0:
        padding_idx += rows
    plan = plan_for(
        src, index, rows, dtype, scale_by_freq, padding_idx, base is not None, alpha, how
    )
    src2, _ = _rows_view(src, cols)
    flat = index.reshape(-1)
    dev = src.device
    if rows == 0 or cols == 0:
        _no_rows_check(flat, rows, index)
        return torch.empty((rows, cols), dtype=dtype, device=dev)
    interpreted = dev.type != "cuda"
    module = _module(plan, interpreted, str(src.dtype))
    checker = _checks(plan.name, tuple(index.shape), index.dtype, rows)
    err = check_args(checker, dev)
    poll()
    grid = plan.grid()
    b_pad = -1 if padding_idx is None else padding_idx
    if plan.kind == "atomic":
        if base is None:
            acc = torch.zeros((rows, cols), dtype=torch.float32, device=dev)
        else:
            acc = base.to(torch.float32, copy=True).contiguous()
        if flat.numel():
            launch(
                module.scatter_atomic, grid, src2, flat, acc, *err, flat.numel(), rows, cols,
                src2.stride(0), src2.stride(1), flat.stride(0), acc.stride(0), b_pad,
                float(alpha), num_warps=plan.num_warps,
            )  # fmt: skip
        out = acc if dtype == torch.float32 else acc.to(dtype)
    else:
        out = torch.empty((rows, cols), dtype=dtype, device=dev)
        b = base if base is not None else out
        ws, cnt = _workspaces(plan, dev)
        if plan.kind == "table":
            launch(
                module.scatter_table, grid, src2, flat, ws, cnt, *err, flat.numel(), rows, cols,
                src2.stride(0), src2.stride(1), flat.stride(0), num_warps=plan.num_warps,
            )  # fmt: skip
        else:
            _sorted_launch(module, plan, src2, flat, out, b, ws, cnt, err, b_pad, alpha)
        if plan.finalize is not None:
            fin = plan.finalize
            launch(
                module.scatter_finalize, fin.grid(plan.shape), ws, cnt, out, b, fin.parts, rows,
                cols, out.stride(0), b.stride(0), b_pad, float(alpha), num_warps=fin.num_warps,
            )  # fmt: skip
    if interpreted:
        raise_claimed(checker, err[0])
    return out


def _workspaces(plan: ScatterPlan, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """split and table: the fp32 partials [parts, rows, cols] and, for scale_grad_by_freq,
    the partial counts [parts, rows] (otherwise the partials stand in, unread)."""
    s = plan.shape
    if plan.finalize is None:
        none = torch.empty(0, dtype=torch.float32, device=dev)
        return none, none
    ws = torch.empty((plan.parts, s.rows, s.cols), dtype=torch.float32, device=dev)
    if not s.scale_by_freq:
        return ws, ws
    return ws, torch.empty((plan.parts, s.rows), dtype=torch.int32, device=dev)


def _sorted_launch(
    module: Any, plan: ScatterPlan, src2: torch.Tensor, flat: torch.Tensor, out: torch.Tensor,
    b: torch.Tensor, ws: torch.Tensor, cnt: torch.Tensor, err: list, pad: int, alpha: float,
) -> None:  # fmt: skip
    """runs and split: the stable sort, each row's run bounds, the kernel."""
    rows, dev = plan.shape.rows, src2.device
    sorted_idx, perm = torch.sort(flat, stable=True)
    # each row's run: [bounds[v], bounds[v + 1]); a bad index lies outside every run
    bounds = torch.searchsorted(sorted_idx, _row_ids(rows + 1, sorted_idx.dtype, dev))
    ws = ws if ws.numel() else out
    launch(
        module.scatter_sorted, plan.grid(), src2, sorted_idx, perm, bounds, out, b, ws,
        cnt if cnt.numel() else ws, *err, flat.numel(), rows, plan.shape.cols, src2.stride(0),
        src2.stride(1), out.stride(0), b.stride(0), pad, float(alpha), num_warps=plan.num_warps,
    )  # fmt: skip


def _no_rows_check(flat: torch.Tensor, rows: int, index: torch.Tensor) -> None:
    """With no output rows (or columns) no kernel runs: the index is checked with ATen."""
    if flat.numel() == 0:
        return
    bad = (flat < 0) | (flat >= rows)
    if bool(bad.any()):
        i = int(bad.int().argmax())
        node = _checks("scatter_add_rows", tuple(index.shape), index.dtype, rows).spec.checks[0]
        raise OutOfBoundsError(message(node, i, int(flat[i])))


def embedding_backward(
    grad_output: torch.Tensor,
    indices: torch.Tensor,
    num_weights: int,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    how: str | None = None,
) -> torch.Tensor:
    """aten.embedding_dense_backward with fuser's kernels: the weight's gradient
    [num_weights, H] in grad_output's dtype. padding_idx -1 means none (ATen's
    convention)."""
    pad = None if padding_idx is None or padding_idx < 0 else int(padding_idx)
    return scatter_add_rows(
        grad_output, indices, int(num_weights), padding_idx=pad,
        scale_by_freq=scale_grad_by_freq, how=how,
    )  # fmt: skip


_PTR = {"torch.float32": "*fp32", "torch.float16": "*fp16", "torch.bfloat16": "*bf16",
        "torch.float64": "*fp64", "torch.int32": "*i32", "torch.int64": "*i64"}  # fmt: skip


def _job(plan: ScatterPlan, src_dtype: str, kernel: str, arch: str) -> dict:
    """resources.py's compile job of one of the plan's kernels."""
    out, idx, src = _PTR[plan.shape.dtype], _PTR[plan.shape.index_dtype], _PTR[src_dtype]
    checks = [("err_ptr", "*i64"), ("flag_ptr", "*i64")]
    if kernel == "scatter_sorted":
        ptrs = [("src_ptr", src), ("sorted_ptr", idx), ("perm_ptr", "*i64"),
                ("bounds_ptr", "*i64"), ("out_ptr", out), ("base_ptr", out),
                ("ws_ptr", "*fp32"), ("cnt_ptr", "*i32"), *checks]  # fmt: skip
        ints = ["n_tokens", "n_rows", "n_cols", "src_row_stride", "src_col_stride",
                "out_row_stride", "base_row_stride", "padding_idx"]  # fmt: skip
    elif kernel == "scatter_table":
        ptrs = [("src_ptr", src), ("index_ptr", idx), ("ws_ptr", "*fp32"),
                ("cnt_ptr", "*i32"), *checks]  # fmt: skip
        ints = ["n_tokens", "n_rows", "n_cols", "src_row_stride", "src_col_stride",
                "index_stride"]  # fmt: skip
    elif kernel == "scatter_finalize":
        ptrs = [("ws_ptr", "*fp32"), ("cnt_ptr", "*i32"), ("out_ptr", out), ("base_ptr", out)]
        ints = ["n_parts", "n_rows", "n_cols", "out_row_stride", "base_row_stride",
                "padding_idx"]  # fmt: skip
    else:
        ptrs = [("src_ptr", src), ("index_ptr", idx), ("acc_ptr", "*fp32"), *checks]
        ints = ["n_tokens", "n_rows", "n_cols", "src_row_stride", "src_col_stride",
                "index_stride", "acc_row_stride", "padding_idx"]  # fmt: skip
    sig = dict(ptrs) | {k: "i32" for k in ints}
    if kernel != "scatter_table":
        sig["alpha"] = "fp32"
    fin = kernel == "scatter_finalize"
    return {
        "source": render_scatter(plan, False, src_dtype),
        "name": kernel,
        "signature": sig,
        "aligned": list(range(len(ptrs))),
        "num_warps": plan.finalize.num_warps if fin else plan.num_warps,
        "arch": int(arch.removeprefix("sm_")),
    }


def resources(plan: ScatterPlan, src_dtype: str, arch: str = "sm_90") -> dict:
    """Registers and spills ptxas gives the plan's kernel for `arch`, compiled without a
    GPU (fuser/runtime/resources.py; in a child process where this one interprets); with
    a finalize, its figures under "finalize"."""
    return resources_of([(plan, src_dtype)], arch)[0]


def resources_of(plans: list[tuple[ScatterPlan, str]], arch: str = "sm_90") -> list[dict]:
    """`resources` of several (plan, src dtype) pairs, compiled in one child process."""
    main = {"runs": "scatter_sorted", "split": "scatter_sorted", "table": "scatter_table"}
    jobs, ends = [], []
    for plan, src_dtype in plans:
        jobs.append(_job(plan, src_dtype, main.get(plan.kind, "scatter_atomic"), arch))
        if plan.finalize is not None:
            jobs.append(_job(plan, src_dtype, "scatter_finalize", arch))
        ends.append(len(jobs))
    got = resources_in_child(jobs) if use_interpreter() else [_compile_triton(j) for j in jobs]
    out, at = [], 0
    for end in ends:
        out.append(got[at] | ({"finalize": got[at + 1]} if end - at > 1 else {}))
        at = end
    return out


__all__ = ["ScatterShape", "embedding_backward", "scatter_add_rows", "source_of"]
