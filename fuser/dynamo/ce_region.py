"""The fused region torch.compile(backend="fuser") makes of one fuser::cross_entropy call
(ce_op.py, lowered by ce_lower.py), as a FusionDefinition to plan, print or run on its own:
what the tests and benchmarks of the one-pass row kernel look at, without a model."""

from __future__ import annotations

import operator

import torch
from torch import fx

import fuser.dynamo.ce_op  # noqa: F401  (defines torch.ops.fuser.cross_entropy)
from fuser.dynamo.region import RegionPlan, build_definition
from fuser.frontend.fusion_definition import FusionDefinition


def one_pass_fusion(
    logits: torch.Tensor, target: torch.Tensor, aligned: bool = True
) -> FusionDefinition:
    """The region of fuser::cross_entropy(logits, target), mean over the targets,
    ignore_index -100, no smoothing, the logits upcast to float32, the gradient's rows
    16-byte aligned where `aligned`; `logits` and `target` (meta tensors will do) give the
    shapes, strides and dtypes. Its outputs: the loss and the gradient."""
    g = fx.Graph()
    xn, tn = g.placeholder("logits"), g.placeholder("target")
    xm = torch.empty_strided(logits.shape, logits.stride(), dtype=logits.dtype, device="meta")
    tm = torch.empty(target.shape, dtype=target.dtype, device="meta")
    xn.meta["val"], tn.meta["val"] = xm, tm
    args = (xn, tn, 1, -100, 0.0, True, aligned)
    val = torch.ops.fuser.cross_entropy(xm, tm, *args[2:])
    pair = g.call_function(torch.ops.fuser.cross_entropy.default, args)
    loss = g.call_function(operator.getitem, (pair, 0))
    grad = g.call_function(operator.getitem, (pair, 1))
    for n, m in ((pair, val), (loss, val[0]), (grad, val[1])):
        n.meta["val"] = m
    g.output((loss, grad))
    fd, _ = build_definition(RegionPlan.of([pair, loss, grad]))
    return fd
