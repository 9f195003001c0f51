"""One chunk of fuser::linear_cross_entropy (linear_ce.py): fuser's one-pass cross-entropy
kernel over a block of logit rows, and the fp32 accumulation of the weight gradient.

The kernel is the one ce_lower.py makes of fuser::cross_entropy, reused, not rewritten:
the chunk is the FX graph

    loss_rows, grad = fuser::cross_entropy(logits, target, 'none', ignore, eps, upcast)
    out = (grad * scale).to(logits.dtype)      # scale: 1/count for a mean, 1 for a sum

lowered through the same region machinery as any compiled graph (region.build_definition),
so ce_lower.py's math, target check and schedules are the ones used. The gradient is kept
in float32 until it is scaled, so it is rounded to the logits' dtype once, as eager's is.

In place: the kernel walks each row with one program (inner_persistent or inner_looped:
every load of an element comes before the store of its gradient), and its output has the
layout of its input, so it is launched with the logits' buffer as the gradient's too: a
chunk holds one [rows, V] buffer, not two. Any other plan (an ATen segment, a split row)
runs through fd.execute into fresh buffers and is copied back: the same result, twice the
chunk's memory.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

import fuser.dynamo.ce_op as ce_op
from fuser.config import config
from fuser.dynamo.context import NotLowerable
from fuser.dynamo.region import RegionPlan, build_definition
from fuser.errors import FuserError
from fuser.frontend.fusion_definition import FusionDefinition
from fuser.runtime.kernel import device_problem

aten = torch.ops.aten
# schedules with one program per row that load an element before storing its gradient
IN_PLACE_KINDS = ("inner_persistent", "inner_looped")


@dataclass
class ChunkKernel:
    """The chunk's fusion (None: fuser cannot run it here, and ATen ops compute the
    chunk: `note` says why); `order` maps each argument of its one kernel to an input
    (False, i) or an output (True, i) when it can run in place, else is None."""

    fd: FusionDefinition | None
    ignore: int
    eps: float
    kernel: Any = None
    order: tuple[tuple[bool, int], ...] | None = None
    note: str = ""

    def run(
        self, logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, loss: torch.Tensor
    ) -> None:
        """loss[:] = the rows' losses; logits[:] = their gradient (scaled)."""
        if self.kernel is not None and self.order is not None:
            out = loss if _alignment(loss) >= 16 else torch.empty_like(loss)
            ins, outs = (logits, target, scale), (out, logits)
            self.kernel.launch([outs[i] if is_out else ins[i] for is_out, i in self.order])
            if out is not loss:  # a chunk of rows not a multiple of 4: planned for 16
                loss.copy_(out)
            return
        if self.fd is not None:
            rows, grad = self.fd.execute([logits, target, scale])
        else:  # fuser::cross_entropy's ATen implementation (its gradient rounded twice)
            rows, grad = ce_op.cross_entropy(logits, target, 0, self.ignore, self.eps, True)
            grad = (grad.float() * scale).to(logits.dtype)
        loss.copy_(rows)
        logits.copy_(grad)

    def schedule(self) -> str:
        if self.kernel is not None:
            return self.kernel.schedule.short()
        return "ATen segments" if self.fd is not None else "ATen ops"


def _alignment(t: torch.Tensor) -> int:
    """The largest power of two up to 16 dividing t's address (kernels are planned for it)."""
    ptr = t.data_ptr() if t.device.type != "meta" else 0
    return 16 if ptr % 16 == 0 else ptr & -ptr


def _meta(shape: list[int], dtype: torch.dtype, stride: Any = None) -> torch.Tensor:
    if stride is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def _node(g: fx.Graph, target: Any, args: tuple, val: Any, **kwargs: Any) -> fx.Node:
    n = g.call_function(target, args, kwargs)
    n.meta["val"] = val
    return n


def chunk_definition(
    rows: int, cols: int, dtype: torch.dtype, target_dtype: torch.dtype, ignore: int, eps: float
) -> FusionDefinition:
    """The chunk's FusionDefinition, lowered from its FX graph by ce_lower.py."""
    g = fx.Graph()
    logits, target, scale = (g.placeholder(n) for n in ("logits", "target", "scale"))
    logits.meta["val"] = _meta([rows, cols], dtype)
    target.meta["val"] = _meta([rows], target_dtype)
    scale.meta["val"] = _meta([], torch.float32)
    # the gradient's recorded dtype is float32: ce_lower rounds each output to its
    # recorded dtype, and this one is rounded after the scale instead
    pair_val = (_meta([rows], torch.float32), _meta([rows, cols], torch.float32))
    ce = torch.ops.fuser.cross_entropy.default
    pair = _node(g, ce, (logits, target, 0, ignore, eps, True), pair_val)
    loss = _node(g, operator.getitem, (pair, 0), pair_val[0])
    grad = _node(g, operator.getitem, (pair, 1), pair_val[1])
    scaled = _node(g, aten.mul.Tensor, (grad, scale), pair_val[1])
    out = _node(
        g, torch.ops.prims.convert_element_type.default, (scaled, dtype), _meta([rows, cols], dtype)
    )
    g.output((loss, out))
    fd, _ = build_definition(RegionPlan.of([pair, loss, grad, scaled, out]))
    return fd


