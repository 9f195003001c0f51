"""Fusions used by the demo, the tests and the benchmarks; `fuser.examples.gpt2`: the
small GPT-2 the README, the training script and the benchmarks compile."""

from __future__ import annotations

import torch

from fuser.frontend.fusion_definition import FusionDefinition


def seed_layernorm_fusion(dtype: torch.dtype = torch.float16) -> FusionDefinition:
    """The seed LayerNormFusedOp, written the way ATen computes it.

    t13 = float(half(float(t1) + float(t0))) + float(t2)
    y   = half(layer_norm(t13) * float(t4) + float(t3))
    t1 is [rows, H]; t0, t2, t3, t4 are [H].
    """
    with FusionDefinition("ln_fused") as fd:
        t0 = fd.define_tensor(shape=[-1], dtype=dtype)
        t1 = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        t2 = fd.define_tensor(shape=[-1], dtype=dtype)
        t3 = fd.define_tensor(shape=[-1], dtype=dtype)
        t4 = fd.define_tensor(shape=[-1], dtype=dtype)
        ops = fd.ops

        def row(v):  # [H] -> [rows, H], computed in float32
            return ops.broadcast_in_dim(
                ops.cast(v, torch.float32), shape=t1.shape, broadcast_dims=[1]
            )

        t5 = ops.add(ops.cast(t1, torch.float32), row(t0))
        t13 = ops.add(ops.cast(ops.cast(t5, dtype), torch.float32), row(t2))
        t14 = ops.layer_norm(t13, eps=1e-5)
        y = ops.cast(ops.add(ops.mul(t14, row(t4)), row(t3)), dtype)
        fd.add_output(y)
    return fd


def seed_inputs(
    rows: int, hidden: int, dtype: torch.dtype = torch.float16, device: str = "cpu"
) -> list[torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(rows * 131 + hidden)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    return [rnd(hidden), rnd(rows, hidden), rnd(hidden), rnd(hidden), rnd(hidden)]
