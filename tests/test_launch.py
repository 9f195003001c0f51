"""The cached-call fast paths: a one-kernel plan's direct argument list, Triton's launcher
called without its wrapper, the prepared CUDA driver launch. Each must give exactly what
the general path gives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fuser import FusionDefinition
from fuser.examples import seed_inputs, seed_layernorm_fusion
from fuser.runtime import kernel as kernel_mod

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
needs_gpu = pytest.mark.skipif(not GPU, reason="launches a compiled kernel: needs a CUDA GPU")


def _plan(fd: FusionDefinition):
    return fd._runtime().last


def test_one_kernel_plan_runs_direct_and_agrees_with_the_general_path() -> None:
    fd = seed_layernorm_fusion()
    inputs = seed_inputs(5, 96, device=DEVICE)
    fast = fd.execute(inputs)
    plan = _plan(fd)
    assert plan._direct is not None
    plan._direct = None  # the general, value-id path
    slow = fd.execute(inputs)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    ref = fd.reference(inputs)
    torch.testing.assert_close(fast[0].float(), ref[0].float(), atol=2e-3, rtol=2e-3)


def test_two_kernel_plan_takes_the_general_path() -> None:
    """A column sum broadcast back over the rows needs two kernels: no direct plan, and
    the general path still gives torch's numbers."""
    with FusionDefinition("two_kernels") as fd:
        x = fd.define_tensor([-1, -1])
        s = fd.ops.sum(x, dims=[0])
        fd.add_output(fd.ops.add(x, fd.ops.broadcast_in_dim(s, shape=x.shape, broadcast_dims=[1])))
    x = torch.randn(7, 37, device=DEVICE)
    (y,) = fd.execute([x])
    assert len(fd.kernels) == 2 and _plan(fd)._direct is None
    torch.testing.assert_close(y, x + x.sum(0), atol=1e-5, rtol=1e-5)


def test_launch_hooks_send_launches_through_tritons_wrapper(monkeypatch) -> None:
    """With a profiler's hook in Triton's chain the direct call would skip it."""

    class Chain:
        def __init__(self, calls: list) -> None:
            self.calls = calls

    empty = SimpleNamespace(launch_enter_hook=Chain([]), launch_exit_hook=Chain([]))
    hooked = SimpleNamespace(launch_enter_hook=Chain([print]), launch_exit_hook=Chain([]))
    old_style = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    for knobs, want in ((empty, False), (hooked, True), (old_style, False)):
        monkeypatch.setattr(kernel_mod, "_runtime_knobs", knobs)
        assert kernel_mod.launch_hooked() is want


@needs_gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_cached_calls_agree_and_follow_the_current_stream(backend: str) -> None:
    fd = seed_layernorm_fusion()
    inputs = seed_inputs(1000, 1536, device="cuda")
    first = fd.execute(inputs, backend=backend)[0]
    k = fd.kernels[0]
    if backend == "triton":
        assert k._fast is not None, "Triton's launcher is not called directly"
    ref = fd.reference(inputs)[0]
    torch.testing.assert_close(first.float(), ref.float(), atol=2e-2, rtol=2e-2)
    # later calls run on whichever stream is current: write an input late on a side
    # stream and launch there; a launch on any other stream would read the old data
    late = [t.clone() for t in inputs]
    late[1].mul_(0.5)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(50_000_000)
        late[1].copy_(inputs[1])
        again = fd.execute(late, backend=backend)[0]
    torch.cuda.synchronize()
    assert torch.equal(again, first)
