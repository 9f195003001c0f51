"""The backward of fuser::cross_entropy: the saved gradient times the upstream gradient,
in place, with no pass at all when the upstream gradient is 1.

The forward wrote the gradient for an upstream gradient of 1, which is what a plain
`loss.backward()` of a mean loss gives. Whether the upstream gradient is 1 is known only
on the device, and asking the host would synchronize every step, so the kernel reads it
itself: every program loads the scalar and returns at once when it is exactly 1 (a few
microseconds for the whole grid), and otherwise scales its rows (a read and a write of
the gradient: the extra pass that loss scaling or a division for gradient accumulation
costs). On a CPU the check is a plain comparison.

The saved gradient is overwritten only when the graph is freed after this backward (no
retain_graph): with retain_graph=True (or torch.autograd.grad's, or create_graph) a later
backward reads it again, so it is scaled out of place there, as eager would have it.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from fuser.runtime.buffers import empty_whole
from fuser.runtime.jit_launch import launch

try:  # Triton is what runs kernels here on a GPU; the CPU path does not need it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

# programs a GPU launches: a few per SM, each walking rows (the early exit makes the
# grid's size cost nothing when the upstream gradient is 1)
_PROGRAMS = 132 * 4
_BLOCK = 2048  # columns per step: 16 bytes a thread for 128 threads of bf16 elements

if triton is not None:

    @triton.jit
    def _scale_rows(g_ptr, s_ptr, rows, cols, row_stride, BLOCK: tl.constexpr):
        s = tl.load(s_ptr).to(tl.float32)
        if s == 1.0:
            return
        pid = tl.program_id(0)
        step = tl.num_programs(0)
        for r in range(pid, rows, step):
            base = g_ptr + r.to(tl.int64) * row_stride
            for c0 in range(0, cols, BLOCK):
                offs = c0 + tl.arange(0, BLOCK)
                mask = offs < cols
                g = tl.load(base + offs, mask=mask).to(tl.float32)
                tl.store(base + offs, (g * s).to(g_ptr.dtype.element_ty), mask=mask)


def scale_in_place(grad: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    """grad *= upstream (a 0-d tensor) in place; returns grad. Out of place (a new
    tensor, grad kept) when the backward running keeps its graph for another one."""
    if isinstance(grad, FakeTensor) or grad.device.type == "meta":
        return grad  # shape propagation (pad_mm.py) runs the graph on fake tensors
    if torch._C._autograd._get_current_graph_task_keep_graph():
        # retain_graph=True: a second backward reads the saved gradient again (scaled in
        # place, the second got s1 * s2 times it, or autograd's in-place error)
        up = upstream.to(grad.device)
        if grad.device.type != "cuda" and not bool(up != 1):
            return grad  # on the CPU the check is free; a GPU would synchronize for it
        # in grad's own strides (its rows may be padded, ce_op.aligned; whole rows, as
        # ce_pad.py reads them): the call program resolves the views of this result with
        # the layout its first call saw
        out = empty_whole(grad.shape, grad.stride(), grad.dtype, grad.device)
        return out.copy_(grad.float() * up.float())
    if grad.dim() != 2 or grad.stride(1) != 1 or grad.device.type != "cuda" or triton is None:
        if grad.device.type == "cuda":  # an unusual layout: scaled out of place, no sync
            grad.copy_((grad.float() * upstream.float()).to(grad.dtype))
        elif bool(upstream != 1):
            grad.mul_(upstream.to(grad.device))
        torch.autograd.graph.increment_version(grad)
        return grad
    rows, cols = grad.shape
    if grad.numel():
        grid = (min(rows, _PROGRAMS),)
        launch(_scale_rows, grid, grad, upstream, rows, cols, grad.stride(0), BLOCK=_BLOCK)
    torch.autograd.graph.increment_version(grad)
    return grad
