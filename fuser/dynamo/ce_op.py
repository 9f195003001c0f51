"""fuser::cross_entropy: the loss and its gradient in one op, for the torch.compile path.

`F.cross_entropy(logits.float(), t)` under autograd is a forward that reads the logits
once (max, sum, loss) and a backward that reads them again to write the gradient. When
the backward will run, both can come from one pass: the gradient of the loss for an
upstream gradient of 1 is softmax - target distribution (divided by the count of valid
targets for a mean), known as soon as the row's max and sum are. So ce_rewrite.py
replaces the call, before AOTAutograd, by

    loss, grad = fuser::cross_entropy(logits, target, reduction, ignore_index,
                                      label_smoothing, upcast)

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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
REDUCTION_CODE = {v: k for k, v in _REDUCTIONS.items()}


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
    return loss.to(loss_dtype(logits, upcast)), grad.to(logits.dtype)


@cross_entropy.register_fake
def _cross_entropy_fake(logits, target, reduction, ignore_index, label_smoothing, upcast):  # type: ignore[no-untyped-def]
    shape = list(logits.shape[:1]) if reduction == 0 else []
    loss = logits.new_empty(shape, dtype=loss_dtype(logits, upcast))
    return loss, torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.custom_op("fuser::cross_entropy_grad", mutates_args=())
def cross_entropy_grad(grad: torch.Tensor, grad_loss: torch.Tensor) -> torch.Tensor:
    """The saved unit-upstream gradient times the upstream gradient (a 0-d tensor, or one
    per row for reduction 'none'), in the gradient's dtype."""
    g = grad_loss.float()
    g = g[:, None] if g.dim() == 1 else g
    return (grad.float() * g).to(grad.dtype)


@cross_entropy_grad.register_fake
def _cross_entropy_grad_fake(grad, grad_loss):  # type: ignore[no-untyped-def]
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(output[1])


def _backward(ctx: Any, grad_loss: torch.Tensor, grad_grad: Any) -> tuple:
    (grad,) = ctx.saved_tensors
    return cross_entropy_grad(grad, grad_loss), None, None, None, None, None


cross_entropy.register_autograd(_backward, setup_context=_setup)
