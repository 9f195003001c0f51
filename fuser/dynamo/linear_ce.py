"""fuser::linear_cross_entropy: an lm head and its cross-entropy as one op whose logits
never exist whole (issue 22, item 4).

`F.cross_entropy(F.linear(x, W, b), t)` in a training step makes the [N, V] logits, an
fp32 copy or two, and their gradient: at GPT-2 124M's lm head (N = B*T = 16384, V =
50257) each bf16 copy is 1.6 GB. Here the forward walks the rows a chunk at a time:

    logits = x[c] @ Wᵀ (+ b)                  torch.mm / addmm, in the compute dtype
    loss[c], logits = CE(logits) in one pass   fuser's one-pass kernel (linear_ce_chunk.py):
                                               the rows' losses, and the gradient written
                                               over the logits, scaled for a mean
    dX[c] = logits @ W                         torch.mm
    dW += logitsᵀ @ x[c]                       accumulated in float32 (linear_ce_chunk.py)
    db += column sums of logits                float32

so one chunk's logits are alive at a time, and the forward returns dX, dW and db for
an upstream gradient of 1, which the backward scales by the real one
(fuser::cross_entropy_grad: in place, and no pass at all when it is 1; ce_scale.py).

Padding: with V not a multiple of 16 bytes (GPT-2's 50257) cuBLAS falls back to slow
kernels for all three matmuls (pad_mm.py: 30 ms against 6 ms for a GPT-2 step's lm
head). The weight is copied once into a [V', H] buffer with V' aligned and zero rows past
V, and each chunk's logits past V are set to -inf (a write of V' - V columns): those
columns take no part in the softmax, their gradient is exactly 0, and the matmuls run
aligned. Not with label smoothing (its term sums every column), where V stays as it is. A
target in [V, V') would pick a -inf logit, so it is checked here (the kernel checks
[0, V')).

Precision: dW sums one product per chunk. In bf16 each sum would round again (k chunks,
k roundings); in float32 the chunks add as exactly as one GEMM's own fp32 accumulation
does, and dW reaches W in W's dtype: float32 master weights get a float32 dW, closer to
the fp32 truth than eager's, whose one bf16 GEMM rounds dW to bf16 before the cast back.
dX is one GEMM per row block, as eager's rows are: no sum across chunks, no difference.

Autocast: the op takes x and W as they were before autocast's casts (the rewrite passes
`compute_dtype`, the dtype the linear's result had) and casts them itself: x and W to the
compute dtype, dX back to x's dtype, dW (float32) to W's; the loss is float32 (`upcast`)
as eager's is under autocast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

import fuser.dynamo.ce_op as ce_op
from fuser.config import config
from fuser.dynamo.context import EXPLAINED
from fuser.dynamo.linear_ce_chunk import accumulate_dw, accumulation, chunk_kernel
from fuser.dynamo.pad_mm import MIN_PADDED_DIM
from fuser.errors import OutOfBoundsError
from fuser.runtime.checks import poll

# logits of one chunk at most. Speed: each chunk reads and writes the float32 dW once
# (8*V*H bytes) beside 6*rows*V*H flops of its three matmuls (logits, dX, dW); at ~3 TB/s
# and ~700 TFLOP/s the round trip costs ~310/rows of the matmuls' time, so chunks want
# thousands of rows: 512 MiB gives >= 5k rows (V <= 50k) at bf16, ~6% more. Memory: a
# third of GPT-2 124M's bf16 logits at B*T = 16k, so the step keeps most of what chunking
# saves. Measured (H100, nanoGPT-style GPT-2 124M, V=50304, B=16, one process;
# benchmarks/results/h100-2026-11-27-session9): 256 MiB (7 chunks) 36.03 ms/step, 7.33
# GiB; 512 MiB (4 chunks) 35.39, 7.49; 1 GiB (2) 35.43, 7.87; not chunked 35.04, 9.91;
# Inductor 36.23, 8.45.
CHUNK_BYTES = 512 << 20
ROW_ALIGN = 128  # chunk rows are a multiple of a GEMM tile's M (128 on Hopper's wgmma)
MIN_PADDED_VOCAB = MIN_PADDED_DIM  # as pad_mm.py: a small odd V costs little as it is
# the rewrite's "auto" takes lm heads whose logits are at least this big (on CUDA): below
# it the logits are not the step's memory problem, and small matmuls lose more to chunking
AUTO_MIN_LOGITS_BYTES = 256 << 20
_MORE = "\n      - "  # explain's continuation lines, under the op's line in "ATen calls"


@dataclass(frozen=True)
class ChunkPlan:
    rows: int  # rows of a chunk (the last may have fewer)
    chunks: int
    vocab: int
    padded: int  # columns of the logits buffer: vocab, or vocab rounded up to 16 bytes
    reasons: tuple[str, ...]

    def line(self) -> str:
        pad = f", V padded {self.vocab} -> {self.padded}" if self.padded != self.vocab else ""
        return f"{self.chunks} chunk(s) of {self.rows} rows{pad}"


def plan_chunks(
    n: int, v: int, dtype: torch.dtype, smoothing: float = 0.0, chunk_rows: int = 0
) -> ChunkPlan:
    """How fuser::linear_cross_entropy splits N rows of V classes, and why."""
    item = torch.empty((), dtype=dtype).element_size()
    align = max(1, 16 // item)
    padded, why = v, []
    if v % align:
        if not config.pad_matmuls:
            why.append(f"V={v} not padded: FUSER_PAD_MATMULS=0")
        elif smoothing:
            why.append(f"V={v} not padded: label smoothing sums every column, padding too")
        elif v < MIN_PADDED_VOCAB:
            why.append(f"V={v} not padded: under {MIN_PADDED_VOCAB} columns it costs little")
        else:
            padded = _ceil(v, align) * align
            why.append(
                f"V padded {v} -> {padded} (16-byte rows: cuBLAS's fast kernels); the "
                f"{padded - v} extra columns have zero weights and logits set to -inf, so "
                "they add nothing to the softmax and get a gradient of exactly 0"
            )
    if chunk_rows > 0:
        rows = min(chunk_rows, max(n, 1))
        why.append(f"{rows} rows a chunk, as asked")
    else:
        most = max(ROW_ALIGN, CHUNK_BYTES // (padded * item) // ROW_ALIGN * ROW_ALIGN)
        k = max(1, _ceil(n, most))
        rows = max(1, min(n, _ceil(_ceil(n, k), ROW_ALIGN) * ROW_ALIGN))
        why.append(
            f"{rows} rows a chunk: at most {CHUNK_BYTES >> 20} MiB of logits "
            f"({most} rows of {padded} x {item} B), rows a multiple of {ROW_ALIGN} (a GEMM "
            f"tile), the {k} chunk(s) balanced; the full logits would be "
            f"{n * padded * item / 2**20:.0f} MiB"
        )
    return ChunkPlan(rows, _ceil(n, rows), v, padded, tuple(why))


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _padded_operands(
    weight: torch.Tensor, bias: torch.Tensor | None, plan: ChunkPlan, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W and b in the compute dtype, with zero rows (entries) past V."""
    v, vp = plan.vocab, plan.padded
    b = bias.to(dtype) if bias is not None else None
    if vp == v:
        return weight.to(dtype), b
    w = torch.empty(vp, weight.shape[1], dtype=dtype, device=weight.device)
    w[:v].copy_(weight)
    w[v:].zero_()
    if b is not None:
        b = torch.cat([b, b.new_zeros(vp - v)])
    return w, b


