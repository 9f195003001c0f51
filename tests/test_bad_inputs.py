"""Bad inputs to fd.execute / reference / compile / bind and to a compiled kernel's launch:
each is an InputError naming the input (position and name) and what was expected. Also:
execute on inputs that require grad warns once, and a kernel's repr is one short line."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from fuser import FusionDefinition
from fuser.errors import FuserError, InputError
from fuser.runtime import cuda_backend, triton_backend
from fuser.runtime.kernel import Kernel

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor"),  # deprecated in torch
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
]

F16, F32 = torch.float16, torch.float32
ROWS, COLS = 29, 37  # odd sizes; the rows are symbolic, the columns static
ENTRIES = ("bind", "reference", "compile", "execute")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _fd(name: str = "scaled") -> FusionDefinition:
    """float32(x[rows, 37]) * w[37]: two inputs of different dtypes and ranks."""
    with FusionDefinition(name) as fd:
        x = fd.define_tensor([-1, COLS], F16)
        w = fd.define_tensor([-1], F32)
        wb = fd.ops.broadcast_in_dim(w, shape=x.shape, broadcast_dims=[1])
        fd.add_output(fd.ops.mul(fd.ops.cast(x, F32), wb))
    return fd


def _good(seed: int = 0, device: str = DEVICE) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(ROWS, COLS, generator=g).to(F16), torch.randn(COLS, generator=g)
    return x.to(device), w.to(device)


def expect(fn: Callable[[], object], *words: str) -> str:
    with pytest.raises(InputError) as info:
        fn()
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message lacks {missing}: {message!r}"
    assert "\n" not in message and len(message) < 400, message
    return message


# name: (inputs made from good x, w; words the message has; the entries it is an error for)
CASES: dict[str, tuple[Callable, list[str], tuple[str, ...]]] = {
    "numpy-array": (
        lambda x, w: [x.cpu().numpy(), w],
        ["input 0 (t0)", "numpy.ndarray", "not a tensor", "expected a torch.float16 tensor"],
        ENTRIES,
    ),
    "list-of-numbers": (
        lambda x, w: [x, w.tolist()],
        ["input 1 (t1)", f"list of {COLS}", "not a tensor", "expected a torch.float32 tensor"],
        ENTRIES,
    ),
    "python-scalar": (
        lambda x, w: [x, 0.5],
        ["input 1 (t1)", "float (0.5)", "not a tensor", "expected a torch.float32 tensor"],
        ENTRIES,
    ),
    "single-tensor": (
        lambda x, w: x,
        ["list of tensors", "(t0, t1)", f"tensor of shape [{ROWS}, {COLS}]", "[x]"],
        ENTRIES,
    ),
    "none": (lambda x, w: None, ["list of tensors", "(t0, t1)", "got None"], ENTRIES),
    "too-few": (lambda x, w: [x], ["defines 2 inputs (t0, t1)", "got 1", "t1"], ENTRIES),
    "too-many": (lambda x, w: [x, w, w], ["defines 2 inputs (t0, t1)", "got 3"], ENTRIES),
    "wrong-dtype": (
        lambda x, w: [x.float(), w],
        ["input 0 (t0)", "dtype torch.float32", "expected torch.float16"],
        ENTRIES,
    ),
    "complex-dtype": (
        lambda x, w: [x, w.to(torch.complex64)],
        ["input 1 (t1)", "dtype torch.complex64", "expected torch.float32"],
        ENTRIES,
    ),
    "quantized-dtype": (
        lambda x, w: [x, torch.quantize_per_tensor(w.cpu(), 0.1, 0, torch.qint8)],
        ["input 1 (t1)", "dtype torch.qint8", "expected torch.float32"],
        ENTRIES,
    ),
    "wrong-rank": (
        lambda x, w: [x, x.float()],
        ["input 1 (t1)", "rank 2", "expected rank 1", "torch.float32 tensor of shape [?]"],
        ENTRIES,
    ),
    "static-size": (
        lambda x, w: [x[:, 1:], w],
        ["input 0 (t0)", f"size {COLS - 1} at dim 1", f"expected {COLS}"],
        ENTRIES,
    ),
    "sparse-coo": (
        lambda x, w: [x.to_sparse(), w],
        ["input 0 (t0)", "layout torch.sparse_coo", "expected a dense (torch.strided)"],
        ENTRIES,
    ),
    "sparse-coo-1d": (
        lambda x, w: [x, w.to_sparse()],
        ["input 1 (t1)", "layout torch.sparse_coo", "expected a dense (torch.strided)"],
        ENTRIES,
    ),
    "sparse-csr-2d": (
        lambda x, w: [x.to_sparse_csr(), w],
        ["input 0 (t0)", "layout torch.sparse_csr", "expected a dense (torch.strided)"],
        ENTRIES,
    ),
    "two-devices": (
        lambda x, w: [x, w.to("meta")],
        ["input 1 (t1) is on meta", f"input 0 (t0) is on {DEVICE}", "expected all inputs on one"],
        ("bind", "reference", "compile"),
    ),
    # compile plans from meta tensors (and reference evaluates them); execute needs data
    "meta": (
        lambda x, w: [x.to("meta"), w.to("meta")],
        ["input 0 (t0)", "meta device", "execute runs on real tensors"],
        ("execute",),
    ),
}
PARAMS = [(e, c) for c, (_, _, entries) in CASES.items() for e in entries]


@pytest.mark.parametrize("entry,case", PARAMS, ids=[f"{e}-{c}" for e, c in PARAMS])
def test_bad_inputs_name_the_input(entry: str, case: str) -> None:
    make, words, _ = CASES[case]
    fd = _fd()
    expect(lambda: getattr(fd, entry)(make(*_good())), f"{entry}:", *words)


def test_a_warm_cache_still_checks_inputs() -> None:
    """After a run, inputs that match its plan's shapes (a meta tensor, a sparse one) are
    refused, not run on that plan; a tuple is as good as a list."""
    fd = _fd()
    x, w = _good(1)
    (want,) = fd.reference([x, w])
    torch.testing.assert_close(fd.execute([x, w])[0], want)
    torch.testing.assert_close(fd.execute((x, w))[0], want)
    for make, words, entries in CASES.values():
        if "execute" in entries:
            expect(lambda make=make: fd.execute(make(x, w)), "execute:", *words)
    torch.testing.assert_close(fd.execute([x, w])[0], want)


# -- a device this process cannot run the backend on ------------------------------------
def test_cpu_tensors_in_a_process_running_triton_on_the_gpu(monkeypatch) -> None:
    """(Without a GPU: as if one were there.)"""
    kernel, _, args, _ = _kernel_args()
    args = [a.cpu() for a in args]
    x, w = _good(2, "cpu")
    monkeypatch.setattr(triton_backend, "use_interpreter", lambda: False)
    expect(
        lambda: _fd().execute([x, w], backend="triton"),
        "execute: input 0 (t0) is on cpu",
        "runs Triton on the GPU",
        "TRITON_INTERPRET=1",
    )
    expect(
        lambda: kernel.launch(args),
        f"kernel {kernel.name}: the arguments are on cpu",
        "runs Triton on the GPU",
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cpu_tensors_for_the_cuda_backend_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setattr(cuda_backend, "EMULATE_ON_CPU", False)
    expect(
        lambda: _fd().execute(list(_good(3)), backend="cuda"),
        "execute: input 0 (t0) is on cpu",
        "backend='cuda' cannot run here: torch sees no CUDA GPU",
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_and_cuda_tensors(monkeypatch) -> None:
    x, w = _good(4, "cpu")
    for entry in ENTRIES:
        expect(
            lambda entry=entry: getattr(_fd(), entry)([x, w.cuda()]),
            f"{entry}: input 1 (t1) is on cuda:0 but input 0 (t0) is on cpu",
        )
    fd = _fd()
    fd.execute([x.cuda(), w.cuda()])
    (kernel,) = fd.kernels
    # a kernel compiled for the GPU, given CPU tensors, or CPU and GPU ones
    expect(lambda: kernel.launch(_args(kernel, x, w)), "the arguments are on cpu")
    args = _args(kernel, x.cuda(), w.cuda())
    i = next(i for i, a in enumerate(kernel.spec.args) if a.is_output)
    args[i] = args[i].cpu()
    out = kernel.spec.args[i].name
    expect(lambda: kernel.launch(args), f"({out}, output) is on cpu but argument 0 is on cuda:0")
    monkeypatch.setattr(triton_backend, "use_interpreter", lambda: True)
    expect(
        lambda: _fd().execute([x.cuda(), w.cuda()]),
        "execute: input 0 (t0) is on cuda:0",
        "Triton's CPU interpreter",
    )


# -- a compiled kernel's launch ---------------------------------------------------------
def _kernel_args() -> tuple[Kernel, dict[str, int], list[torch.Tensor], torch.Tensor]:
    """A compiled kernel, where its arguments t0, t1 and out are, good arguments, and the
    output they give."""
    fd = _fd()
    x, w = _good(5)
    (want,) = fd.execute([x, w])
    (kernel,) = fd.kernels
    at = {("out" if a.is_output else a.name): i for i, a in enumerate(kernel.spec.args)}
    assert sorted(at) == ["out", "t0", "t1"], at
    return kernel, at, _args(kernel, x, w), want


def _args(kernel: Kernel, x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """The kernel's arguments in its order: the inputs, and an output to write."""
    given = {"t0": x, "t1": w}
    out = torch.empty(ROWS, COLS, device=x.device)
    return [given.get(a.name, out) for a in kernel.spec.args]


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """x's values at a pointer 2 bytes past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 8, dtype=x.dtype, device=x.device)
    start = (1 - buf.data_ptr() // 2) % 8
    out = buf[start : start + x.numel()].view(x.shape).copy_(x)
    assert out.data_ptr() % 16 == 2
    return out


# name: (the argument it replaces, the bad value made from the good one, words)
LAUNCH_CASES: dict[str, tuple[str, Callable, list[str]]] = {
    "numpy-array": ("t0", lambda t: t.cpu().numpy(), ["numpy.ndarray", "not a tensor", "float16"]),
    "list-of-numbers": ("t1", lambda t: t.tolist(), ["list", "not a tensor", f"shape [{COLS}]"]),
    "wrong-dtype": ("t1", lambda t: t.double(), ["torch.float64", "expected a torch.float32"]),
    "wrong-shape": ("out", lambda t: t[1:], [f"[{ROWS - 1}, {COLS}]", f"[{ROWS}, {COLS}]"]),
    "sparse": ("t0", lambda t: t.to_sparse(), ["layout torch.sparse_coo", "expected"]),
    "meta": ("t1", lambda t: t.to("meta"), ["meta device"]),
    "misaligned": ("t0", _misaligned, ["aligned to 2 bytes", "compiled for 16"]),
    "strided-output": (
        "out",
        lambda t: torch.empty(COLS, ROWS, device=t.device).t(),
        ["not contiguous"],
    ),
}


@pytest.mark.parametrize("case", LAUNCH_CASES)
def test_kernel_launch_checks_its_arguments(case: str) -> None:
    kernel, at, args, want = _kernel_args()
    name, make, words = LAUNCH_CASES[case]
    i = at[name]
    bad = [make(a) if j == i else a for j, a in enumerate(args)]
    role = "output" if name == "out" else "input"
    head = f"kernel {kernel.name}: argument {i} ({kernel.spec.args[i].name}, {role})"
    expect(lambda: kernel.launch(bad), head, *words)
    kernel.launch(args)  # the good arguments still run
    torch.testing.assert_close(args[at["out"]], want)


def test_kernel_launch_takes_a_list_of_its_arguments() -> None:
    kernel, at, args, _ = _kernel_args()
    names = ", ".join(f"{a.name} ({'out' if a.is_output else 'in'})" for a in kernel.spec.args)
    head = f"kernel {kernel.name}: launch takes a list of 3 tensors ({names})"
    expect(lambda: kernel.launch(args[0]), head, f"got a {args[0].dtype} tensor")
    expect(lambda: kernel.launch(args[:2]), head, "got 2")


# -- inputs that require grad -----------------------------------------------------------
def test_execute_warns_once_when_inputs_require_grad() -> None:
    """No autograd graph: the outputs do not require grad; the warning says so once per
    FusionDefinition and points to torch.compile."""
    x, w = _good(6)
    w = w.requires_grad_()
    fd = _fd("graded")
    (want,) = fd.reference([x, w.detach()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [fd.execute([x, w])[0] for _ in range(3)]
    messages = [str(c.message) for c in caught if issubclass(c.category, UserWarning)]
    assert len(messages) == 1, messages
    for word in ("graded", "input 1 (t1) requires grad", 'backend="fuser"', "torch.compile"):
        assert word in messages[0], messages[0]
    grads = [c for c in caught if "requires grad" in str(c.message)]
    assert grads[0].filename == __file__  # points at the caller
    for out in outs:
        assert not out.requires_grad
        torch.testing.assert_close(out, want)
    # once per FusionDefinition: another one warns again; none under no_grad
    with pytest.warns(UserWarning, match="requires grad"):
        _fd().execute([x, w])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*requires grad")
        with torch.no_grad():
            _fd().execute([x, w])
        _fd().execute([x, w.detach()])


# -- the kernel object ------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_kernel_repr_is_one_short_line(backend: str) -> None:
    fd = _fd("a_fusion_with_a_long_name_for_its_kernels")
    (kernel,) = fd.compile(list(_good(7)), "h100", backend)
    text = repr(kernel)
    assert "\n" not in text and len(text) < 200, text
    for word in (kernel.name, backend, kernel.schedule.kind):
        assert word in text, text
    assert kernel.source.count("\n") > 10  # the source is behind .source


def test_kernel_attributes_have_docstrings() -> None:
    doc = Kernel.__doc__ or ""
    public = ["spec", "schedule", "source", "backend", "name", "shapes", "arg_plan"]
    public += ["workspaces", "workspace_dtypes"]
    missing = [a for a in public if f"{a}:" not in doc]
    assert not missing, f"Kernel's docstring does not describe {missing}"
    for method in ("launch", "launch_unchecked", "resources", "explain", "name"):
        assert getattr(Kernel, method).__doc__, method
    assert issubclass(InputError, FuserError)


@pytest.mark.parametrize("value", [torch.tensor(0.5), torch.randn(3, 4)])
def test_a_cpu_input_on_a_gpu_machine_is_named(monkeypatch, value: torch.Tensor) -> None:
    """On a machine with a GPU, a CPU input keeps its region ATen, visibly; a CPU scalar
    tensor (a step counter, a scale) is named as such, not taken for a CPU model."""
    from torch import fx

    from fuser.dynamo import context
    from fuser.dynamo.context import LowerCtx, NotLowerable

    monkeypatch.setattr(context, "use_interpreter", lambda: False)
    graph = fx.Graph()
    node = graph.placeholder("scale")
    node.meta["val"] = value
    ctx = LowerCtx(FusionDefinition("region"))  # the check comes before any definition
    with pytest.warns(UserWarning) as seen, pytest.raises(NotLowerable) as info:
        ctx.define_input(node)
    text = str(info.value)
    assert str(seen[0].message).endswith(text)
    if value.dim() == 0:
        assert "input scale is a CPU scalar tensor" in text and "Python number" in text
    else:
        assert "move the model and inputs to cuda" in text
