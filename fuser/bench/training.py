"""The training suite's cases (issue 20): eager functions as a user writes them, each
measured as `torch.compile(fn, backend="fuser")` beside eager, Inductor and the peers.

A case is a function, the inputs it is called with, which of them get gradients and the
upstream gradients of its outputs; the counted bytes follow the issue's "What is measured"
(each tensor the op must touch, counted once). Its peers (Liger, QuACK) are given as
functions with the same signature, or as the reason there is none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Tensors = list[torch.Tensor]

LN_EPS = 1e-5
RMS_EPS = 1e-6
NORM_HIDDEN = [768, 1024, 1600, 2048, 4096, 8192]
CE_ROWS = [8192, 32768]
CE_VOCAB = [32000, 50257, 128256]
BIAS_SHAPES = [(8192, n) for n in (768, 1024, 2304, 3072, 4096, 6400)] + [
    (32768, 768),
    (32768, 3072),
]
# --cpu: what the interpreter runs in seconds (CI)
TINY = {"rows": 64, "hidden": 96, "vocab": 300}


@dataclass
class Inputs:
    """The arguments of one call, which of them are differentiated, and the gradients
    flowing into the function's outputs (None where there is no backward)."""

    args: Tensors
    wrt: list[int]
    grad_outputs: Tensors | None


@dataclass
class TrainCase:
    op: str
    variant: str  # "" where the op has one form
    rows: int
    cols: int
    fn: Callable[..., object]  # the user's eager function
    make: Callable[[str], Inputs]  # device -> bf16 inputs
    nbytes: int
    reduction_length: int
    liger: Callable[..., object] | str  # Liger's version of fn, or why there is none
    quack: Callable[..., object] | str
    note: str = ""
    # reference (fp32) outputs and gradients of huge cases, computed in row chunks
    reference: Callable[[Inputs], Tensors] | None = None

    @property
    def shape(self) -> str:
        return f"{self.rows}x{self.cols}"

    @property
    def backward(self) -> bool:
        return bool(self.make("meta").wrt)

    @property
    def label(self) -> str:
        return f"{self.op}[{self.variant}]" if self.variant else self.op


def _rand(g: torch.Generator, shape: tuple, device: str, scale: float = 1.0) -> torch.Tensor:
    """bf16 normal values made on `device` (a 32768 x 128256 tensor made on the host
    would take a minute)."""
    if device == "meta":
        return torch.empty(shape, dtype=torch.bfloat16, device="meta")
    x = torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16)
    return x.mul_(scale) if scale != 1.0 else x


def _gen(device: str, *key: int) -> torch.Generator:
    """A generator on `device` seeded by the case (the same data on every run)."""
    dev = "cpu" if device == "meta" else device
    return torch.Generator(device=dev).manual_seed(hash(key) % 2**31)


def _no_quack(what: str) -> str:
    return f"QuACK has no {what}"


# -- normalizations -------------------------------------------------------------------------
def _ln(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, LN_EPS)


def _residual_ln(x, r, w, b):
    h = x + r
    return h, F.layer_norm(h, h.shape[-1:], w, b, LN_EPS)


def _rms(x, w):
    return F.rms_norm(x, x.shape[-1:], w, RMS_EPS)


def _liger_ln(x, w, b):
    from liger_kernel.transformers.functional import liger_layer_norm

    return liger_layer_norm(x, w, b, LN_EPS)


def _liger_residual_ln(x, r, w, b):
    h = x + r  # Liger fuses no add into its LayerNorm: the add runs eagerly
    return h, _liger_ln(h, w, b)


def _liger_rms(x, w):
    from liger_kernel.transformers.functional import liger_rms_norm

    # in_place=False: the default writes dx over dy (same traffic), which would change
    # the upstream gradient the next repeat and the next implementation read
    return liger_rms_norm(x, w, RMS_EPS, in_place=False)


def _quack_rms(x, w):
    import quack

    return quack.rmsnorm(x, w, eps=RMS_EPS)


def norm_case(op: str, rows: int, cols: int) -> TrainCase:
    """layernorm_fwd_bwd, residual_layernorm_fwd_bwd or rmsnorm_fwd_bwd at rows x cols."""
    residual = op == "residual_layernorm_fwd_bwd"
    rms = op == "rmsnorm_fwd_bwd"
    params = 1 if rms else 2

    def make(device: str) -> Inputs:
        g = _gen(device, rows, cols, len(op))
        acts = [_rand(g, (rows, cols), device) for _ in range(2 if residual else 1)]
        ps = [1 + 0.1 * _rand(g, (cols,), device) for _ in range(params)]
        ps = [p.to(torch.bfloat16) for p in ps]
        dys = [_rand(g, (rows, cols), device) for _ in range(2 if residual else 1)]
        args = acts + ps
        return Inputs(args, list(range(len(args))), dys)

    elems = (8 if residual else 5) * rows * cols
    fn, liger, quack = (
        (_residual_ln, _liger_residual_ln, _no_quack("fused residual LayerNorm backward"))
        if residual
        else (_rms, _liger_rms, _quack_rms)
        if rms
        else (_ln, _liger_ln, _no_quack("LayerNorm backward"))
    )
    return TrainCase(
        op,
        "",
        rows,
        cols,
        fn,
        make,
        2 * elems + 2 * 2 * params * cols,  # + the parameters read and their grads written
        reduction_length=max(rows, cols),
        liger=liger,
        quack=quack,
        note=f"{'8' if residual else '5'}*M*H elements + parameters and their gradients",
    )


# -- cross-entropy --------------------------------------------------------------------------
def _ce_float(logits, t):
    return F.cross_entropy(logits.float(), t)


def _ce(logits, t):
    return F.cross_entropy(logits, t)