_GAP_FLAGS: dict[str, torch.Tensor] = {}  # per device: a target in [V, V') was seen


def _check_padded_targets(target: torch.Tensor, v: int, vp: int) -> None:
    """Targets in [V, V') (the kernel checks [0, V')): on CPU at once; on a GPU through a
    flag copied to pinned memory without waiting, read at the next call (no sync)."""
    if vp == v or target.numel() == 0:
        return
    gap = ((target >= v) & (target < vp)).any()
    name = str(target.device)
    if target.device.type != "cuda":
        bad = bool(gap)
    else:
        flag = _GAP_FLAGS.get(name)
        bad = flag is not None and bool(flag)
        if flag is None:
            flag = _GAP_FLAGS[name] = torch.zeros((), dtype=torch.bool, pin_memory=True)
        if bad:
            flag.zero_()
        flag.copy_(gap, non_blocking=True)
    if bad:
        raise OutOfBoundsError(
            f"linear_cross_entropy: a target lies in [{v}, {vp}); targets must lie in "
            f"[0, {v}) or be ignore_index"
        )


def forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    reduction: int,
    ignore_index: int,
    label_smoothing: float,
    compute_dtype: torch.dtype,
    upcast: bool,
    chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's implementation: (loss, dX, dW, db) for an upstream gradient of 1."""
    if reduction not in (1, 2):
        raise ValueError("fuser::linear_cross_entropy takes reduction mean (1) or sum (2)")
    poll()  # a bad target a GPU kernel reported since the last fuser call
    n, h = x.shape
    cd, dev = compute_dtype, x.device
    plan = plan_chunks(n, weight.shape[0], cd, label_smoothing, chunk_rows)
    v, vp = plan.vocab, plan.padded
    target = target.contiguous()
    _check_padded_targets(target, v, vp)
    xc = x.to(cd)
    w, b = _padded_operands(weight, bias, plan, cd)
    count = (target != ignore_index).sum().float()
    if reduction == 1:  # the gradient's scale: 1/count, 0 when every target is ignored
        scale = torch.where(count > 0, 1.0 / count.clamp(min=1.0), 0.0)
    else:
        scale = torch.ones((), dtype=torch.float32, device=dev)
    rows = torch.empty(n, dtype=torch.float32, device=dev)
    dx = torch.empty(n, h, dtype=cd, device=dev)
    dw = torch.zeros(vp, h, dtype=torch.float32, device=dev)
    db = torch.zeros(v, dtype=torch.float32, device=dev) if bias is not None else None
    buf = torch.empty(min(plan.rows, n), vp, dtype=cd, device=dev)
    for start in range(0, n, plan.rows):
        end = min(start + plan.rows, n)
        xs, logits = xc[start:end], buf[: end - start]
        if b is not None:
            torch.addmm(b, xs, w.t(), out=logits)
        else:
            torch.mm(xs, w.t(), out=logits)
        if vp != v:  # the padding columns take no part in the softmax
            logits[:, v:].fill_(float("-inf"))
        t = target[start:end]
        kernel = chunk_kernel(logits, t, scale, ignore_index, label_smoothing)
        kernel.run(logits, t, scale, rows[start:end])
        torch.mm(logits, w, out=dx[start:end])
        accumulate_dw(dw, logits, xs)
        if db is not None:
            db += logits[:, :v].sum(0, dtype=torch.float32)
    total = rows.sum()
    loss = total / count if reduction == 1 else total
    loss = loss.to(torch.float32 if upcast else cd)
    dw = dw[:v]
    db_out = db.to(bias.dtype) if db is not None and bias is not None else x.new_empty(0)
    return loss, dx.to(x.dtype), dw.to(weight.dtype), db_out


