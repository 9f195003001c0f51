"""Edge cases of the generated call program (fuser/dynamo/program/), each found by
running graphs three or more times (the program is built after the first call) against
the old path and eager. Kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import FuserBackend
from fuser.dynamo.program.observe import Layout, Observed


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _programs(backend: FuserBackend) -> list:
    return [g.program for c in backend.captures for g in c.graphs if g.program is not None]


def test_kernel_outputs_are_allocated_on_their_regions_device():
    """The program allocated every kernel output on the device of the graph's first
    tensor input. When that input lives elsewhere (on a GPU: a CPU scalar tensor or step
    counter beside CUDA activations; here: a meta tensor beside CPU ones) the kernels got
    buffers on the wrong device: a crash, or on CUDA a launch on a CPU pointer."""

    def f(m, x):
        return m.view(-1), (x * 2).sin() + 1

    backend = FuserBackend(strict=True)
    compiled = torch.compile(f, backend=backend, dynamic=False)
    for _ in range(3):
        x = torch.randn(5, 6)
        m, y = compiled(torch.empty(2, 3, device="meta"), x)
        assert m.device.type == "meta" and y.device.type == "cpu"
        torch.testing.assert_close(y, (x * 2).sin() + 1)
    (program,) = _programs(backend)
    assert program.fn is not None and program.calls == 2, program.note


def _layout(device: str) -> Layout:
    return Layout((), (), 0, torch.float32, torch.device(device), 0)


def test_the_program_device_is_a_cuda_one_when_the_graph_has_one():
    """The stream the program launches on is the current stream of this device."""
    seen = Observed()
    seen.layouts = {"a": _layout("cpu"), "b": _layout("cuda:1"), "c": _layout("cpu")}
    assert seen.device() == torch.device("cuda:1")
    seen.layouts = {"a": _layout("cpu")}
    assert seen.device() == torch.device("cpu")
    assert Observed().device() is None


def test_each_allocation_names_its_own_device_and_one_stream_serves_one_device():
    """emit.py, on steps written by hand: a buffer of a region on another device than the
    program's is allocated there; launches on two CUDA devices (one `stream` per call
    cannot serve both) are refused, so the graph keeps the old path."""
    from fuser.dynamo.program.emit import emit_program
    from fuser.dynamo.program.memory import plan_memory
    from fuser.dynamo.program.step import Step
    from fuser.dynamo.program.steps import Names

    cpu, meta = torch.device("cpu"), torch.device("meta")
    steps = [
        Step("alloc", ("a",), (), alloc=((2,), (1,), torch.float32, cpu)),
        Step("alloc", ("b",), (), alloc=((2,), (1,), torch.float32, meta)),
        Step("launch", (), ("a", "b"), "pass", device=cpu),
    ]
    names = Names({"a", "b"})
    out = emit_program("g", steps, plan_memory(steps, [], ["a", "b"]), names, [], "(a, b)", {},
                       meta, lambda args: None)  # fmt: skip
    a, b = out.fn([])
    assert a.device == cpu and b.device == meta  # `dev` is the launches' device, cpu

    on = [Step("launch", (), (), "pass", on_stream=True, device=torch.device(f"cuda:{i}"))
          for i in (0, 1)]  # fmt: skip
    with pytest.raises(NotImplementedError, match="several devices"):
        emit_program("h", on, plan_memory(on, [], []), Names(set()), [], "()", {}, cpu, None)


def test_a_call_under_another_backend_goes_the_old_way(monkeypatch):
    """The program launches the kernels its first call planned for config.backend; a
    later call under another backend (an A/B in one process, as tests/conftest.py's
    `backend` fixture does) silently kept the first backend's kernels. It goes the old way
    now, whose regions plan for the backend asked for, and comes back with the first."""
    from fuser.config import config
    from fuser.runtime import cuda_backend

    monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", not torch.cuda.is_available())
    monkeypatch.setattr(config, "backend", "triton")

    def f(x):
        return (x * 2).sin() + 1

    backend = FuserBackend(strict=True)
    compiled = torch.compile(f, backend=backend, dynamic=False)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run only without a GPU
    for _ in range(2):
        compiled(torch.randn(5, 6, device=dev))
    (program,) = _programs(backend)
    assert program.fn is not None and program.calls == 1
    (record,) = backend.captures[0].graphs[0].regions
    monkeypatch.setattr(config, "backend", "cuda")
    x = torch.randn(5, 6, device=dev)
    torch.testing.assert_close(compiled(x), f(x))
    assert program.calls == 1 and program.declined == 1
    assert "cuda" in {k.backend for k in record.fd._runtime().last.kernels.values()}
    monkeypatch.setattr(config, "backend", "triton")
    compiled(x)
    assert program.calls == 2


def test_the_plan_inlined_is_the_one_for_the_first_calls_inputs(monkeypatch):
    """The first call took each region's plan from its executor's `last`, the plan of the
    latest execute of that FusionDefinition anywhere. Regions of one definition are shared
    (fuser/dynamo/region.py), so another thread running it on other strides in between
    gave the program that thread's plan: every later call then read its input with the
    other strides. The race is simulated here: the same definition runs on a transposed
    input right after the region's own run. The plan is now looked up by the signature
    of the region's inputs."""
    from fuser.runtime.executor import FusionExecutor

    real = FusionExecutor.execute

    def execute_then_another_thread(self, inputs, backend):
        out = real(self, inputs, backend)
        other = [t.t().contiguous().t() if t.dim() == 2 else t for t in inputs]
        self._get(other, backend, None)  # what a concurrent execute leaves in `last`
        return out

    def f(x):
        return (x * 2).sin() + x.cos()

    backend = FuserBackend(strict=True)
    compiled = torch.compile(f, backend=backend, dynamic=False)
    with monkeypatch.context() as m:
        m.setattr(FusionExecutor, "execute", execute_then_another_thread)
        compiled(torch.randn(5, 6))
    (program,) = _programs(backend)
    assert program.fn is not None, program.note
    for _ in range(2):
        x = torch.randn(5, 6)
        torch.testing.assert_close(compiled(x), f(x))
    assert program.calls == 2


def test_a_backward_input_on_another_device_goes_the_old_way(monkeypatch):
    """A backward program's inputs (saved tensors, tangents) have no Dynamo guard, and its
    launches pass bare pointers: a tensor that a saved-tensor hook brought back on another
    device would be read as a device address. The program checks the device of every
    input a kernel reads and hands such a call to the old path, whose launches check."""
    from fuser.dynamo.program.emit import emit_program
    from fuser.dynamo.program.memory import plan_memory
    from fuser.dynamo.program.step import Step
    from fuser.dynamo.program.steps import Names

    # a CPU build of torch has no CUDA stream to bind; the call never gets that far here
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    cuda = torch.device("cuda", 0)
    code = "raise AssertionError('launched')"
    steps = [Step("launch", (), ("x",), code, on_stream=True, device=cuda)]
    old = []
    out = emit_program(
        "bw", steps, plan_memory(steps, ["x"], []), Names({"x"}), ["x"], "()", {"x": 0},
        cuda, lambda args: old.append(args) or "old", strides={"x": (3, 1)},
    )  # fmt: skip
    assert "x.get_device() != 0" in out.source
    x = torch.randn(4, 3)  # on the CPU: get_device() is -1
    assert out.fn([x]) == "old" and old
    forward = emit_program(
        "fw", steps, plan_memory(steps, ["x"], []), Names({"x"}), ["x"], "()", {"x": 0},
        cuda, lambda args: None,
    )  # fmt: skip
    assert "get_device" not in forward.source  # Dynamo's guards fix a forward's devices
