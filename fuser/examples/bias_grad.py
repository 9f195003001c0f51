"""Bias-gradient fusions (column sums of [M, N]), as a training step's backward has them:

- `dy.float().sum(0)` ("f32"): bf16 dy, fp32 result;
- `dy.sum(0)` ("same"): the result in dy's dtype;
- `gelu_backward(dy, x)` with its column sum ("gelu"): dx = dy * gelu'(x) (tanh form) is
  written and db = dx.float().sum(0) from the same pass, the two outputs (dx, db).

The benchmark of the outer scheduler (benchmarks/outer_sweep.py) and its tests use them.
"""

from __future__ import annotations

import math

import torch

from fuser.frontend.fusion_definition import FusionDefinition

FORMS = ("f32", "same", "gelu")


def bias_grad_fusion(form: str, dtype: torch.dtype) -> FusionDefinition:
    """The fusion of `form` (one of FORMS) on a [M, N] dy of `dtype`."""
    if form not in FORMS:
        raise ValueError(f"unknown bias-gradient form {form!r}; choose from {FORMS}")
    with FusionDefinition(f"bias_grad_{form}") as fd:
        o = fd.ops
        dy = fd.define_tensor([-1, -1], dtype)
        if form == "f32":
            fd.add_output(o.sum(o.cast(dy, torch.float32), dims=[0]))
        elif form == "same":
            fd.add_output(o.sum(dy, dims=[0]))
        else:
            k = math.sqrt(2.0 / math.pi)
            x = o.cast(fd.define_tensor([-1, -1], dtype), torch.float32)
            x2 = o.mul(x, x)
            t = o.tanh(o.mul(k, o.add(x, o.mul(0.044715, o.mul(x, x2)))))
            dt = o.mul(o.sub(1.0, o.mul(t, t)), o.mul(k, o.add(1.0, o.mul(3 * 0.044715, x2))))
            grad = o.add(o.mul(0.5, o.add(1.0, t)), o.mul(o.mul(0.5, x), dt))
            dx = o.cast(o.mul(o.cast(dy, torch.float32), grad), dtype)
            fd.add_output(dx)
            fd.add_output(o.sum(o.cast(dx, torch.float32), dims=[0]))
    return fd


def bias_grad_eager(form: str, ins: list[torch.Tensor]) -> list[torch.Tensor]:
    """What eager PyTorch computes for `form` (the reference and the baselines' function)."""
    dy = ins[0]
    if form == "f32":
        return [dy.float().sum(0)]
    if form == "same":
        return [dy.sum(0)]
    dx = torch.ops.aten.gelu_backward(dy, ins[1], approximate="tanh")
    return [dx, dx.float().sum(0)]


def bias_grad_inputs(form: str) -> int:
    """How many [M, N] inputs `form` takes."""
    return 2 if form == "gelu" else 1