@torch.library.custom_op("fuser::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    reduction: int,
    ignore_index: int,
    label_smoothing: float,
    compute_dtype: torch.dtype,
    upcast: bool,
    chunk_rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dX, dW, db) of cross_entropy(linear(x, weight, bias), target) for an
    upstream gradient of 1; db is empty without a bias. reduction: 1 mean, 2 sum."""
    return forward(
        x, weight, bias, target, reduction, ignore_index, label_smoothing,
        compute_dtype, upcast, chunk_rows,
    )  # fmt: skip


@linear_cross_entropy_op.register_fake
def _fake(x, weight, bias, target, reduction, ignore_index, smoothing, cd, upcast, rows):  # type: ignore[no-untyped-def]
    loss = x.new_empty([], dtype=torch.float32 if upcast else cd)
    db = bias.new_empty(bias.shape) if bias is not None else x.new_empty(0)
    return loss, x.new_empty(x.shape), weight.new_empty(weight.shape), db


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.has_bias = inputs[2] is not None
    ctx.save_for_backward(*output[1:])


def _backward(ctx: Any, grad_loss: torch.Tensor, *_unused: Any) -> tuple:
    dx, dw, db = ctx.saved_tensors
    need = ctx.needs_input_grad
    gx = ce_op.cross_entropy_grad(dx, grad_loss) if need[0] else None
    gw = ce_op.cross_entropy_grad(dw, grad_loss) if need[1] else None
    gb = ce_op.cross_entropy_grad(db, grad_loss) if ctx.has_bias and need[2] else None
    return gx, gw, gb, None, None, None, None, None, None, None


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup)


def linear_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    chunk_rows: int = 0,
) -> torch.Tensor:
    """`F.cross_entropy(F.linear(x, weight, bias), target, ...)` without the whole logits
    (x: [..., H], target: [...]). Under autocast the matmuls run in its dtype and the loss
    is float32, as eager's. reduction="none" runs the unchunked ops (per-row losses need
    the rows' own gradients: nothing to accumulate)."""
    if reduction == "none":
        logits = F.linear(x, weight, bias)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=ignore_index,
            reduction="none", label_smoothing=label_smoothing,
        ).view(target.shape)  # fmt: skip
    if reduction not in ce_op.REDUCTION_CODE:
        raise ValueError(f"reduction={reduction!r}; expected 'mean', 'sum' or 'none'")
    device = x.device.type
    auto = torch.is_autocast_enabled(device)
    cd = torch.get_autocast_dtype(device) if auto else x.dtype
    if not auto and weight.dtype != x.dtype:
        raise ValueError(
            f"linear_cross_entropy: x is {x.dtype} and weight {weight.dtype} (F.linear "
            "would fail too); cast one, or run under autocast"
        )
    loss, *_ = linear_cross_entropy_op(
        x.reshape(-1, x.shape[-1]), weight, bias, target.reshape(-1),
        ce_op.REDUCTION_CODE[reduction], ignore_index, float(label_smoothing), cd,
        auto and cd != torch.float32, chunk_rows,
    )  # fmt: skip
    return loss


