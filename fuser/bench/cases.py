"""The benchmark's ops: each a fuser implementation, an eager one, inputs and minimal bytes.

Minimal bytes count each input read once and each output written once (the anchors'
convention, ../shared/anchors/README.md), so GB/s is comparable across implementations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fuser.examples import seed_layernorm_fusion
from fuser.frontend.fusion_definition import FusionDefinition

SEED_SWEEP = [768, 1024, 1280, 1536, 1600, 2048, 2560, 4096, 5140, 12288, 16384, 20480]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

Tensors = list[torch.Tensor]


@dataclass
class Case:
    """One (op, shape, dtype) to measure."""

    op: str
    rows: int
    cols: int
    dtype: torch.dtype
    fusions: list[FusionDefinition]
    fuser: Callable[[Tensors, str], Tensors]  # (inputs, backend) -> outputs
    eager: Callable[[Tensors], Tensors]
    inputs: Callable[[str], Tensors]  # device -> inputs
    nbytes: int
    note: str = ""
    # reference outputs compare at this dtype's precision; reductions widen the tolerance
    reduction_length: int = 1
    extra: dict = field(default_factory=dict)
    # what `fuser` does to a single fusion's raw outputs (a sweep runs the plans alone)
    finish: Callable[[Tensors], Tensors] | None = None

    @property
    def shape(self) -> str:
        return f"{self.rows}x{self.cols}"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def _rng(rows: int, cols: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(rows * 7919 + cols)


def _randn(g: torch.Generator, shape: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


def _single(fd: FusionDefinition) -> Callable[[Tensors, str], Tensors]:
    return lambda ins, backend: fd.execute(ins, backend=backend)


# -- the seed fusion and the normalizations ------------------------------------------
def seed_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    fd = seed_layernorm_fusion(dtype)

    def eager(ins: Tensors) -> Tensors:
        t0, t1, t2, t3, t4 = ins
        t13 = (t1.float() + t0.float()).to(dtype).float() + t2.float()
        return [(F.layer_norm(t13, t13.shape[-1:]) * t4.float() + t3.float()).to(dtype)]

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        shapes = [(cols,), (rows, cols), (cols,), (cols,), (cols,)]
        return [_randn(g, s, dtype, device) for s in shapes]

    s = dtype.itemsize
    return Case(
        "ln_fused",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        eager,
        inputs,
        2 * rows * cols * s + 4 * cols * s,
        reduction_length=cols,
    )


def layernorm_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    with FusionDefinition("layernorm") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.layer_norm(x, w, b))

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        return [_randn(g, s, dtype, device) for s in [(rows, cols), (cols,), (cols,)]]

    s = dtype.itemsize
    return Case(
        "layernorm",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        lambda i: [F.layer_norm(i[0], i[0].shape[-1:], i[1], i[2])],
        inputs,
        2 * rows * cols * s + 2 * cols * s,
        reduction_length=cols,
    )


def residual_layernorm_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    with FusionDefinition("residual_layernorm") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        r = fd.define_tensor([-1, -1], dtype)
        w = fd.define_tensor([-1], dtype)
        b = fd.define_tensor([-1], dtype)
        fd.add_output(fd.ops.layer_norm(fd.ops.add(x, r), w, b))

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        shapes = [(rows, cols), (rows, cols), (cols,), (cols,)]
        return [_randn(g, s, dtype, device) for s in shapes]

    s = dtype.itemsize
    return Case(
        "residual_layernorm",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        lambda i: [F.layer_norm(i[0] + i[1], i[0].shape[-1:], i[2], i[3])],
        inputs,
        3 * rows * cols * s + 2 * cols * s,
        reduction_length=cols,
    )


def layernorm_fwd_bwd_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    """Forward (y, mean, rstd) then backward (dx, dw, db): two fusions."""
    with FusionDefinition("layernorm_fwd") as fwd:
        x = fwd.define_tensor([-1, -1], dtype)
        w = fwd.define_tensor([-1], dtype)
        b = fwd.define_tensor([-1], dtype)
        y, mean, rstd = fwd.ops.layer_norm(x, w, b, return_mean_rstd=True)
        for v in (y, mean, rstd):
            fwd.add_output(v)
    with FusionDefinition("layernorm_bwd") as bwd:
        o = bwd.ops
        x = bwd.define_tensor([-1, -1], dtype)
        dy = bwd.define_tensor([-1, -1], dtype)
        w = bwd.define_tensor([-1], dtype)
        mean = bwd.define_tensor([-1], torch.float32)
        rstd = bwd.define_tensor([-1], torch.float32)

        def rowb(v):
            return o.broadcast_in_dim(v, shape=x.shape, broadcast_dims=[0])

        xhat = o.mul(o.sub(o.cast(x, torch.float32), rowb(mean)), rowb(rstd))
        dyf = o.cast(dy, torch.float32)
        g = o.mul(
            dyf, o.broadcast_in_dim(o.cast(w, torch.float32), shape=x.shape, broadcast_dims=[1])
        )
        a = o.mean(g, dims=[1])
        c = o.mean(o.mul(g, xhat), dims=[1])
        dx = o.mul(o.sub(o.sub(g, rowb(a)), o.mul(xhat, rowb(c))), rowb(rstd))
        bwd.add_output(o.cast(dx, dtype))
        bwd.add_output(o.cast(o.sum(o.mul(dyf, xhat), dims=[0]), dtype))
        bwd.add_output(o.cast(o.sum(dyf, dims=[0]), dtype))

    def run(ins: Tensors, backend: str) -> Tensors:
        xx, ww, bb, dyy = ins
        yy, m, r = fwd.execute([xx, ww, bb], backend=backend)
        return [yy, *bwd.execute([xx, dyy, ww, m.view(-1), r.view(-1)], backend=backend)]

    def eager(ins: Tensors) -> Tensors:
        xx, ww, bb, dyy = (t.detach().requires_grad_(i != 3) for i, t in enumerate(ins))
        yy = F.layer_norm(xx, xx.shape[-1:], ww, bb)
        return [yy.detach(), *torch.autograd.grad(yy, (xx, ww, bb), dyy)]

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        shapes = [(rows, cols), (cols,), (cols,), (rows, cols)]
        return [_randn(g, s, dtype, device) for s in shapes]

    s = dtype.itemsize
    return Case(
        "layernorm_fwd_bwd",
        rows,
        cols,
        dtype,
        [fwd, bwd],
        run,
        eager,
        inputs,
        5 * rows * cols * s,
        note="bytes: x, y, x, dy, dx (the anchors' 5·R·H)",
        reduction_length=max(rows, cols),
    )


# -- pointwise ----------------------------------------------------------------------------
def _gelu_tanh(o, x):
    k = math.sqrt(2.0 / math.pi)
    inner = o.mul(k, o.add(x, o.mul(0.044715, o.mul(x, o.mul(x, x)))))
    return o.mul(o.mul(0.5, x), o.add(1.0, o.tanh(inner)))


def gelu_fwd_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    with FusionDefinition("gelu_fwd") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.gelu(x, approximate="tanh"))

    def inputs(device: str) -> Tensors:
        return [_randn(_rng(rows, cols), (rows, cols), dtype, device)]

    return Case(
        "gelu_fwd",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        lambda i: [F.gelu(i[0], approximate="tanh")],
        inputs,
        2 * rows * cols * dtype.itemsize,
    )


def gelu_bwd_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    k = math.sqrt(2.0 / math.pi)
    with FusionDefinition("gelu_bwd") as fd:
        o = fd.ops
        dy = o.cast(fd.define_tensor([-1, -1], dtype), torch.float32)
        x = o.cast(fd.define_tensor([-1, -1], dtype), torch.float32)
        x2 = o.mul(x, x)
        t = o.tanh(o.mul(k, o.add(x, o.mul(0.044715, o.mul(x, x2)))))
        dt = o.mul(o.sub(1.0, o.mul(t, t)), o.mul(k, o.add(1.0, o.mul(3 * 0.044715, x2))))
        grad = o.add(o.mul(0.5, o.add(1.0, t)), o.mul(o.mul(0.5, x), dt))
        fd.add_output(o.cast(o.mul(dy, grad), dtype))

    def eager(ins: Tensors) -> Tensors:
        return [torch.ops.aten.gelu_backward(ins[0], ins[1], approximate="tanh")]

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        return [_randn(g, (rows, cols), dtype, device) for _ in range(2)]

    return Case(
        "gelu_bwd",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        eager,
        inputs,
        3 * rows * cols * dtype.itemsize,
    )


ROPE_HEADS, ROPE_SEQ = 32, 2048


def _rope_dims(rows: int, cols: int) -> tuple[int, int, int, int]:
    """(B, heads, T, D) of `rows` positions: T = 2048, or all of them when fewer."""
    t = min(ROPE_SEQ, rows)
    return max(rows // t, 1), ROPE_HEADS, t, cols


def _rope_fusion(
    name: str, rows: int, cols: int, dtype: torch.dtype, backward: bool
) -> FusionDefinition:
    """q [B, 32, T, D] (rows = B * T positions, cols = D) turned by cos/sin [B, T, D]
    broadcast over the heads: q * cos + rotate_half(q) * sin, or its backward from dq's
    gradient g: g * cos + rotate_half's transpose of g * sin."""
    b, h, t, d = _rope_dims(rows, cols)
    half = d // 2
    with FusionDefinition(name) as fd:
        o = fd.ops
        x = o.cast(fd.define_tensor([b, h, t, d], dtype), torch.float32)

        def heads(v):  # noqa: ANN001, ANN202
            v = o.cast(v, torch.float32)
            return o.broadcast_in_dim(v, shape=[b, h, t, d], broadcast_dims=[0, 2, 3])

        cos, sin = (
            heads(fd.define_tensor([b, t, d], dtype)),
            heads(fd.define_tensor([b, t, d], dtype)),
        )
        if backward:  # rotate_half's transpose of x * sin
            xs = o.mul(x, sin)
            turned = o.cat([o.slice(xs, 3, half, d), o.neg(o.slice(xs, 3, 0, half))], 3)
        else:  # rotate_half(x) * sin
            rot = o.cat([o.neg(o.slice(x, 3, half, d)), o.slice(x, 3, 0, half)], 3)
            turned = o.mul(rot, sin)
        out = o.add(o.mul(x, cos), turned)
        fd.add_output(o.cast(out, dtype))
    return fd


