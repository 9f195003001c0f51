"""Launch the GEMM template, and the same computation in ATen ops (cuBLAS + pointwise).

The source comes from the renderer for the plan of the call's shape; it is loaded through
the one Triton path every fuser kernel takes (runtime/triton_backend.load_module: written
to the cache folder under its hash, interpreted for CPU tensors). Nothing is copied: A, B
and the epilogue's tensors are passed with their strides. A split-K plan launches its
main kernel (fp32 partials to a workspace) and then its finalize (the fixed-order sum and
the epilogue). `warm_up` compiles the kernels a call will launch, from fake tensors, for
runtime/precompile.py.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

from fuser.codegen.triton.gemm import render_gemm
from fuser.errors import FuserError
from fuser.runtime import timing
from fuser.runtime.kernel import _jit_cache_size
from fuser.runtime.timing import KernelTime
from fuser.runtime.triton_backend import WARMED, device_problem, load_module
from fuser.schedulers import device as devices
from fuser.schedulers.gemm import (
    DTYPES,
    INT32_MAX,
    STRIDES,
    Epilogue,
    GemmPlan,
    GemmShape,
    plan_gemm,
    unsupported,
)

PLAIN = Epilogue()  # no fused work
Result = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


@functools.lru_cache(maxsize=512)
def plan_for(shape: GemmShape, epilogue: Epilogue) -> GemmPlan:
    sms = devices.current().sms if shape.device == "cuda" else 132
    return plan_gemm(shape, epilogue, sms)


@functools.lru_cache(maxsize=512)
def source_of(plan: GemmPlan) -> str:
    return render_gemm(plan)


def _extent(t: torch.Tensor) -> int:
    """Elements between a tensor's first and last, plus one."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()) if s > 0)


def _name(dtype: torch.dtype) -> str:
    return DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def shape_of(
    a: Any, b: Any, epilogue: Epilogue, out_dtype: torch.dtype | None = None, *extra: Any
) -> GemmShape:
    """The GemmShape of A @ B (real or fake tensors); `extra`: the epilogue's tensors,
    whose extents decide 64-bit offsets too."""
    m, k = a.shape
    n = b.shape[1]
    tensors = [t for t in (a, b, *extra) if isinstance(t, torch.Tensor)]
    big = max(m * n, max((_extent(t) for t in tensors), default=0)) > INT32_MAX
    return GemmShape(
        m, n, k, _name(b.dtype), _name(a.dtype), _name(out_dtype or b.dtype),
        a.device.type, big,
    )  # fmt: skip


def _as_tile(t: torch.Tensor | None, m: int, n: int, what: str) -> torch.Tensor:
    """An [M, N] view of an epilogue operand ([..., N] with M rows in all)."""
    if t is None:
        raise FuserError(f"GEMM template: the epilogue reads {what}, and none was given")
    if t.numel() != m * n or t.shape[-1] != n:
        raise FuserError(f"GEMM template: {what} {list(t.shape)} is not [{m}, {n}]")
    return t if t.dim() == 2 else t.reshape(m, n)  # a view where the strides allow


def _check(a: torch.Tensor, b: torch.Tensor, shape: GemmShape, e: Epilogue) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise FuserError(f"GEMM template: A {list(a.shape)} @ B {list(b.shape)}")
    if a.device != b.device:
        raise FuserError(f"GEMM template: A on {a.device}, B on {b.device}")
    why = unsupported(shape, e) or device_problem(a.device.type)
    if why is not None:
        raise FuserError(f"GEMM template: {why}")


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    epilogue: Epilogue = PLAIN,
    *,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    pre: torch.Tensor | None = None,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    mask_scale: float | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    plan: GemmPlan | None = None,
) -> Result:
    """(C, the pre-activation or None, the sums or None) of A [M, K] @ B [K, N] with the
    epilogue's fused work (see schedulers/gemm.Epilogue). bias: [N]; residual, pre and
    mask (dropout's saved mask, any dtype: bool as it saves it): [M, N] (or [..., N]
    views of M rows); scale: the prologue's factor; mask_scale: 1 / (1 - p). C is made [M, N]
    contiguous in `out_dtype` (B's dtype by default) unless `out` is given (any strides);
    the pre-activation in B's dtype; the sums ([M] for "a_rows", [N] for "b_cols") in the
    summed operand's dtype. `plan` overrides the planner's tiles (the autotune)."""
    e = epilogue
    extra = (bias, residual, pre, mask, out)
    shape = shape_of(a, b, e, out_dtype or (out.dtype if out is not None else None), *extra)
    _check(a, b, shape, e)
    plan = plan_for(shape, e) if plan is None else plan
    if plan.shape != shape or plan.epilogue != e:
        raise FuserError(f"GEMM template: plan {plan.name} is for {plan.shape.line()}")
    kw = {"bias": bias, "residual": residual, "pre": pre, "scale": scale, "out": out}
    kw |= {"mask": mask, "mask_scale": mask_scale}
    tensors, values = _operands(plan, a, b, out_dtype or b.dtype, **kw)
    interpret = a.device.type != "cuda"
    module = load_module(source_of(plan), interpret=interpret)
    if interpret:
        _launch(module, plan, tensors, values)
    else:
        with torch.cuda.device(a.device):  # the JIT compiles and launches for a's GPU
            _first_launch_timed(module, plan, tensors, values)
    return tensors["C"], tensors.get("AUX"), tensors.get("SUMS")


