"""Adversarial cases for sessions 11-12: picks (fuser/plan/picks.py), the cross-entropy
lowering's int32 one-hot compare (fuser/dynamo/ce_lower.py), the lone-row walk with L2
hints (fuser/schedulers/heuristics.py) and the executor taking the plan fd.compile made
for meta tensors (fuser/runtime/executor.py `_planned_ahead`). Against eager (float64
where it helps), on Triton's interpreter (and the CUDA emulator where g++ is there).

Bugs these found, each test failing before its fix:
- a float iota (fp16 over more than 2048 columns: several columns round to one value)
  was taken for a pick: the compare selects all of those columns, eager sums them all,
  the pick read one (silently wrong);
- a plan compiled for a meta tensor with a storage offset was keyed by the offset's
  alignment but planned for 16 bytes, and taken by a real tensor of that offset: 16-byte
  vector accesses of a pointer 4 bytes past a boundary ('misaligned address' on a GPU);
- the planned-ahead path skipped bind's checks of the inputs' devices: meta inputs (or
  mixed devices) reached the kernel ("Cannot copy out of meta tensor"; on a GPU, a CPU
  pointer handed to a CUDA kernel) instead of execute's InputError.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import fuser
from fuser import FusionDefinition
from fuser.bench.measure import with_schedule
from fuser.dynamo import FuserBackend
from fuser.dynamo.ce_region import one_pass_fusion
from fuser.errors import InputError, OutOfBoundsError
from fuser.plan.picks import one_hot_picks
from fuser.runtime import executor
from fuser.schedulers import device as device_module
from fuser.schedulers.device import get_device
from fuser.schedulers.heuristics import schedule_looped

I32, I64, F16, F32, BF16 = torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16
LONG = 50003  # fp32 columns the h100 preset walks in a loop
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _row_kernel(kernels):  # noqa: ANN001, ANN202
    return max(kernels, key=lambda k: k.spec.cols)


def _rowb(o, v, x):  # noqa: ANN001, ANN202
    return o.broadcast_in_dim(v, shape=x.shape, broadcast_dims=[0])


# -- picks -----------------------------------------------------------------------------
def test_a_float_iota_is_not_a_pick() -> None:
    """fp16 counts columns exactly only to 2048: columns 4099, 4100 and 4101 are all
    4100.0, so where(iota == 4100, x, 0) keeps three of them and eager sums the three.
    A pick would read column 4100 alone."""
    with FusionDefinition("half_iota") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], F32)
        i = fd.define_tensor([-1], I64)
        hit = o.eq(o.iota(x.shape, dim=1, dtype=F16), _rowb(o, i, x))
        fd.add_output(o.sum(o.where(hit, x, 0.0), dims=[1]))
        fd.add_output(o.max(x, dims=[1]))
    x = torch.zeros(2, LONG)
    x[:, 4099:4102] = torch.tensor([1.0, 10.0, 100.0])  # ties of the fp16 rounding: zeros
    x, i = x.to(DEVICE), torch.tensor([4100, -1], device=DEVICE)
    got = fd.execute([x, i], backend="triton")
    k = _row_kernel(fd.kernels)
    assert k.schedule.kind == "inner_looped" and not one_hot_picks(k.spec), k.plan.text()
    torch.testing.assert_close(got[0], fd.reference([x, i])[0])
    assert got[0].tolist() == [111.0, 0.0]


def _picks_fusion(dtype: torch.dtype) -> FusionDefinition:
    """Three picks of three rounds in one looped kernel: 2x at an int64 index, exp(x - max)
    at an int32 index written on the left of the compare, and x at a column computed from
    a reduction (the count of the row's positive values, cols itself when all are)."""
    with FusionDefinition("picks") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], dtype)
        i = fd.define_tensor([-1], I64)
        j = fd.define_tensor([-1], I32)
        lf = o.cast(x, F32)
        col = o.iota(x.shape, dim=1, dtype=I64)
        fd.add_output(o.sum(o.where(o.eq(col, _rowb(o, i, x)), o.mul(lf, 2.0), 0.0), dims=[1]))
        m = o.max(lf, dims=[1])
        hit_j = o.eq(_rowb(o, j, x), o.iota(x.shape, dim=1, dtype=I32))
        e = o.exp(o.sub(lf, _rowb(o, m, x)))
        fd.add_output(o.sum(o.where(hit_j, e, 0.0), dims=[1]))
        positives = o.cast(o.sum(o.cast(o.gt(lf, 0.0), F32), dims=[1]), I64)
        fd.add_output(o.sum(o.where(o.eq(col, _rowb(o, positives, x)), lf, 0.0), dims=[1]))
        fd.add_output(o.cast(o.mul(lf, 3.0), dtype))
    return fd


