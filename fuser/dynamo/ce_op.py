"""fuser::cross_entropy: the loss and its gradient in one op, for the torch.compile path.

`F.cross_entropy(logits.float(), t)` under autograd is a forward that reads the logits
once (max, sum, loss) and a backward that reads them again to write the gradient. When
the backward will run, both can come from one pass: the gradient of the loss for an
upstream gradient of 1 is softmax - target distribution (divided by the count of valid
targets for a mean), known as soon as the row's max and sum are. So ce_rewrite.py
replaces the call, before AOTAutograd, by

    loss, grad = fuser::cross_entropy(logits, target, reduction, ignore_index,
                                      label_smoothing, upcast, aligned)

whose autograd formula is `grad_logits = fuser::cross_entropy_grad(grad, grad_loss)`:
the saved gradient scaled by the upstream one. fuser lowers the first into one fused
kernel (ce_lower.py) and runs the second in place with an early exit when the upstream
gradient is exactly 1 (`scale_in_place`), so a plain `loss.backward()` reads no logits
and writes nothing more. The functions here are the ATen (eager) implementations: the
reference, the fallback when fuser cannot lower the op, and what runs without a compile.

- logits: [N, V] floating point, any row stride. `upcast`: the user wrote logits.float();
  the loss is then float32 (as eager's), the gradient stays in the logits' dtype (eager
  casts its float32 gradient back through the .float() too).
- reduction: 0 none, 1 mean, 2 sum (torch's Reduction enum, as nll_loss takes it).

`aligned` (the rewrite's choice, ce_rewrite.py): the gradient is returned as [N, V] rows
`grad_row_stride(V, dtype)` elements apart, V rounded up to 16 bytes, instead of
contiguous. With GPT-2's odd V = 50257 contiguous rows start 2 bytes past a 16-byte
boundary (every other row), so the kernel that writes the gradient, and each later one
that reads it, moves 2-byte elements one at a time: on an H100 the one-pass bf16 kernel
ran at 1084 GB/s reading aligned logits and writing a contiguous gradient. The layout
depends on the shape, the dtype and this flag alone, never on the logits' strides: the
forward graph is rewritten after AOTAutograd traced the backward (pad_mm.py pads the lm
head and propagates shapes again), and the backward is planned for the strides the saved
gradient had when it was traced. The eager implementations return the layouts the fakes
do, so a region that falls back to them hands on what the compiled graph expects.

An aligned gradient's buffer spans whole rows: N * stride elements, the last row's gap
included (runtime/buffers.py; empty_strided would stop at its last element), here, in
the fakes, in cross_entropy_grad and wherever fuser allocates that layout. The gaps
hold garbage (no kernel writes them), but they are the gradient's own: the backward's
matmuls, padded to 16-byte K by pad_mm.py, read the gradient as [N, stride] rows in
place, its gap columns zeroed first (ce_pad.py), instead of a padded copy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fuser.runtime.buffers import empty_whole

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
REDUCTION_CODE = {v: k for k, v in _REDUCTIONS.items()}


def grad_row_stride(v: int, dtype: torch.dtype) -> int:
    """Elements between the gradient's rows: V rounded up to 16 bytes of `dtype`."""
    per = max(16 // dtype.itemsize, 1)
    return -(-v // per) * per


def _empty_grad(logits: torch.Tensor, aligned: bool) -> torch.Tensor:
    """An [N, V] buffer for the gradient of `logits`: rows 16-byte aligned, whole (the
    last row's gap is the buffer's too: ce_pad.py), or contiguous."""
    n, v = logits.shape
    stride = grad_row_stride(v, logits.dtype) if aligned else v
    return empty_whole((n, v), (stride, 1), logits.dtype, logits.device)


def loss_dtype(logits: torch.Tensor, upcast: bool) -> torch.dtype:
    return torch.float32 if upcast else logits.dtype


@torch.library.custom_op("fuser::cross_entropy", mutates_args=())
def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    reduction: int,
    ignore_index: int,
    label_smoothing: float,
    upcast: bool,
    aligned: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logits for an upstream gradient of 1 (per row for 'none'))."""
    x = logits.float()
    loss = F.cross_entropy(
        x,
        target,
        reduction=_REDUCTIONS[reduction],
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )  # checks the targets' range too
    v = x.shape[1]
    p = torch.softmax(x, dim=1)
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    dist = F.one_hot(safe, v).to(x.dtype) * (1.0 - label_smoothing) + label_smoothing / v
    scale = valid.to(x.dtype)
    if reduction == 1:  # a tensor division: no host synchronization
        scale = scale / valid.sum().to(x.dtype)
        scale = torch.where(valid, scale, 0.0)
    grad = (p - dist) * scale[:, None]
    return loss.to(loss_dtype(logits, upcast)), _empty_grad(logits, aligned).copy_(grad)


@cross_entropy.register_fake
def _cross_entropy_fake(logits, target, reduction, ignore, smoothing, upcast, aligned=False):  # type: ignore[no-untyped-def]
    shape = list(logits.shape[:1]) if reduction == 0 else []
    loss = logits.new_empty(shape, dtype=loss_dtype(logits, upcast))
    return loss, _empty_grad(logits, aligned)


@torch.library.custom_op("fuser::cross_entropy_grad", mutates_args=())
def cross_entropy_grad(grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """The saved unit-upstream gradient times the upstream gradient (a 0-d tensor, or one
    per row for reduction 'none'), in the gradient's dtype and strides (aligned rows stay
    aligned: the backward was traced with them)."""
    g = grad_loss.float()
    g = g[:, None] if g.dim() == 1 else g
    return _like(grad).copy_(grad.float() * g)


def _like(grad: torch.Tensor) -> torch.Tensor:
    """A buffer of grad's shape, dtype and strides (padded rows included, whole)."""
    return empty_whole(grad.shape, grad.stride(), grad.dtype, grad.device)


@cross_entropy_grad.register_fake
def _cross_entropy_grad_fake(grad, grad_loss):  # type: ignore[no-untyped-def]
    return _like(grad)


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(output[1])


def _backward(ctx: Any, grad_loss: torch.Tensor, grad_grad: Any) -> tuple:
    (grad,) = ctx.saved_tensors
    return cross_entropy_grad(grad, grad_loss), None, None, None, None, None, None


cross_entropy.register_autograd(_backward, setup_context=_setup)