def warm_up(
    a: Any,
    b: Any,
    epilogue: Epilogue = PLAIN,
    *,
    bias: Any = None,
    residual: Any = None,
    pre: Any = None,
    scale: float | None = None,
    mask: Any = None,
    mask_scale: float | None = None,
    out_dtype: torch.dtype | None = None,
    plan: GemmPlan | None = None,
) -> GemmPlan:
    """Compile, without launching, the kernels `gemm` launches for tensors like these:
    fake or meta ones do (only their dtypes, sizes, strides and device are read); the
    arguments are made as `gemm` makes them, so Triton specializes them alike. The plan."""
    e = epilogue
    shape = shape_of(a, b, e, out_dtype, bias, residual, pre, mask)
    _check(a, b, shape, e)
    plan = plan_for(shape, e) if plan is None or plan.shape != shape else plan
    meta = [_meta(t) for t in (a, b, bias, residual, pre, mask)]
    kw: dict[str, Any] = dict(zip(("bias", "residual", "pre", "mask"), meta[2:], strict=True))
    kw |= {"scale": scale, "mask_scale": mask_scale}
    tensors, values = _operands(plan, *meta[:2], out_dtype or b.dtype, **kw)
    module = load_module(source_of(plan), interpret=False)
    _launch(module, plan, tensors, values, warm=True)
    WARMED.add(source_of(plan))
    return plan


