"""The fusions whose generated source is pinned in tests/golden/sources.

One entry per scheduler kind and shape family the renderers print differently: a
flattened and a broadcasting pointwise kernel, an inner reduction, inner persistent rows
at several hidden sizes (tail chunk, exact split, one-warp row, prefetching row loop),
looped rows (two-pass and online max-and-sum), an outer (column) reduction, LayerNorm
forward and backward, softmax and cross-entropy (with its check_index guard). Inputs are
meta tensors: rendering needs shapes, strides, dtypes and alignment, never data.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fuser.bench.cases import (
    colsum_case,
    cross_entropy_case,
    gelu_fwd_case,
    layernorm_fwd_bwd_case,
    softmax_case,
)
from fuser.examples import seed_layernorm_fusion
from fuser.frontend.fusion_definition import FusionDefinition

BACKENDS = ("triton", "cuda")
PRESETS = ("h100", "h200")
EXTENSION = {"triton": "py", "cuda": "cu"}


@dataclass(frozen=True)
class Golden:
    name: str
    build: Callable[[], tuple[FusionDefinition, list[torch.Tensor]]]


def meta(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _seed(rows: int, cols: int) -> Callable:
    def build() -> tuple[FusionDefinition, list[torch.Tensor]]:
        vec = [meta(cols) for _ in range(4)]
        return seed_layernorm_fusion(torch.float16), [vec[0], meta(rows, cols), *vec[1:]]

    return build


def _bias_gelu() -> tuple[FusionDefinition, list[torch.Tensor]]:
    """Pointwise with a column broadcast: not flattened, a masked tail on 5140 columns."""
    with FusionDefinition("bias_gelu") as fd:
        x = fd.define_tensor([-1, -1], torch.bfloat16)
        b = fd.define_tensor([-1], torch.bfloat16)
        bb = fd.ops.broadcast_in_dim(b, shape=x.shape, broadcast_dims=[1])
        fd.add_output(fd.ops.gelu(fd.ops.add(x, bb), approximate="tanh"))
    return fd, [meta(4096, 5140, dtype=torch.bfloat16), meta(5140, dtype=torch.bfloat16)]


def _rowsum() -> tuple[FusionDefinition, list[torch.Tensor]]:
    """An inner reduction with nothing crossing it (no persistent buffers)."""
    with FusionDefinition("rowsum") as fd:
        x = fd.define_tensor([-1, -1], torch.float16)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, torch.float32), dims=[1]))
    return fd, [meta(8192, 3000)]


def _gelu() -> tuple[FusionDefinition, list[torch.Tensor]]:
    fd = gelu_fwd_case(8192, 3072, torch.bfloat16).fusions[0]
    return fd, [meta(8192, 3072, dtype=torch.bfloat16)]


def _colsum() -> tuple[FusionDefinition, list[torch.Tensor]]:
    fd = colsum_case(8192, 3072, torch.bfloat16).fusions[0]
    return fd, [meta(8192, 3072, dtype=torch.bfloat16)]


def _softmax(rows: int, cols: int) -> Callable:
    def build() -> tuple[FusionDefinition, list[torch.Tensor]]:
        fd = softmax_case(rows, cols, torch.bfloat16).fusions[0]
        return fd, [meta(rows, cols, dtype=torch.bfloat16)]

    return build


def _layernorm(which: int) -> Callable:
    def build() -> tuple[FusionDefinition, list[torch.Tensor]]:
        rows, cols, dt = 8192, 1600, torch.bfloat16
        fd = layernorm_fwd_bwd_case(rows, cols, dt).fusions[which]
        if which == 0:
            return fd, [meta(rows, cols, dtype=dt), meta(cols, dtype=dt), meta(cols, dtype=dt)]
        stats = [meta(rows, dtype=torch.float32) for _ in range(2)]
        return fd, [
            meta(rows, cols, dtype=dt),
            meta(rows, cols, dtype=dt),
            meta(cols, dtype=dt),
        ] + stats

    return build


def _cross_entropy() -> tuple[FusionDefinition, list[torch.Tensor]]:
    rows, cols = 8192, 50257
    fd = cross_entropy_case(rows, cols, torch.bfloat16).fusions[0]
    return fd, [meta(rows, cols, dtype=torch.bfloat16), meta(rows, dtype=torch.int64)]


GOLDENS = (
    Golden("pointwise_gelu_8192x3072", _gelu),
    Golden("pointwise_bias_gelu_4096x5140", _bias_gelu),
    Golden("inner_rowsum_8192x3000", _rowsum),
    Golden("persistent_seed_8192x768", _seed(8192, 768)),
    Golden("persistent_seed_8192x1600", _seed(8192, 1600)),
    Golden("persistent_seed_8192x5140", _seed(8192, 5140)),
    Golden("persistent_seed_8192x20480", _seed(8192, 20480)),
    Golden("persistent_seed_7x96", _seed(7, 96)),
    Golden("looped_softmax_1024x65536", _softmax(1024, 65536)),
    Golden("outer_colsum_8192x3072", _colsum),
    Golden("layernorm_fwd_8192x1600", _layernorm(0)),
    Golden("layernorm_bwd_8192x1600", _layernorm(1)),
    Golden("softmax_98304x1024", _softmax(98304, 1024)),
    Golden("cross_entropy_8192x50257", _cross_entropy),
)


@contextmanager
def gpu_variant() -> Iterator[None]:
    """Render what a GPU runs: the Triton renderer writes interpreter-only helpers (bf16
    rounding) when this process interprets, and a golden is the same on every machine."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def render(golden: Golden, backend: str, preset: str) -> str:
    """Every kernel of the fusion's plan for `preset`, in segment order, one after another,
    as rendered for a GPU."""
    fd, inputs = golden.build()
    with gpu_variant():
        kernels = fd.compile(inputs, device=preset, backend=backend)
    comment = "#" if backend == "triton" else "//"
    parts = [f"{comment} ===== kernel {k.name} =====\n{k.source}" for k in kernels]
    return "\n".join(parts)


def path_of(golden: Golden, backend: str, preset: str) -> str:
    return f"{preset}/{backend}/{golden.name}.{EXTENSION[backend]}.golden"