def _liger_ce(logits, t):
    from liger_kernel.transformers.functional import liger_cross_entropy

    # Liger upcasts inside its kernel, so this is F.cross_entropy(logits.float(), t) for
    # the "float" variant too, as a Liger user writes it
    return liger_cross_entropy(logits, t)


def _quack_ce(logits, t):
    import quack

    return quack.cross_entropy(logits, t)


CHUNK = 2**27  # elements per row chunk of the chunked reference


def _ce_reference(inp: Inputs) -> Tensors:
    """Loss and gradient in fp32, a chunk of rows at a time (the whole 32768 x 128256
    problem in fp32 would need ~50 GB at once). Gradients over 2^31 elements are kept
    in bf16 (one rounding; the check's tolerance is several bf16 ulps)."""
    logits, t = inp.args
    rows, cols = logits.shape
    big = logits.numel() > 2**31
    grad = torch.empty(logits.shape, dtype=torch.bfloat16 if big else torch.float32,
                       device=logits.device)  # fmt: skip
    total = torch.zeros((), dtype=torch.float32, device=logits.device)
    step = max(1, CHUNK // cols)
    for i in range(0, rows, step):
        chunk = logits[i : i + step].detach().float().requires_grad_(True)
        loss = F.cross_entropy(chunk, t[i : i + step], reduction="sum") / rows
        (g,) = torch.autograd.grad(loss, chunk)
        grad[i : i + step] = g
        total += loss.detach()
    return [total, grad]


def ce_case(variant: str, rows: int, vocab: int) -> TrainCase:
    def make(device: str) -> Inputs:
        g = _gen(device, rows, vocab)
        logits = _rand(g, (rows, vocab), device, scale=2.0)
        if device == "meta":
            t = torch.empty(rows, dtype=torch.int64, device="meta")
        else:
            t = torch.randint(0, vocab, (rows,), generator=g, device=device)
        return Inputs([logits, t], [0], None)  # backward from the scalar loss

    return TrainCase(
        "cross_entropy_fwd_bwd",
        variant,
        rows,
        vocab,
        _ce_float if variant == "float" else _ce,
        make,
        4 * rows * vocab,
        reduction_length=vocab,
        liger=_liger_ce,
        quack=_quack_ce,
        note="one read of the bf16 logits + one write of the bf16 gradient",
        reference=_ce_reference,
    )


# -- bias gradients -------------------------------------------------------------------------
def _colsum(dy):
    return dy.sum(0)


def _colsum_float(dy):
    return dy.float().sum(0)


def _gelu_colsum(dy, x):
    dx = torch.ops.aten.gelu_backward(dy, x, approximate="tanh")
    return dx, dx.sum(0)


def bias_case(variant: str, rows: int, cols: int) -> TrainCase:
    gelu = variant == "gelu_bwd"

    def make(device: str) -> Inputs:
        g = _gen(device, rows, cols, len(variant))
        return Inputs([_rand(g, (rows, cols), device) for _ in range(2 if gelu else 1)], [], None)

    fn = {"sum": _colsum, "float_sum": _colsum_float, "gelu_bwd": _gelu_colsum}[variant]
    out_bytes = 4 if variant == "float_sum" else 2
    nbytes = (3 if gelu else 1) * rows * cols * 2 + cols * out_bytes
    return TrainCase(
        "bias_grad",
        variant,
        rows,
        cols,
        fn,
        make,
        nbytes,
        reduction_length=rows,
        liger="Liger has no bias-gradient kernel",
        quack=_no_quack("bias-gradient kernel"),
        note="dy (and x, dx) once + the column sums",
    )


OPS = [
    "layernorm_fwd_bwd",
    "residual_layernorm_fwd_bwd",
    "rmsnorm_fwd_bwd",
    "cross_entropy_fwd_bwd",
    "bias_grad",
]
VARIANTS = {
    "cross_entropy_fwd_bwd": ["float", "bf16"],
    "bias_grad": ["sum", "float_sum", "gelu_bwd"],
}


def shapes(op: str, tiny: bool = False) -> list[tuple[int, int]]:
    """(rows, cols) the issue measures `op` at, or one tiny shape for the interpreter."""
    if tiny:
        cols = TINY["vocab"] if op == "cross_entropy_fwd_bwd" else TINY["hidden"]
        return [(TINY["rows"], cols)]
    if op == "cross_entropy_fwd_bwd":
        return [(m, v) for m in CE_ROWS for v in CE_VOCAB]
    if op == "bias_grad":
        return list(BIAS_SHAPES)
    return [(8192, h) for h in NORM_HIDDEN]


def make_case(op: str, variant: str, rows: int, cols: int) -> TrainCase:
    if op == "cross_entropy_fwd_bwd":
        return ce_case(variant, rows, cols)
    if op == "bias_grad":
        return bias_case(variant, rows, cols)
    return norm_case(op, rows, cols)


def cases(
    ops: list[str],
    only_shapes: list[str] | None = None,
    only_variants: list[str] | None = None,
    tiny: bool = False,
) -> Iterator[TrainCase]:
    """Every (op, variant, shape) of `ops`; `only_shapes` keeps the shapes named 'MxN'
    or by their columns 'N', `only_variants` the variants named (an op with one form is
    kept whatever they say)."""
    for op in ops:
        if op not in OPS:
            raise SystemExit(f"unknown training op {op!r}; choose from {', '.join(OPS)}")
        for rows, cols in shapes(op, tiny):
            if only_shapes and not {f"{rows}x{cols}", str(cols)} & set(only_shapes):
                continue
            for variant in VARIANTS.get(op, [""]):
                if only_variants and variant and variant not in only_variants:
                    continue
                yield make_case(op, variant, rows, cols)