def _meta(t: Any) -> Any:
    """A meta tensor of t's size, strides and dtype (t: a real or fake tensor, or None)."""
    if not isinstance(t, torch.Tensor):
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _operands(
    plan: GemmPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype,
    *,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    pre: torch.Tensor | None = None,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    mask_scale: float | None = None,
    out: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The kernels' tensors by argument name (outputs and split-K workspaces made on a's
    device) and their scalars (sizes, strides, the scale)."""
    e, dev = plan.epilogue, a.device
    m, n = a.shape[0], b.shape[-1]
    out = torch.empty((m, n), dtype=out_dtype, device=dev) if out is None else out
    tensors: dict[str, torch.Tensor] = {"A": a, "B": b, "C": out}
    if e.bias:
        if bias is None or bias.numel() != n:
            raise FuserError(f"GEMM template: bias must have N={n} elements")
        tensors["BIAS"] = bias.reshape(n)
    if e.aux:
        tensors["AUX"] = torch.empty((m, n), dtype=b.dtype, device=dev)
    if e.mask:
        if mask_scale is None:
            raise FuserError("GEMM template: the epilogue applies a mask, and no mask_scale")
        tensors["MASK"] = _as_tile(mask, m, n, "the mask")
    if e.gelu_grad != "none":
        tensors["PRE"] = _as_tile(pre, m, n, "the pre-activation")
    if e.residual:
        tensors["RES"] = _as_tile(residual, m, n, "the residual")
    if e.reduce != "none":
        summed = a if e.reduce == "a_rows" else b
        size = m if e.reduce == "a_rows" else n
        tensors["SUMS"] = torch.empty(size, dtype=summed.dtype, device=dev)
    if plan.split:  # fp32 partials, every element written by the main kernel
        split = plan.tiles.split_k
        tensors["PART"] = torch.empty((split, m, n), dtype=torch.float32, device=dev)
        if e.reduce != "none":
            size = m if e.reduce == "a_rows" else n
            tensors["PSUMS"] = torch.empty((split, size), dtype=torch.float32, device=dev)
    if e.a_scale and scale is None:
        raise FuserError("GEMM template: the prologue scales A, and no scale was given")
    values: dict[str, Any] = {"scale": float(scale or 1.0), "M": m, "N": n, "K": a.shape[1]}
    values["mask_scale"] = float(mask_scale or 1.0)
    for name, t in tensors.items():
        values.update(zip(STRIDES.get(name, ()), t.stride()))
    return tensors, values


def _launch(module: Any, plan: GemmPlan, tensors: dict, values: dict, warm: bool = False) -> None:
    """Launch the plan's kernels in order (`warm`: compile them for these arguments'
    types, sizes and strides, launching nothing; tensors then stand for their dtypes)."""
    t = plan.tiles
    consts: dict[str, int] = {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n}
    if plan.split:
        consts["SPLIT_K"] = t.split_k
    options = {"num_warps": t.num_warps, "num_stages": t.num_stages}
    for i, (name, grid, signature) in enumerate(plan.kernels()):
        args = [tensors[a] if a in tensors else values[a] for a in signature]
        kw = dict(consts, **options)
        if i == 0:  # the main kernel; the finalize has no K loop
            kw |= {"BLOCK_K": t.block_k, "GROUP_M": t.group_m}
        else:
            kw["num_stages"] = 1
        fn = getattr(module, name)
        if warm:
            fn.warmup(*[x.dtype if isinstance(x, torch.Tensor) else x for x in args],
                      grid=(grid,), **kw)  # fmt: skip
        else:
            fn[(grid,)](*args, **kw)


def _first_launch_timed(module: Any, plan: GemmPlan, tensors: dict, values: dict) -> None:
    """Launch; the first launch of each kernel in this process reports its time and
    whether precompile warmed it up (explain's first-step ledger), as fused kernels do."""
    fn = getattr(module, plan.name)
    before = _jit_cache_size(fn)
    t0 = time.perf_counter()
    _launch(module, plan, tensors, values)
    source = source_of(plan)
    if _jit_cache_size(fn) == before and source in _timed:
        return
    _timed.add(source)
    if source not in WARMED:
        origin = "JIT (Triton's cache or compiled)"
    elif _jit_cache_size(fn) > before:
        origin = "warmed up, but compiled again at its first launch"
    else:
        origin = "warmed up"
    timing.kernel(KernelTime(plan.name, "triton", origin, time.perf_counter() - t0))


_timed: set[str] = set()  # sources whose first launch was timed


def _gelu(x: torch.Tensor, kind: str) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh" if kind == "gelu_tanh" else "none")


def aten_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    epilogue: Epilogue = PLAIN,
    *,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    pre: torch.Tensor | None = None,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    mask_scale: float | None = None,
    out_dtype: torch.dtype | None = None,
) -> Result:
    """The same results as `gemm` from ATen ops, as eager computes them: cuBLAS (addmm
    with the bias) and a separate op for each piece of fused work. The reference of the
    tests and the other side of the autotune."""
    e = epilogue
    m, n = a.shape[0], b.shape[1]
    a_stored = a
    if e.a_cast:
        a = a.to(b.dtype)
    if e.a_scale:
        a = a * scale
    x = torch.addmm(bias.reshape(n), a, b) if e.bias else a @ b
    aux = x if e.aux else None
    if e.activation != "none":
        x = _gelu(x, e.activation)
    if e.mask:  # as native_dropout_backward decomposes: x * (mask.to(x) * scale)
        x = x * (mask.reshape(m, n).to(x.dtype) * mask_scale)
    if e.gelu_grad != "none":
        p = pre.reshape(m, n)
        approx = "tanh" if e.gelu_grad == "gelu_tanh" else "none"
        x = torch.ops.aten.gelu_backward(x, p, approximate=approx)
    if e.residual:
        x = x + residual.reshape(m, n)
    if out_dtype is not None:
        x = x.to(out_dtype)
    sums = None
    if e.reduce == "a_rows":
        sums = a_stored.sum(1)
    elif e.reduce == "b_cols":
        sums = b.sum(0)
    return x, aux, sums