def _picks_reference(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> list[torch.Tensor]:
    xd, col = x.double(), torch.arange(x.shape[1])[None, :]

    def pick(v: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return torch.where(col == at[:, None].long(), v, 0.0).sum(1)

    e = torch.exp(xd - xd.amax(1, keepdim=True))
    return [pick(2 * xd, i), pick(e, j), pick(xd, (xd > 0).sum(1)), xd * 3]


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("cols", [1, 7, 33])
def test_picks_of_three_rounds_on_forced_walks(dtype: torch.dtype, cols: int) -> None:
    """Walks of one warp (32 x vector columns an iteration) over rows of 1, 7 and 33
    columns: the tail alone, or a loop and a tail; indices at either end, off either end
    and at int32's extremes; the computed index equal to cols where every value is > 0."""
    g = torch.Generator().manual_seed(cols)
    x = (torch.randn(4, cols, generator=g) * 3).to(dtype)
    x[3] = x[3].abs() + 1  # all positive: the computed column is cols, off the row
    i = torch.tensor([0, cols - 1, -1, cols])
    j = torch.tensor([cols - 1, 0, 2**31 - 1, -(2**31)], dtype=I32)
    want = _picks_reference(x, i, j)
    x, i, j = x.to(DEVICE), i.to(DEVICE), j.to(DEVICE)
    fd = _picks_fusion(dtype)
    fd.execute([x, i, j], backend="triton")
    plan = fd._runtime().last
    idx = max(plan.kernels, key=lambda n: plan.kernels[n].spec.cols)
    spec = plan.kernels[idx].spec
    for vector, unroll in ((1, 1), (1, 4), (4, 2)):
        s = schedule_looped(spec, get_device("h100"), vector, [], 1, unroll, "triton")
        forced = with_schedule(plan, idx, s)
        k = forced.kernels[idx]
        assert k.plan.kind == "inner_looped" and len(k.plan.picks) >= 2, k.plan.text()
        got = forced.run([x, i, j])
        for a, b in zip(got[:3], want[:3]):
            torch.testing.assert_close(a.double().cpu(), b, rtol=1e-6, atol=1e-6)
        tol = 2**-8 if dtype == BF16 else 1e-6
        torch.testing.assert_close(got[3].double().cpu(), want[3], rtol=tol, atol=tol)


# -- the lone-row walk -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "cols", "stride"),
    [("softmax", 32000, 32000), ("log_softmax", 31999, 32008), ("ce", 31999, 32008)],
)
def test_lone_row_walk_on_a_small_device(
    monkeypatch: pytest.MonkeyPatch, op: str, cols: int, stride: int
) -> None:
    """The rule that walks a lone persistent row (with L2 hints) wants more rows than 4 a
    SM: on an h100 of 2 SMs, 10 rows take it, so its kernels run here; odd rows that are
    a slice of wider ones (row stride past the columns)."""
    small = replace(device_module.PRESETS["h100"], name="h100 of 2 SMs", sms=2)
    monkeypatch.setattr(device_module, "current", lambda: small)
    g = torch.Generator().manual_seed(cols)
    x = (torch.randn(10, stride, generator=g) * 3).to(BF16).to(DEVICE)[:, :cols]
    xd = x.double().requires_grad_(True)
    if op == "ce":
        t = torch.randint(0, cols, (10,), generator=g)
        t[3], t[4], t[5] = -100, cols - 1, 0
        t = t.to(DEVICE)
        fd = one_pass_fusion(x, t)
        loss, grad = fd.execute([x, t], backend="triton")
        want = F.cross_entropy(xd, t)
        want.backward()
        torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-5, atol=1e-5)
        scale = xd.grad.abs().max().item()
        torch.testing.assert_close(grad.double(), xd.grad, rtol=2**-7, atol=2**-8 * scale)
    else:
        fd = FusionDefinition(op)
        with fd:
            fd.add_output(getattr(fd.ops, op)(fd.define_tensor([-1, -1], BF16)))
        (y,) = fd.execute([x], backend="triton")
        torch.testing.assert_close(
            y.double(), getattr(torch, op)(xd, dim=-1), rtol=2**-7, atol=1e-6
        )
    k = _row_kernel(fd.kernels)
    assert k.schedule.kind == "inner_looped" and k.plan.walk_evict, k.schedule.explain()
    assert "not persistent" in k.schedule.explain()


# -- the cross-entropy lowering at a walked vocabulary ---------------------------------
V = 32001  # bf16/fp16 rows the h100 preset walks (a pick reads the target's logit)


