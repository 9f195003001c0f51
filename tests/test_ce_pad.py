"""The backward's padded cross-entropy gradient as a view of its own rows (fuser/dynamo/
ce_pad.py), not pad_mm.py's padded copy.

- buffers of rows further apart than their width span whole rows (runtime/buffers.py):
  the op's eager and fake gradient, cross_entropy_grad's and the out-of-place scaling's;
- padded_rows zeroes the gap columns, whatever they held, returns a view of the storage
  without bumping the saved gradient's version, and pads by a copy a tensor of another
  layout;
- GPT-2's step in small (an odd V, bf16 logits, the loss in float32) under torch.compile:
  loss and gradients as eager's, with ignored rows, label smoothing, an upstream gradient
  that is not 1, per-row losses and retain_graph; the backward has no pad of the
  gradient, one padded_rows instead, shared by dX's and dW's matmuls; a saved-tensor hook
  that fills the gap with NaN changes nothing, one that hands back a contiguous copy
  gets the padded copy;
- a tensor of the same layout that is not the gradient (a slice of wider rows, whose gap
  holds data) is padded by a copy.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser.dynamo import FuserBackend
from fuser.dynamo.ce_op import grad_row_stride
from fuser.dynamo.ce_pad import padded_rows
from fuser.dynamo.ce_scale import scale_in_place
from fuser.runtime.buffers import empty_whole, has_gap

BF16 = torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the steps run on a GPU if any


pytestmark = pytest.mark.usefixtures("pad_every_matmul")  # conftest.py


def _gap(t: torch.Tensor, width: int) -> torch.Tensor:
    """The columns V..width-1 of t's rows, from its storage (a tensor of its own: writing
    it does not count as changing t)."""
    n, v = t.shape
    at = t.storage_offset() + v
    return t.new_empty(0).set_(t.untyped_storage(), at, (n, width - v), (width, 1))


def test_whole_rows_everywhere() -> None:
    assert has_gap((5, 45), (48, 1)) and not has_gap((5, 48), (48, 1))
    assert not has_gap((48, 5), (1, 48)) and has_gap((45, 5), (1, 48))
    t = empty_whole((5, 45), (48, 1), BF16, "cpu")
    assert t.stride() == (48, 1) and t._base is None
    assert t.untyped_storage().nbytes() == 5 * 48 * 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 45, generator=g).to(BF16)
    tgt = torch.randint(0, 45, (6,), generator=g)
    for where in ("cpu", "meta"):
        xs, ts = x.to(where), tgt.to(where)
        _, grad = torch.ops.fuser.cross_entropy(xs, ts, 1, -100, 0.0, True, True)
        assert grad.stride() == (48, 1) and grad.untyped_storage().nbytes() == 6 * 48 * 2
        up = torch.tensor(2.0, device=where)
        scaled = torch.ops.fuser.cross_entropy_grad(grad, up)
        assert scaled.untyped_storage().nbytes() == 6 * 48 * 2
    _, grad = torch.ops.fuser.cross_entropy(x, tgt, 1, -100, 0.0, True, False)
    assert grad.is_contiguous() and grad.untyped_storage().nbytes() == 6 * 45 * 2


def test_out_of_place_scaling_keeps_whole_rows() -> None:
    """retain_graph: the scaled gradient is a new buffer, of whole rows too."""
    x = torch.randn(4, 45).to(BF16)
    _, grad = torch.ops.fuser.cross_entropy(x, torch.arange(4), 1, -100, 0.0, True, True)
    out = []

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):  # noqa: ANN001, ANN205
            return a * 1.0

        @staticmethod
        def backward(ctx, up):  # noqa: ANN001, ANN205
            out.append(scale_in_place(grad, torch.tensor(3.0)))
            return up

    a = torch.ones((), requires_grad=True)
    Scale.apply(a).backward(retain_graph=True)
    (scaled,) = out
    assert scaled.data_ptr() != grad.data_ptr() and scaled.stride() == (48, 1)
    assert scaled.untyped_storage().nbytes() == 4 * 48 * 2
    torch.testing.assert_close(scaled, (grad.float() * 3).to(BF16))


def test_padded_rows_zeroes_the_gap_in_place() -> None:
    x = torch.randn(7, 61).to(BF16)
    _, grad = torch.ops.fuser.cross_entropy(x, torch.arange(7), 1, -100, 0.1, True, True)
    width = grad_row_stride(61, BF16)
    assert width == 64
    _gap(grad, width).fill_(float("nan"))  # what a reused buffer may hold
    version = grad._version
    rows = padded_rows(grad, width)
    assert rows.shape == (7, 64) and rows.stride() == (64, 1)
    assert rows.data_ptr() == grad.data_ptr()  # a view: no copy
    assert torch.equal(rows, F.pad(grad, (0, 3)))  # the gap is exactly zero
    assert grad._version == version  # a second backward may still read the saved gradient
    # another layout (a saved-tensor hook's contiguous copy): a padded copy
    flat = grad.contiguous()
    copy = padded_rows(flat, width)
    assert copy.data_ptr() != flat.data_ptr() and torch.equal(copy, rows)


def _graph_pads(backend: FuserBackend, n: int, width: int) -> tuple[int, int]:
    """(padded_rows calls, pads made as copies of [n, width]) in the compiled backward."""
    (bw,) = [gr for c in backend.captures for gr in c.graphs if gr.kind == "backward"]
    nodes = list(bw.module.graph.nodes)
    views = sum(nd.target is padded_rows for nd in nodes)
    copies = sum(
        nd.target == torch.ops.aten.constant_pad_nd.default
        and tuple(nd.meta["val"].shape) == (n, width)
        for nd in nodes
    )
    shape = f"[{n}, {width}]"
    copies += sum(
        "constant_pad_nd" in line and shape in line for r in bw.regions for line in r.nodes
    )
    return views, copies


def _step_case(
    v: int,
    reduction: str = "mean",
    eps: float = 0.0,
    upstream: float = 1.0,
    retain: bool = False,
    hooks: tuple | None = None,
) -> FuserBackend:
    """Compiled and eager: bf16 lm head of an odd V, F.cross_entropy of its float32
    logits, ignored rows; asserts loss and gradients match. Returns the backend."""
    g = torch.Generator().manual_seed(v)
    x0 = torch.randn(2, 12, 32, generator=g)
    w0 = torch.randn(v, 32, generator=g) * 0.3
    target = torch.randint(0, v, (24,), generator=g)
    target[[3, 10]] = -1
    weights = torch.rand(24, generator=g) + 0.5
    x0, w0, target, weights = (t.to(DEVICE) for t in (x0, w0, target, weights))

    def step(x, w):  # noqa: ANN001, ANN202
        logits = x.bfloat16() @ w.bfloat16().t()
        return F.cross_entropy(
            logits.view(-1, v).float(), target, ignore_index=-1, reduction=reduction,
            label_smoothing=eps,
        )  # fmt: skip

    def scalar(loss: torch.Tensor) -> torch.Tensor:
        return (loss * weights).sum() if reduction == "none" else loss * upstream

    backend = FuserBackend(strict=True)
    results = []
    for fn in (step, torch.compile(step, backend=backend)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        hooked = torch.autograd.graph.saved_tensors_hooks(*hooks) if hooks else None
        with hooked or contextlib.nullcontext():
            loss = fn(x, w)
        scalar(loss).backward(retain_graph=retain)
        if retain:  # again, from the same saved gradient
            (scalar(loss) * 0.5).backward()
        results.append((loss.detach(), x.grad, w.grad))
    (want_loss, *want), (got_loss, *got) = results
    torch.testing.assert_close(got_loss, want_loss, atol=1e-4, rtol=1e-4)
    for a, b in zip(got, want):
        scale = b.abs().max().item()
        torch.testing.assert_close(a, b, atol=2e-2 * scale, rtol=2e-2)
    return backend


CASES = [
    # (V, reduction, label smoothing, upstream gradient, retain_graph)
    (45, "mean", 0.0, 1.0, False),
    (61, "mean", 0.1, 3.0, False),
    (45, "sum", 0.0, 1.0, True),
    (61, "mean", 0.0, 2.0, True),
    (45, "none", 0.2, 1.0, False),
]


@pytest.mark.parametrize(("v", "reduction", "eps", "upstream", "retain"), CASES)
def test_step_reads_the_gradient_rows_in_place(v, reduction, eps, upstream, retain) -> None:  # noqa: ANN001
    backend = _step_case(v, reduction, eps, upstream, retain)
    assert sum(c.cross_entropy for c in backend.captures) == 1
    width = grad_row_stride(v, BF16)
    # one view serves dX (K padded) and dW (M padded of its transpose); no padded copy
    assert _graph_pads(backend, 24, width) == (1, 0)
    notes = [n for c in backend.captures for gr in c.graphs for n in gr.matmuls_padded]
    assert any(f"K {v} -> {width}" in n for n in notes), notes
    assert any(f"M {v} -> {width}" in n for n in notes), notes
    assert "gap columns zeroed" in fuser.explain(backend)


def test_garbage_in_the_gap_is_zeroed() -> None:
    """A saved-tensor hook fills the saved gradient's gap with NaN before the backward
    reads it: as a buffer reused by the program could hold. The gradients stay eager's."""

    def unpack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == BF16 and t.dim() == 2 and t.stride() == (48, 1):
            _gap(t, 48).fill_(float("nan"))
        return t

    _step_case(45, upstream=2.0, hooks=(lambda t: t, unpack))


