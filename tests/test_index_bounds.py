"""Index-like inputs outside their range raise; they never give a number (issue 16).

A cross-entropy target that is not in [0, classes) and not ignore_index matches no class:
unchecked, its row adds 0 to the loss (and 0 to the gradient). PyTorch raises ("Target 16
is out of bounds." on CPU, a device-side assert on CUDA). fuser checks such values with
one IR op, check_index, that both renderers print as one predicate per row inside the
kernel: on CPU (Triton's interpreter, the CUDA emulator, ATen) the call raises an
OutOfBoundsError naming the row, the value and the range; on a GPU the kernel writes an
error record that the next fuser call, or fuser.check_errors(), raises (no host
synchronization per call).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser import FusionDefinition
from fuser.dynamo import FuserBackend
from fuser.errors import FuserError, OutOfBoundsError
from fuser.ir.evaluate import evaluate
from fuser.passes import run_pipeline

ROWS, CLASSES = 7, 16
# past the end, further past it, negative but not ignore_index, and one far past int32
BAD = [CLASSES, CLASSES + 5, -2, 2**62 + 3]
BAD_ROW = 2


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# The tests run where the machine runs fuser's kernels: on the GPU where there is one
# (Triton compiles for it and CPU tensors would not reach a kernel), else on CPU. A GPU
# kernel reports a bad index asynchronously, so each call that must raise is followed by
# fuser.check_errors() (on CPU the call itself raises first).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _logits(rows: int = ROWS, classes: int = CLASSES, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, classes, generator=g).to(DEVICE)


def _targets(rows: int = ROWS, classes: int = CLASSES, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, classes, (rows,), generator=g).to(DEVICE)


def _cross_entropy(ignore_index: int = -100, target_dtype=torch.int64) -> FusionDefinition:
    with FusionDefinition("ce") as fd:
        logits = fd.define_tensor([-1, -1])
        target = fd.define_tensor([-1], target_dtype)
        fd.add_output(fd.ops.cross_entropy(logits, target, ignore_index=ignore_index))
    return fd


def _assert_names(err: BaseException, bad: int, row: int, classes: int = CLASSES) -> None:
    """The message names the value (as PyTorch words it), the row and the valid range."""
    text = str(err)
    assert isinstance(err, FuserError) and isinstance(err, IndexError), type(err)
    assert f"Target {bad} is out of bounds" in text, text
    assert f"row {row}" in text, text
    assert f"[0, {classes})" in text, text


# -- the builder: fd.execute, fd.reference ------------------------------------------------------
@pytest.mark.parametrize("bad", BAD)
def test_execute_raises_for_a_target_out_of_range(backend: str, bad: int) -> None:
    fd = _cross_entropy()
    target = _targets()
    target[BAD_ROW] = bad
    with pytest.raises(OutOfBoundsError) as info:
        fd.execute([_logits(), target])
        fuser.check_errors()
    _assert_names(info.value, bad, BAD_ROW)
    assert "-100" in str(info.value)  # the ignored value is allowed, and said so


def test_execute_raises_for_the_last_row_of_a_partial_block(backend: str) -> None:
    """7 rows in blocks of several: the last block's missing rows are masked, not checked
    (their masked loads are not targets), and its real last row is."""
    fd = _cross_entropy()
    target = _targets()
    target[ROWS - 1] = CLASSES
    with pytest.raises(OutOfBoundsError) as info:
        fd.execute([_logits(), target])
        fuser.check_errors()
    _assert_names(info.value, CLASSES, ROWS - 1)
    assert fd.kernels[0].schedule.rows_per_block > 1  # the case this test is about


def test_one_class_and_masked_rows_are_not_reported(backend: str) -> None:
    """With one class only 0 is a target: the masked rows of a partial block (loaded as
    1) must not count as bad ones."""
    fd = _cross_entropy()
    logits = _logits(classes=1)
    (loss,) = fd.execute([logits, torch.zeros(ROWS, dtype=torch.int64, device=DEVICE)])
    assert loss.item() == 0.0


def test_int32_targets_are_checked(backend: str) -> None:
    fd = _cross_entropy(target_dtype=torch.int32)
    target = _targets().int()
    target[BAD_ROW] = -7
    with pytest.raises(OutOfBoundsError) as info:
        fd.execute([_logits(), target])
        fuser.check_errors()
    _assert_names(info.value, -7, BAD_ROW)


def test_wide_rows_are_checked_once_per_row(backend: str) -> None:
    """50257 classes: the looped (online) kernel checks the target with the row values,
    not in its column loop."""
    classes = 50257
    fd = _cross_entropy()
    target = _targets(3, classes)
    target[1] = classes
    with pytest.raises(OutOfBoundsError) as info:
        fd.execute([_logits(3, classes), target])
        fuser.check_errors()
    _assert_names(info.value, classes, 1, classes)
    (kernel,) = [k for k in fd.kernels if "check_index" in k.spec.segment.ops_summary()]
    assert kernel.schedule.kind == "inner_looped"


@pytest.mark.parametrize("bad", BAD)
def test_reference_raises_the_same_error(bad: int) -> None:
    fd = _cross_entropy()
    target = _targets()
    target[BAD_ROW] = bad
    inputs = [_logits(), target]
    with pytest.raises(OutOfBoundsError) as info:
        fd.reference(inputs)
    _assert_names(info.value, bad, BAD_ROW)
    # the decomposed graph, evaluated op by op, raises too (check_index, not ATen's loss)
    with pytest.raises(OutOfBoundsError) as info:
        evaluate(run_pipeline(fd.bind(inputs)).final, inputs)
    _assert_names(info.value, bad, BAD_ROW)


@pytest.mark.parametrize("ignore_index", [-100, 3, -2])
def test_in_range_and_ignored_targets_give_the_eager_loss(backend: str, ignore_index) -> None:
    fd = _cross_entropy(ignore_index)
    logits, target = _logits(), _targets()
    target[1] = ignore_index
    target[4] = CLASSES - 1
    target[5] = 0
    (loss,) = fd.execute([logits, target])
    want = F.cross_entropy(logits, target, ignore_index=ignore_index)
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)


def test_the_check_is_one_predicate_per_row_in_the_generated_source(backend: str) -> None:
    fd = _cross_entropy()
    fd.execute([_logits(), _targets()])
    checked = [k for k in fd.kernels if "check_index" in k.spec.segment.ops_summary()]
    assert len(checked) == 1 and checked[0].source.count("index_error(") == 2, [
        k.source for k in checked
    ]  # the helper's definition and its one call
    assert "ignore_index" in checked[0].source  # the comment says why
    for k in fd.kernels:  # kernels without a check take no error record
        assert ("err_ptr" in k.source) == (k in checked), k.source


def test_check_index_op_on_its_own(backend: str) -> None:
    """fd.ops.check_index is the general op: an index into `bound` things, an optional
    ignored value; it passes the index through."""
    with FusionDefinition("gather_like") as fd:
        x = fd.define_tensor([-1, -1])
        idx = fd.define_tensor([-1], torch.int64)
        checked = fd.ops.check_index(idx, bound=x.shape[1], what="index")
        hit = fd.ops.eq(fd.ops.iota(x.shape, dim=1), fd.ops.broadcast_in_dim(checked, x.shape, [0]))
        fd.add_output(fd.ops.sum(fd.ops.where(hit, x, 0.0), dims=[1]))
    x, idx = _logits(), _targets()
    (picked,) = fd.execute([x, idx])
    torch.testing.assert_close(picked, x.gather(1, idx[:, None])[:, 0])
    idx[3] = -1
    with pytest.raises(OutOfBoundsError, match=r"Index -1 is out of bounds.*row 3.*\[0, 16\)"):
        fd.execute([x, idx])
        fuser.check_errors()
    with pytest.raises(OutOfBoundsError, match="Index -1 is out of bounds"):
        fd.reference([x, idx])


def test_the_error_is_raised_once_and_the_next_call_runs(backend: str) -> None:
    fd = _cross_entropy()
    target = _targets()
    target[BAD_ROW] = CLASSES
    with pytest.raises(OutOfBoundsError):
        fd.execute([_logits(), target])
        fuser.check_errors()
    target[BAD_ROW] = 0
    (loss,) = fd.execute([_logits(), target])
    torch.testing.assert_close(loss, F.cross_entropy(_logits(), target), atol=1e-5, rtol=1e-5)
    fuser.check_errors()  # nothing pending


# -- torch.compile(backend="fuser") -------------------------------------------------------------
@pytest.mark.parametrize("bad", BAD)
def test_compiled_cross_entropy_raises_forward(backend: str, bad: int) -> None:
    fb = FuserBackend()  # not strict: a fuser failure would fall back to ATen silently

    def f(logits, target):
        return F.cross_entropy(logits, target)

    compiled = torch.compile(f, backend=fb, dynamic=False)
    logits = _logits().requires_grad_()
    target = _targets()
    loss = compiled(logits, target)  # a good batch first: the region is fused and runs
    torch.testing.assert_close(loss, f(logits, target), atol=1e-5, rtol=1e-5)
    target[BAD_ROW] = bad
    with pytest.raises(OutOfBoundsError) as info:
        compiled(logits, target)
        fuser.check_errors()
    _assert_names(info.value, bad, BAD_ROW)
    # a bad batch is the data's fault: the region stays fused for the next one
    regions = [r for c in fb.captures for g in c.graphs for r in g.fused]
    assert regions and all(r.fallback is None for r in regions), [r.fallback for r in regions]


@pytest.mark.parametrize("bad", BAD)
def test_compiled_nll_loss_backward_raises(backend: str, bad: int) -> None:
    """nll_loss_backward's own lowering checks its target (a backward graph can see a target
    its forward did not, e.g. a forward run elsewhere)."""
    logits = _logits()
    target = _targets()

    def backward(grad, logp, target, total):
        return torch.ops.aten.nll_loss_backward(grad, logp, target, None, 1, -100, total)

    fb = FuserBackend(strict=True)
    compiled = torch.compile(backward, backend=fb, dynamic=False)
    logp = logits.log_softmax(-1)
    args = [
        torch.tensor(1.0, device=DEVICE),
        logp,
        target,
        torch.tensor(float(ROWS), device=DEVICE),
    ]
    torch.testing.assert_close(compiled(*args), backward(*args))
    assert any(r.kernels for c in fb.captures for g in c.graphs for r in g.fused)
    target[BAD_ROW] = bad
    with pytest.raises(OutOfBoundsError) as info:
        compiled(*args)
        fuser.check_errors()
    _assert_names(info.value, bad, BAD_ROW)


def test_compiled_cross_entropy_backward_with_ignored_rows(backend: str) -> None:
    def f(logits, target):
        return F.cross_entropy(logits, target, ignore_index=5)

    compiled = torch.compile(f, backend=FuserBackend(strict=True), dynamic=False)
    target = _targets()
    target[0] = 5
    target[3] = -100 + 100  # class 0
    grads = []
    for fn in (f, compiled):
        logits = _logits().requires_grad_()
        fn(logits, target).backward()
        grads.append(logits.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


# -- on a GPU: reported by the next call, no synchronization per call ----------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_reports_at_the_next_call_without_synchronizing(backend: str) -> None:
    fd = _cross_entropy()
    logits, target = _logits(4096, 50257).cuda(), _targets(4096, 50257).cuda()
    fd.execute([logits, target])  # compiled and warm
    torch.cuda.synchronize()
    # a good call synchronizes nothing (torch raises on a synchronizing torch call here)
    torch.cuda.set_sync_debug_mode("error")
    try:
        fd.execute([logits, target])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    bad = target.clone()
    bad[4000] = 50257
    fd.execute([logits, bad])  # asynchronous: it may or may not raise here
    torch.cuda.synchronize()
    with pytest.raises(OutOfBoundsError) as info:
        fd.execute([logits, target])  # the next call finds the record
    _assert_names(info.value, 50257, 4000, 50257)
    assert "reported by kernel" in str(info.value)
    fd.execute([logits, target])  # raised once; the context is fine
    bad[4000] = -5
    fd.execute([logits, bad])
    with pytest.raises(OutOfBoundsError) as info:
        fuser.check_errors()  # synchronizes, then raises
    _assert_names(info.value, -5, 4000, 50257)
    fuser.check_errors()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_compiled_cross_entropy_reports(backend: str) -> None:
    compiled = torch.compile(lambda x, t: F.cross_entropy(x, t), backend="fuser", dynamic=False)
    logits = _logits(64, 1000).cuda().requires_grad_()
    target = _targets(64, 1000).cuda()
    compiled(logits, target).backward()
    target[9] = 1000
    with pytest.raises(OutOfBoundsError) as info:
        # the backward's own fuser call may find the forward kernel's report already
        compiled(logits, target).backward()
        fuser.check_errors()
    _assert_names(info.value, 1000, 9, 1000)
