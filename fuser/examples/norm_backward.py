"""Norm backwards as fuser lowers native_layer_norm_backward (and RMSNorm's), the fusions
the inner-outer scheduler takes: dx row by row, the parameters' gradients as column
partials. The benchmark of its row loop (benchmarks/inner_outer_variants.py) and its
tests use them.

- "ln": LayerNorm, bf16 dy and x, fp32 weight and statistics: dx (bf16), dw, db;
- "gpt2": the GPT-2 residual form, x in fp32, the residual gradient dh added to dx,
  written in fp32 and cast to bf16: dh + dx, its bf16 cast, dw, db;
- "rms": RMSNorm, no mean: dx (bf16), dw.
"""

from __future__ import annotations

import torch

from fuser.frontend.fusion_definition import FusionDefinition

KINDS = ("ln", "gpt2", "rms")
F32, BF16 = torch.float32, torch.bfloat16


def norm_backward_fusion(kind: str, cols: int) -> FusionDefinition:
    """The backward of `kind` over rows of `cols`; inputs dy, x, w, [mean], rstd, [dh]."""
    if kind not in KINDS:
        raise ValueError(f"unknown norm backward {kind!r}; choose from {KINDS}")
    x_dtype = F32 if kind == "gpt2" else BF16
    with FusionDefinition(f"{kind}_bwd") as fd:
        o = fd.ops
        dy = fd.define_tensor([-1, -1], BF16)
        x = fd.define_tensor([-1, -1], x_dtype)
        w = fd.define_tensor([-1], F32)
        mean = None if kind == "rms" else fd.define_tensor([-1], F32)
        rstd = fd.define_tensor([-1], F32)
        dh = fd.define_tensor([-1, -1], F32) if kind == "gpt2" else None

        def rows(v):  # noqa: ANN001, ANN202
            return o.broadcast_in_dim(v, shape=x.shape, broadcast_dims=[0])

        g = o.cast(dy, F32)
        xf = o.cast(x, F32) if x_dtype != F32 else x
        xhat = o.mul(xf if mean is None else o.sub(xf, rows(mean)), rows(rstd))
        wg = o.mul(g, o.broadcast_in_dim(w, shape=x.shape, broadcast_dims=[1]))
        c1 = o.div(o.sum(o.mul(wg, xhat), dims=[1]), float(cols))
        inner = o.sub(wg, o.mul(xhat, rows(c1)))
        if mean is not None:
            inner = o.sub(inner, rows(o.div(o.sum(wg, dims=[1]), float(cols))))
        dx = o.mul(rows(rstd), inner)
        if dh is not None:
            dx = o.add(dh, dx)
            fd.add_output(dx)
        fd.add_output(o.cast(dx, BF16))
        fd.add_output(o.sum(o.mul(g, xhat), dims=[0]))
        if mean is not None:
            fd.add_output(o.sum(g, dims=[0]))
    return fd
