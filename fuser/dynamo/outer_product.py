"""Matmuls that contract one element are products: `bmm([B, M, 1], [B, 1, N])` is
`mul([B, M, 1], [B, 1, N])`.

`transformers` computes every rotary embedding's angles so (LlamaRotaryEmbedding and its
copies in Mistral, Qwen2, Gemma, Phi, GPT-NeoX...): `inv_freq[None, :, None] @
positions[:, None, :].float()`, an outer product of [B, D/2, 1] and [B, 1, T]. As a bmm it
is a cuBLAS launch, with the positions' cast to fp32 a kernel of its own before it. As a
product it is element-wise work that fuses with its producers and consumers: the
positions' cast and the angles are one kernel (the cos and sin another, see "Not done").

The result is the same to the bit: with K = 1 a matmul adds one product to nothing, the
product rounded once to the output dtype, as `mul` does. Not where float32 matmuls may run
in TF32 (`torch.backends.cuda.matmul.allow_tf32`, or a float32 matmul precision other than
"highest"): cuBLAS rounds the operands to TF32 first there, and eager's angles would not
be the product's. Only static shapes, and only where the product's strides are the
matmul's (what the graph's later ops were traced with).

Not done: transformers then turns the angles (`.transpose(1, 2)`), and the kernel of
their cos and sin reads them across ([B, D/2, T] read as [B, T, D/2], 9 us at B=8,
T=2048 on an H200, where a coalesced read would take ~4). Making the product already
turned needs the views of its operands inside the region (a squeeze is not in the IR)
and a column broadcast read through rotate_half's views (made a kernel of its own
today): tried, one kernel more for ~3 us less, left out.
"""

from __future__ import annotations

import torch
from torch import fx

from fuser.dynamo.context import value_of

aten = torch.ops.aten
_MATMULS = (aten.bmm.default, aten.mm.default)


def _tf32(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a float32 matmul on `device` may round its operands to TF32."""
    if dtype is not torch.float32 or device.type != "cuda":
        return False
    return bool(torch.backends.cuda.matmul.allow_tf32) or (
        torch.get_float32_matmul_precision() != "highest"
    )


def _is_outer(n: fx.Node) -> bool:
    if n.op != "call_function" or n.target not in _MATMULS or n.kwargs or len(n.args) != 2:
        return False
    a, b, out = value_of(n.args[0]), value_of(n.args[1]), value_of(n)
    if not all(isinstance(t, torch.Tensor) for t in (a, b, out)):
        return False
    if not all(isinstance(s, int) for t in (a, b) for s in t.shape):
        return False
    if a.shape[-1] != 1 or a.dtype != b.dtype or _tf32(a.dtype, a.device):
        return False
    product = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") * (
        torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device="meta")
    )
    return tuple(product.shape) == tuple(out.shape) and product.stride() == out.stride()


def outer_products(graph: fx.Graph) -> int:
    """Replace each matmul contracting one element by a broadcast product (see the
    module's doc). Returns how many were replaced."""
    done = 0
    for n in list(graph.nodes):
        if not _is_outer(n):
            continue
        with graph.inserting_before(n):
            mul = graph.call_function(aten.mul.Tensor, tuple(n.args))
        mul.meta.update(n.meta)  # the same value: shape, dtype, strides (checked)
        n.replace_all_uses_with(mul)
        graph.erase_node(n)
        done += 1
    return done
