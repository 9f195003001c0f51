"""The call programs (fuser/dynamo/program/) called the ways users call compiled code:
in-place ops on inputs and intermediates, outputs that alias each other or an input,
clones, views and reshapes of inputs whose layout or storage offset changes between
calls, saved-tensor hooks, user gradients of odd layouts. Every case runs at least three
times (the program is built after the first call) with new tensors each call, and is
compared with eager: outputs, gradients, the inputs' mutations and which outputs share
storage. The first tests failed before their fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fuser.dynamo.backend import FuserBackend


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _programs(backend: FuserBackend) -> dict[str, object]:
    return {g.kind: g.program for c in backend.captures for g in c.graphs if g.program}


def _tanh_softmax(x, w):
    y = (x * w).tanh()
    return (y.softmax(-1) * x.sigmoid()).sum(-1)


@pytest.mark.parametrize(
    "unpack",
    [
        pytest.param(lambda t: t[:3].clone() if t.dim() == 2 else t, id="fewer-rows"),
        pytest.param(lambda t: t.double() if t.is_floating_point() else t, id="float64"),
    ],
)
def test_saved_tensors_come_back_from_hooks_in_another_shape_or_dtype(unpack):
    """A backward program's inputs have no Dynamo guard: a saved-tensor hook may return
    them in another shape or dtype. The program checked their strides only and launched
    its kernels on them as the first call saw them: a [3, 10] tensor for a [6, 10] one
    gave gradients silently wrong (eager raises: sizes do not match), a float64 one is
    read as float32 on a GPU (eager raises, aot_eager computes it). Such a call now goes
    the old way, which plans for what it is given (and raises where eager raises)."""
    backend = FuserBackend()
    compiled = torch.compile(_tanh_softmax, backend=backend)
    g = _gen(0)
    for call in range(4):
        x, w = torch.randn(6, 10, generator=g), torch.randn(10, generator=g)
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        _tanh_softmax(xe, we).sum().backward()
        if call < 2:
            compiled(xc, wc).sum().backward()
            torch.testing.assert_close(xc.grad, xe.grad)
            continue
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            loss = compiled(xc, wc).sum()
        try:
            loss.backward()
        except RuntimeError:
            continue  # as eager: sizes that do not match
        torch.testing.assert_close(xc.grad, xe.grad)
    backward = _programs(backend)["backward"]
    assert backward.declined == 2, backward.source


# ---- cases that pass: eager's outputs, gradients, mutations and aliasing, call after call


def _at(shape: tuple[int, ...], call: int, gen: torch.Generator, grad: bool = False, skew: int = 0):
    """A new tensor each call, at storage offset 4 * call + skew of a larger buffer (the
    offset changes, the alignment stays unless skew is odd)."""
    n = 1
    for s in shape:
        n *= s
    start = 4 * call + skew
    t = torch.randn(n + start + 3, generator=gen)[start : start + n].view(shape)
    return t.detach().requires_grad_() if grad else t


def _copy(t):
    """t's storage copied, t's layout and offset kept (a leaf again if t needs grad)."""
    if not isinstance(t, torch.Tensor):
        return t
    full = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage().clone())
    c = full.as_strided(t.shape, t.stride(), t.storage_offset())
    return c.requires_grad_() if t.requires_grad else c


def _flat(x):
    if isinstance(x, (list, tuple)):
        return [y for e in x for y in _flat(e)]
    return [x]


def _shared(tensors: list) -> set[tuple[int, int]]:
    ptr = [
        t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() else None
        for t in tensors
    ]
    return {(i, j) for i, a in enumerate(ptr) for j, b in enumerate(ptr[:i]) if a and a == b}


def _same_as_eager(f, make, calls: int = 3, dynamic: bool = False, tol: float = 1e-5):
    """Call f and its compiled self on copies of make(call)'s new inputs; compare outputs
    (values and strides), the inputs after the call, which outputs and inputs share
    storage, and gradients for a random upstream gradient; then scribble over the compiled
    outputs, which must not reach a later call."""
    backend = FuserBackend()
    compiled = torch.compile(f, backend=backend, dynamic=dynamic)
    g = _gen(7)
    for call in range(calls):
        inputs = make(call, g)
        ie, ic = [_copy(t) for t in inputs], [_copy(t) for t in inputs]
        oe, oc = _flat(f(*ie)), _flat(compiled(*ic))
        where = f"call {call}"
        for a, b in zip(oe, oc):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=where)
            if a.numel() > 1:
                assert b.stride() == a.stride(), where
        for a, b in zip(ie, ic):
            torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=f"{where}: input")
        assert _shared(oc + ic) == _shared(oe + ie), where
        needs = [(a, b) for a, b in zip(oe, oc) if a.requires_grad]
        if needs:
            ups = [torch.randn(a.shape, generator=g) for a, _ in needs]
            torch.autograd.backward([a for a, _ in needs], ups)
            torch.autograd.backward([b for _, b in needs], ups)
            for a, b in zip(ie, ic):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    torch.testing.assert_close(b.grad, a.grad, atol=tol, rtol=tol, msg=where)
        with torch.no_grad():
            for t in oc:
                if t.is_floating_point() and t.numel():
                    t.mul_(1000.0).add_(7.0)
    programs = _programs(backend).values()
    assert programs and all(p.calls >= 1 for p in programs if p.fn is not None), [
        p.summary() for p in programs
    ]
    assert any(p.fn is not None for p in programs)


def _input_mutated(x, y):
    x.add_(y)
    return x * 2


def _out_argument(x, buf):
    torch.add(x, 1, out=buf)
    return buf.sin()


def _slice_assigned(x):
    y = x * 2
    y[:, 0] = x[:, 1] * 3
    return y.exp(), y


def _index_put_masked_fill(x, idx, m):
    y = x * 2
    y.index_put_((idx,), torch.ones(7))
    y.masked_fill_(m, -1.0)
    return y * x, y


def _views_with_base(x):
    y = x.exp()
    return y, y[1:], y.t(), y.view(-1)[3:9]


def _same_twice(x):
    y = x + 1
    return y, y, y * 2


def _input_and_its_views(x):
    return x, x[1:], x * 2, x.t()


def _outputs_alias_each_other(x):
    y = (x * 3).relu()
    a = y.reshape(35)
    return a, y.view(7, 5), a[2:]


def _detached_alias_mutated(x):
    y = x * 2
    y.detach().add_(1)
    return y.sin()


def _no_grad_running_stat(x, s):
    y = x.tanh()
    with torch.no_grad():
        s.mul_(0.9).add_(y.mean(0) * 0.1)
    return y * 2


def _strided_input_mutated(x):
    x[:, 0] = 1.0
    x[1:].mul_(2)
    return x.sum(0), (x * 3).exp()


def _clone_then_input_mutated(x):
    y = x.clone()
    x.mul_(2)
    return y + 1, x * 3


def _local_clone_then_mutated(x, s):
    a = x * 2
    b = a.clone()
    s.copy_(a.sum(0))
    a.add_(1)
    return b.exp(), a.sin()


def _copies_of_a_value(x):
    a = (x * 2).exp()
    # (a dropout of p=0 is a clone AOTAutograd makes; eager returns its input)
    return a, a.clone(), a.detach(), a.contiguous(), F.dropout(a, 0.0, training=True).sin()


def _segments(x, y):
    a = torch.exp(x) * 0.1
    s0 = a.sum(0)
    return a.sum(1) * 3.0 + y, s0, s0 * 2, a


def _constants(x):
    return x * 0 + 1.5, torch.ones(3) * 2, x.new_zeros(3) + 4


def _ce_with_logits(logits, t):
    z = logits * 2
    return F.cross_entropy(z, t), z, F.cross_entropy(z, t, reduction="none")


def _five_seven(call, g, grad=True):
    return [_at((5, 7), call, g, grad)]


CASES = {
    "input-mutated": (_input_mutated, lambda c, g: [_at((5, 7), c, g), _at((5, 7), c, g, skew=1)]),
    "out-argument": (_out_argument, lambda c, g: [_at((5, 7), c, g), _at((5, 7), c, g)]),
    "slice-assigned": (_slice_assigned, _five_seven),
    "index-put-masked-fill": (
        _index_put_masked_fill,
        lambda c, g: [_at((5, 7), c, g, 1), torch.tensor([0, 3]), torch.rand(5, 7) > 0.5],
    ),
    "views-with-base": (_views_with_base, _five_seven),
    "same-twice": (_same_twice, _five_seven),
    "input-and-its-views": (_input_and_its_views, _five_seven),
    "outputs-alias": (_outputs_alias_each_other, _five_seven),
    "detached-alias-mutated": (_detached_alias_mutated, lambda c, g: _five_seven(c, g, False)),
    "no-grad-running-stat": (
        _no_grad_running_stat, lambda c, g: [_at((5, 7), c, g, True), _at((7,), c, g)]
    ),
    "strided-input-mutated": (
        _strided_input_mutated,
        lambda c, g: [torch.randn(9, 12, generator=g)[1 + c : 7 + c, 2:9].t()],
    ),
    "clone-then-input-mutated": (_clone_then_input_mutated, lambda c, g: _five_seven(c, g, False)),
    "local-clone-then-mutated": (
        _local_clone_then_mutated, lambda c, g: [_at((5, 7), c, g), _at((7,), c, g)]
    ),
    "copies-of-a-value": (_copies_of_a_value, _five_seven),
    "aten-segments": (
        _segments, lambda c, g: [_at((3, 5, 7), c, g, True), _at((3, 7), c, g, True)]
    ),
    "constants": (_constants, lambda c, g: [_at((5, 3), c, g)]),
    "cross-entropy-logits-returned": (
        _ce_with_logits,
        lambda c, g: [_at((6, 11), c, g, True), torch.randint(0, 11, (6,), generator=g)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_same_as_eager_call_after_call(name):
    f, make = CASES[name]
    _same_as_eager(f, make, calls=4 if name == "constants" else 3)


def _layouts(x):
    return x.contiguous() * 2, x.clone(), x.reshape(-1), x.t().reshape(-1)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda c, g: torch.randn(9, 12)[1 + c % 2 :, 2:9][:5], id="sliced"),
        pytest.param(lambda c, g: torch.randn(7, 5, generator=g).t(), id="transposed"),
        pytest.param(lambda c, g: torch.randn(1, 7, generator=g).expand(5, 7), id="expanded"),
        pytest.param(lambda c, g: torch.randn(0, 7, generator=g), id="empty"),
    ],
)  # fmt: skip
def test_copies_and_reshapes_of_inputs_in_odd_layouts(make):
    _same_as_eager(_layouts, lambda c, g: [make(c, g)])


def test_channels_last_and_mixed_requires_grad():
    def f(x, w, b):
        y = (x * w + b).relu()
        return y.reshape(2, -1), y.contiguous(), x.clone(), (x - b).exp()

    def make(c, g):
        x = torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last)
        return [x.requires_grad_(), _at((5,), c, g, True), _at((5,), c, g)]

    _same_as_eager(f, make)


def test_dynamic_sizes_come_back():
    def f(x):
        y = (x * 2).exp()
        return y.reshape(-1), y[1:], y.softmax(-1), y.t().contiguous()

    _same_as_eager(f, lambda c, g: [_at((4 + c % 2, 7), c, g, True)], calls=6, dynamic=True)


def test_batch_norm_running_stats():
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm1d(7)
    module = torch.nn.BatchNorm1d(7)
    module.load_state_dict(eager.state_dict())
    compiled = torch.compile(module, backend=FuserBackend())
    g = _gen(3)
    for call in range(4):
        x = _at((6, 7), call, g)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        oe, oc = eager(xe), compiled(xc)
        up = torch.randn(6, 7, generator=g)
        oe.backward(up)
        oc.backward(up)
        torch.testing.assert_close(oc, oe)
        torch.testing.assert_close(xc.grad, xe.grad)
        torch.testing.assert_close(module.weight.grad, eager.weight.grad)
        for name, buf in eager.named_buffers():
            torch.testing.assert_close(getattr(module, name), buf, msg=name)


def _unpack_column_major(t):
    return t.t().contiguous().t() if t.dim() == 2 else t.clone()


def _unpack_misaligned(t):
    if not t.is_floating_point():
        return t
    return torch.empty(t.numel() + 5, dtype=t.dtype)[5:].view(t.shape).copy_(t)


def _unpack_padded_rows(t):
    if t.dim() != 2:
        return t
    return torch.empty(t.shape[0], t.shape[1] + 3, dtype=t.dtype)[:, : t.shape[1]].copy_(t)


@pytest.mark.parametrize(
    "unpack",
    [
        pytest.param(_unpack_column_major, id="column-major"),
        pytest.param(_unpack_misaligned, id="misaligned"),
        pytest.param(_unpack_padded_rows, id="padded-rows"),
        pytest.param(None, id="save-on-cpu"),
    ],
)
def test_saved_tensors_in_other_layouts_every_other_call(unpack):
    compiled = torch.compile(_tanh_softmax, backend=FuserBackend())
    g = _gen(5)
    for call in range(4):
        x, w = _at((6, 10), call, g), _at((10,), call, g)
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        _tanh_softmax(xe, we).sum().backward()
        if call % 2 == 0:
            loss = compiled(xc, wc).sum()
        elif unpack is None:
            with torch.autograd.graph.save_on_cpu():
                loss = compiled(xc, wc).sum()
        else:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
                loss = compiled(xc, wc).sum()
        loss.backward()
        torch.testing.assert_close(xc.grad, xe.grad)
        torch.testing.assert_close(wc.grad, we.grad)


def _two_outputs(x, w):
    a = (x * w).tanh()
    return a.sum(0) * 2, a.softmax(-1) * x.exp()


def _transposed(s, g):
    return torch.randn(s[::-1], generator=g).permute(*range(len(s))[::-1])


def _expanded(s, g):
    return torch.randn((), generator=g).expand(s)


def _misaligned(s, g):
    return torch.randn(70, generator=g)[1 : 1 + s.numel()].view(s)


@pytest.mark.parametrize("upstream", [_transposed, _expanded, _misaligned])
def test_user_gradients_of_odd_layouts_twice_with_retain_graph(upstream):
    compiled = torch.compile(_two_outputs, backend=FuserBackend())
    g = _gen(6)
    for call in range(3):
        x, w = _at((6, 10), call, g), _at((10,), call, g)
        grads = []
        for fn in (_two_outputs, compiled):
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            outs = fn(xx, ww)
            ups = [upstream(o.shape, _gen(call)) for o in outs]
            torch.autograd.backward(outs, ups, retain_graph=True)
            torch.autograd.backward(outs, [u.contiguous() for u in ups])
            grads.append((xx.grad, ww.grad))
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want)


def test_gradients_of_one_output_or_the_other():
    compiled = torch.compile(_two_outputs, backend=FuserBackend())
    g = _gen(8)
    for call in range(6):
        x, w = _at((6, 10), call, g), _at((10,), call, g)
        grads = []
        for fn in (_two_outputs, compiled):
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            a, b = fn(xx, ww)
            which = [a, b, (a, b)][call % 3]
            ups = [torch.randn(t.shape, generator=_gen(call)) for t in _flat(which)]
            torch.autograd.backward(_flat(which), ups)
            grads.append((xx.grad, ww.grad))
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want)


def test_an_output_fed_back_as_the_next_input():
    def f(x):
        x.mul_(0.5)
        return x + 1

    compiled = torch.compile(f, backend=FuserBackend())
    xe = torch.randn(6, 5, generator=_gen(9))
    xc = xe.clone()
    for _ in range(5):
        xe, xc = f(xe), compiled(xc)
    torch.testing.assert_close(xc, xe)