def test_a_contiguous_saved_gradient_is_padded_by_a_copy() -> None:
    """A hook that hands the saved gradient back contiguous (as save_on_cpu does): the
    backward takes its old path and padded_rows pads by a copy; the gradients are right."""

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t.contiguous()

    _step_case(61, hooks=(lambda t: t, unpack))


def test_a_slice_of_wider_rows_is_padded_by_a_copy() -> None:
    """a[:, :45] has rows 48 apart too, but its gap is a's data: never read as zeros."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(20, 48, generator=g)
    a[:, 45:] = 1e3
    w = torch.randn(45, 30, generator=g)
    backend = FuserBackend(strict=True)
    got = torch.compile(lambda a, w: a[:, :45] @ w, backend=backend)(a, w)
    torch.testing.assert_close(got, a[:, :45] @ w, atol=1e-4, rtol=1e-4)
    (fw,) = [gr for c in backend.captures for gr in c.graphs]
    assert any("K 45 -> 48" in n for n in fw.matmuls_padded)
    assert not any(nd.target is padded_rows for nd in fw.module.graph.nodes)


def test_the_gradient_plus_another_is_padded_by_a_copy() -> None:
    """Logits that feed another loss too: their gradient is a sum, a new tensor whose
    rows are not the cross-entropy's, so it is padded by a copy; gradients as eager's."""
    g = torch.Generator().manual_seed(2)
    x0, w0 = torch.randn(24, 32, generator=g), torch.randn(45, 32, generator=g) * 0.3
    target = torch.randint(0, 45, (24,), generator=g)
    x0, w0, target = x0.to(DEVICE), w0.to(DEVICE), target.to(DEVICE)

    def step(x, w):  # noqa: ANN001, ANN202
        logits = (x.bfloat16() @ w.bfloat16().t()).float()
        return F.cross_entropy(logits, target) + logits.square().mean() * 0.1

    backend = FuserBackend(strict=True)
    results = []
    for fn in (step, torch.compile(step, backend=backend)):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = fn(x, w)
        loss.backward()
        results.append((loss.detach(), x.grad, w.grad))
    for a, b in zip(results[1], results[0]):
        torch.testing.assert_close(a, b, atol=2e-2 * b.abs().max().item(), rtol=2e-2)
    views, copies = _graph_pads(backend, 24, 48)
    assert views == 0 and copies == 1