def describe(node: fx.Node) -> str:
    """explain's text for the op in a compiled graph: the chunks, the kernel, the sums."""
    x, w = (a.meta.get("val") for a in node.args[:2])
    smoothing, cd, rows = node.args[6], node.args[7], node.args[9]
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return "chunked linear + cross-entropy (no shapes traced)"
    n, v = int(x.shape[0]), int(w.shape[0])
    plan = plan_chunks(n, v, cd, smoothing, rows)
    lines = [
        f"chunked linear + cross-entropy (fuser/dynamo/linear_ce.py): logits [{n}, {v}] "
        f"{str(cd).replace('torch.', '')} never whole; {plan.line()}",
        *plan.reasons,
        f"per chunk: {'addmm' if node.args[2] is not None else 'mm'}"
        " logits, fuser's one-pass cross-entropy kernel (loss rows + dlogits), mm dX, "
        f"dW: {accumulation(x.device, cd)}",
    ]
    if n and plan.chunks:
        try:
            with unset_fake_temporarily():
                lines += _kernel_lines(plan, n, cd, int(node.args[5]), float(smoothing))
        except Exception as e:  # explain must not fail on a plan it cannot show
            lines.append(f"chunk kernel not planned here: {type(e).__name__}: {e}")
    return _MORE.join(lines)


def _kernel_lines(plan: ChunkPlan, n: int, cd: torch.dtype, ignore: int, eps: float) -> list[str]:
    """The chunk kernels' schedules (planned for meta tensors: nothing runs)."""
    out = []
    last = n - (plan.chunks - 1) * plan.rows
    for r in sorted({plan.rows, last}):
        k = chunk_kernel(
            torch.empty(r, plan.padded, dtype=cd, device="meta"),
            torch.empty(r, dtype=torch.int64, device="meta"),
            torch.empty((), device="meta"),
            ignore,
            eps,
        )
        out.append(f"chunk kernel for {r} rows: {k.schedule()} ({k.note})")
    return out


EXPLAINED[torch.ops.fuser.linear_cross_entropy.default] = describe
__all__ = ["linear_cross_entropy", "plan_chunks"]