def rope_case(rows: int, cols: int, dtype: torch.dtype, backward: bool = False) -> Case:
    """A rotary embedding over 32 heads at T = 2048 (issue 21's q): a broadcast over a
    middle row dim and rotate_half's column views, forward or backward."""
    name = "rope_bwd" if backward else "rope_fwd"
    fd = _rope_fusion(name, rows, cols, dtype, backward)
    b, h, t, d = _rope_dims(rows, cols)

    def eager(ins: Tensors) -> Tensors:
        # in float32, rounded once, as the fusion computes (bf16 eager rounds each
        # product first: 1 ulp of the larger term apart where the two nearly cancel)
        x, cos, sin = ins[0].float(), ins[1][:, None].float(), ins[2][:, None].float()
        if backward:
            xs = x * sin
            out = x * cos + torch.cat((xs[..., d // 2 :], -xs[..., : d // 2]), -1)
        else:
            out = x * cos + torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1) * sin
        return [out.to(ins[0].dtype)]

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        return [_randn(g, (b, h, t, d), dtype, device)] + [
            _randn(g, (b, t, d), dtype, device) for _ in range(2)
        ]

    return Case(
        name,
        b * h * t,
        cols,
        dtype,
        [fd],
        _single(fd),
        eager,
        inputs,
        (2 * b * h * t * d + 2 * b * t * d) * dtype.itemsize,
        note=f"q [{b}, {h}, {t}, {d}], cos/sin [{b}, {t}, {d}] broadcast over the heads",
    )


# -- reductions -----------------------------------------------------------------------------
def colsum_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    with FusionDefinition("bias_grad") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.sum(fd.ops.cast(x, torch.float32), dims=[0]))

    def inputs(device: str) -> Tensors:
        return [_randn(_rng(rows, cols), (rows, cols), dtype, device)]

    return Case(
        "bias_grad",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        lambda i: [i[0].float().sum(0)],
        inputs,
        rows * cols * dtype.itemsize + cols * 4,
        reduction_length=rows,
    )


def softmax_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    with FusionDefinition("softmax") as fd:
        fd.add_output(fd.ops.softmax(fd.define_tensor([-1, -1], dtype)))

    def inputs(device: str) -> Tensors:
        return [_randn(_rng(rows, cols), (rows, cols), dtype, device)]

    return Case(
        "softmax",
        rows,
        cols,
        dtype,
        [fd],
        _single(fd),
        lambda i: [torch.softmax(i[0], -1)],
        inputs,
        2 * rows * cols * dtype.itemsize,
        reduction_length=cols,
    )


def cross_entropy_fusion(rows: int, dtype: torch.dtype, checked: bool = False) -> FusionDefinition:
    """Per-row loss and dlogits of mean cross-entropy over `rows` rows in one fusion;
    `checked` passes the target through check_index first, as fuser's own lowering of
    F.cross_entropy does (benchmarks/index_check_cost.py times both)."""
    name = "cross_entropy_fwd_bwd" + ("_checked" if checked else "")
    with FusionDefinition(name) as fd:
        o = fd.ops
        logits = fd.define_tensor([-1, -1], dtype)
        target = fd.define_tensor([-1], torch.int64)
        if checked:
            target = o.check_index(target, bound=logits.shape[1], ignore=-100, what="target")
        lf = o.cast(logits, torch.float32)

        def rowb(v):
            return o.broadcast_in_dim(v, shape=logits.shape, broadcast_dims=[0])

        m = o.max(lf, dims=[1])
        e = o.exp(o.sub(lf, rowb(m)))
        total = o.sum(e, dims=[1])
        hit = o.eq(o.iota(logits.shape, dim=1, dtype=torch.int64), rowb(target))
        picked = o.sum(o.where(hit, lf, 0.0), dims=[1])
        fd.add_output(o.sub(o.add(o.log(total), m), picked))
        prob = o.div(e, rowb(total))
        scale = 1.0 / rows
        fd.add_output(o.cast(o.mul(o.sub(prob, o.cast(hit, torch.float32)), scale), dtype))
    return fd


def cross_entropy_case(rows: int, cols: int, dtype: torch.dtype) -> Case:
    """Per-row loss and dlogits of mean cross-entropy in one fusion; the mean of the row
    losses is one small torch op after it (timed with fuser)."""
    fd = cross_entropy_fusion(rows, dtype)

    def finish(outs: Tensors) -> Tensors:
        loss_rows, dlogits = outs
        return [loss_rows.mean(), dlogits]

    def run(ins: Tensors, backend: str) -> Tensors:
        return finish(fd.execute(ins, backend=backend))

    def eager(ins: Tensors) -> Tensors:
        x = ins[0].detach().requires_grad_(True)
        loss = F.cross_entropy(x.float(), ins[1])
        return [loss.detach(), torch.autograd.grad(loss, x)[0]]

    def inputs(device: str) -> Tensors:
        g = _rng(rows, cols)
        tgt = torch.randint(0, cols, (rows,), generator=g).to(device)
        return [_randn(g, (rows, cols), dtype, device), tgt]

    return Case(
        "cross_entropy_fwd_bwd",
        rows,
        cols,
        dtype,
        [fd],
        run,
        eager,
        inputs,
        2 * rows * cols * dtype.itemsize + rows * 8,
        note="bytes: read logits, write dlogits",
        reduction_length=cols,
        finish=finish,
    )


# name -> (builder, default rows, default hidden sizes, default dtype)
OPS: dict[str, tuple[Callable[[int, int, torch.dtype], Case], int, list[int], str]] = {
    "ln_fused": (seed_case, 8192, SEED_SWEEP, "fp16"),
    "layernorm": (layernorm_case, 8192, [768, 1600, 5140], "bf16"),
    "residual_layernorm": (residual_layernorm_case, 8192, [768, 1600, 5140], "bf16"),
    "layernorm_fwd_bwd": (layernorm_fwd_bwd_case, 8192, [768, 1600, 5140], "bf16"),
    "gelu_fwd": (gelu_fwd_case, 8192, [3072], "bf16"),
    "gelu_bwd": (gelu_bwd_case, 8192, [3072], "bf16"),
    "rope_fwd": (rope_case, 16384, [128], "bf16"),
    "rope_bwd": (lambda r, c, dt: rope_case(r, c, dt, backward=True), 16384, [128], "bf16"),
    "bias_grad": (colsum_case, 8192, [3072, 6400], "bf16"),
    "softmax": (softmax_case, 98304, [1024], "bf16"),
    "cross_entropy_fwd_bwd": (cross_entropy_case, 8192, [50257], "bf16"),
}


def make_cases(
    ops: list[str], hidden: list[int] | None, rows: int | None, dtype: str | None
) -> Iterator[Case]:
    for name in ops:
        if name not in OPS:
            raise SystemExit(f"unknown op {name!r}; choose from {', '.join(OPS)}")
        build, default_rows, default_hidden, default_dtype = OPS[name]
        for h in hidden or default_hidden:
            yield build(rows or default_rows, h, DTYPES[dtype or default_dtype])