@pytest.fixture
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("_fresh_dynamo")
@pytest.mark.parametrize(
    ("dtype", "upcast", "reduction", "ignore", "targets"),
    [
        # an ignore_index inside [0, V): the clamp keeps it a column, the pick reads a
        # real logit there, and the row's loss and gradient are masked after
        (BF16, True, "mean", 3, [0, V - 1, 3, 7]),
        # ignore_index V, the clamp's own bound, and a sum
        (F16, False, "sum", V, [V, 5, V - 1, V]),
    ],
)
def test_cross_entropy_walked_with_ignored_targets(
    dtype: torch.dtype, upcast: bool, reduction: str, ignore: int, targets: list[int]
) -> None:
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, V, generator=g) * 3).to(dtype).to(DEVICE)
    t = torch.tensor(targets, device=DEVICE)

    kw = dict(reduction=reduction, ignore_index=ignore, label_smoothing=0.1)

    def f(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        y = x.float() if upcast else x
        return F.cross_entropy(y, t, **kw) * 3.7 / 4  # loss scaling, accumulation steps

    xd = x.double().requires_grad_(True)
    want = F.cross_entropy(xd, t, **kw) * 3.7 / 4
    want.backward()
    b = FuserBackend(strict=True)
    xc = x.clone().requires_grad_(True)
    loss = torch.compile(f, backend=b)(xc, t)
    loss.backward()
    assert sum(c.cross_entropy for c in b.captures) == 1
    tol = 1e-5 if upcast else 2**-7
    torch.testing.assert_close(loss.double(), want.detach(), rtol=tol, atol=tol)
    scale = xd.grad.abs().max().item()
    torch.testing.assert_close(xc.grad.double(), xd.grad, rtol=2**-7, atol=2**-8 * scale)


@pytest.mark.usefixtures("_fresh_dynamo")
def test_cross_entropy_walked_target_out_of_range_raises() -> None:
    """The pick reads the target's column only; the target's check is its own, per row."""
    x = torch.randn(3, V).to(BF16).to(DEVICE).requires_grad_(True)
    t = torch.tensor([5, V, 7], device=DEVICE)
    with pytest.raises(OutOfBoundsError, match=rf"Target {V} is out of bounds"):
        torch.compile(lambda x, t: F.cross_entropy(x.float(), t), backend="fuser")(x, t)
        fuser.check_errors()


# -- plans made ahead for meta tensors -------------------------------------------------
def _add_rows() -> FusionDefinition:
    with FusionDefinition("add_rows") as fd:
        a = fd.define_tensor([-1, -1], F32)
        b = fd.define_tensor([-1, -1], F32)
        fd.add_output(fd.ops.add(fd.ops.exp(a), b))
    return fd


def test_meta_plan_of_an_offset_view_is_not_taken_unaligned(backend: str) -> None:
    """A meta view 4 bytes into its storage was planned as 16-byte aligned (build_specs
    takes meta pointers so) but keyed by its offset; a real tensor 4 bytes past a boundary
    then ran 16-byte vectors (the CUDA emulator's 'misaligned address'; a GPU's fault)."""
    fd = _add_rows()
    meta = torch.empty(3 * 64 + 1, device="meta")[1:].view(3, 64)
    fd.compile([meta, torch.empty(3, 64, device="meta")], backend=backend)
    g = torch.Generator().manual_seed(0)
    flat, y = torch.randn(3 * 64 + 1, generator=g), torch.randn(3, 64, generator=g)
    flat, y = flat.to(DEVICE), y.to(DEVICE)
    x = flat[1:].view(3, 64)
    (out,) = fd.execute([x, y], backend=backend)
    torch.testing.assert_close(out, x.exp() + y)
    (k,) = fd.kernels
    assert k.spec.args[0].align == x.data_ptr() & -x.data_ptr() == 4


def test_meta_plan_keeps_execute_input_checks() -> None:
    """execute's InputError for meta inputs, and for inputs on two devices (a GPU's and
    the CPU's), also where compile planned that signature."""
    fd = _add_rows()
    meta = [torch.empty(3, 64, device="meta") for _ in range(2)]
    fd.compile(meta)
    for ins in (meta, [torch.randn(3, 64, device=DEVICE), meta[1]]):
        with pytest.raises(InputError, match="meta device, which holds no data"):
            fd.execute(ins)
    if DEVICE == "cuda":
        with pytest.raises(InputError, match="expected all inputs on one device"):
            fd.execute([torch.randn(3, 64, device="cuda"), torch.randn(3, 64)])


def test_meta_plan_is_taken_for_its_device_and_backend_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan for the 'h100' preset is not the interpreter's (its h100 preset is another
    device; on an H100 it is the GPU's), one for another backend is not taken; an empty
    input's plan (ATen) is."""
    planned: list[str] = []
    original = executor.plan

    def counting(graph, inputs, name, backend, device, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        planned.append(backend)
        return original(graph, inputs, name, backend, device, *args, **kwargs)

    monkeypatch.setattr(executor, "plan", counting)
    x, y = torch.randn(3, 64, device=DEVICE), torch.randn(3, 64, device=DEVICE)
    meta = [torch.empty(3, 64, device="meta")] * 2
    preset_is_here = get_device(None).name == get_device("h100").name
    for compile_kw, run_backend, plans in (
        (dict(device="h100"), "triton", 0 if preset_is_here else 1),
        (dict(backend="cuda"), "triton", 1),
        (dict(backend="triton"), "triton", 0),
    ):
        fd = _add_rows()
        fd.compile(meta, **compile_kw)
        planned.clear()
        (out,) = fd.execute([x, y], backend=run_backend)
        torch.testing.assert_close(out, x.exp() + y)
        assert len(planned) == plans, (compile_kw, planned)
    fd = _add_rows()
    fd.compile([torch.empty(0, 64, device="meta")] * 2)
    planned.clear()
    (out,) = fd.execute([torch.randn(0, 64, device=DEVICE)] * 2)
    assert out.shape == (0, 64) and planned == []