def _in_place_order(fd: FusionDefinition, kernels: list[Any]) -> tuple[Any, Any, str]:
    """(the kernel, its argument order) when the chunk is one in-place-safe kernel."""
    if len(kernels) != 1:
        return None, None, f"{len(kernels)} kernels: run through fd.execute, out of place"
    k = kernels[0]
    if k.schedule.kind not in IN_PLACE_KINDS or k.schedule.split_rows > 1:
        return None, None, f"a {k.schedule.kind} kernel: out of place"
    final = fd.pipeline().final
    ins = [v.id for v in final.inputs]
    outs = [v.id for v in final.outputs]
    order = []
    for is_out, vid, _shape, _dtype in k.arg_plan:
        ids = outs if is_out else ins
        if vid not in ids:
            return None, None, "the kernel reads an intermediate: out of place"
        order.append((is_out, ids.index(vid)))
    if sorted(order) != sorted([(False, 0), (False, 1), (False, 2), (True, 0), (True, 1)]):
        return None, None, "the kernel's arguments are not the chunk's: out of place"
    return k, tuple(order), "one kernel, the gradient written over the logits"


_CACHE: dict[tuple, ChunkKernel] = {}


def chunk_kernel(
    logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, ignore: int, eps: float
) -> ChunkKernel:
    """The chunk's kernel for these (real or meta) tensors, planned once per signature."""
    rows, cols = logits.shape
    key = (rows, cols, logits.dtype, target.dtype, str(logits.device), ignore, eps)
    key += (config.backend, _alignment(logits), _alignment(target))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    ck = _plan(logits, target, scale, ignore, eps)
    if logits.device.type != "meta":  # a meta plan (for explain) is not the one that runs
        _CACHE[key] = ck
        if ck.fd is None:
            warnings.warn(f"fuser: linear_cross_entropy: {ck.note}", stacklevel=3)
    return ck


def _plan(
    logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, ignore: int, eps: float
) -> ChunkKernel:
    problem = None
    if logits.device.type != "meta":
        problem = device_problem(config.backend, logits.device.type)
    if problem:
        return ChunkKernel(
            None, ignore, eps, note=f"the chunks' cross-entropy runs as ATen ops: {problem}"
        )
    try:
        rows, cols = logits.shape
        fd = chunk_definition(rows, cols, logits.dtype, target.dtype, ignore, eps)
        with unset_fake_temporarily():
            kernels = fd.compile([logits, target, scale])
    except (NotLowerable, FuserError) as e:
        why = f"the chunks' cross-entropy runs as ATen ops: {type(e).__name__}: {e}"
        return ChunkKernel(None, ignore, eps, note=why)
    kernel, order, note = _in_place_order(fd, kernels)
    return ChunkKernel(fd, ignore, eps, kernel, order, note)


# -- the weight gradient's accumulation ------------------------------------------------
_FUSED_FP32: dict[str, bool] = {}  # per CUDA device: addmm with out_dtype works there


def _fused_fp32_works(device: torch.device) -> bool:
    """Whether cuBLAS accumulates bf16/fp16 products into a float32 output in place
    (torch.addmm(..., out_dtype=torch.float32, out=c)) here: checked once per device on
    a small case against float32 math; any error or difference means no."""
    name = str(device)
    if name not in _FUSED_FP32:
        if torch.cuda.is_current_stream_capturing():
            return False  # no probe inside a CUDA graph capture; the next call probes
        try:
            g = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(64, 48, device=device, generator=g).bfloat16()
            b = torch.randn(48, 40, device=device, generator=g).bfloat16()
            c = torch.randn(64, 40, device=device, generator=g)
            want = c + a.float() @ b.float()
            torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
            _FUSED_FP32[name] = bool(torch.allclose(c, want, atol=1e-3, rtol=1e-3))
        except (RuntimeError, TypeError):
            _FUSED_FP32[name] = False
    return _FUSED_FP32[name]


def accumulation(device: torch.device, dtype: torch.dtype) -> str:
    """How dW += gradᵀ x accumulates for a compute dtype on a device (explain's words)."""
    if dtype == torch.float32:
        return "addmm_ into the float32 dW"
    if device.type != "cuda":
        return "each chunk's product in float32 (CPU), added into the float32 dW"
    if device.type == "cuda" and _FUSED_FP32.get(str(device)) is False:
        return (
            f"each chunk's {dtype} product added into the float32 dW (addmm with "
            "out_dtype=float32 did not work on this device)"
        )
    return "addmm with out_dtype=float32 into the float32 dW (cuBLAS accumulates in place)"


def accumulate_dw(dw: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> None:
    """dw += gradᵀ @ x, dw float32, grad and x in the compute dtype."""
    if grad.dtype == dw.dtype:
        dw.addmm_(grad.t(), x)
    elif dw.device.type != "cuda":
        dw.addmm_(grad.t().float(), x.float())
    elif _fused_fp32_works(dw.device):
        torch.addmm(dw, grad.t(), x, out_dtype=torch.float32, out=dw)
    else:  # one rounding of each chunk's product to the compute dtype, then fp32 sums
        dw.add_(torch.mm(grad.t(), x))
