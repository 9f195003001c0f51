"""Odd inputs against the features that landed together (one-pass cross-entropy, the
inner-outer and outer schedulers, the aligned-start walk, CUDA graphs options, the
attention template): each test here failed before its fix, on the interpreter or the
CUDA emulator, against eager torch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fuser.backends.registry import get_backend
from fuser.frontend.fusion_definition import FusionDefinition

# CPU tensors run only where there is no GPU (Triton's interpreter); a GPU host runs these
# kernels on its GPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _softmax_of_sum(dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition("softmax_of_sum") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], dtype)
        y = fd.define_tensor([-1, -1], dtype)
        s = o.add(o.cast(x, torch.float32), o.cast(y, torch.float32))

        def rowb(v):  # noqa: ANN001, ANN202
            return o.broadcast_in_dim(v, shape=x.shape, broadcast_dims=[0])

        e = o.exp(o.sub(s, rowb(o.max(s, dims=[1]))))
        fd.add_output(o.cast(o.div(e, rowb(o.sum(e, dims=[1]))), dtype))
    return fd


def test_aligned_walk_inputs_of_different_row_strides(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Two inputs whose row strides differ by a multiple of the vector (20001 and 20009
    fp32) share the walk's shift; the Triton walk read both at the first one's rows
    (rows * 20001 into a buffer of stride 20009: wrong rows, out of bounds)."""
    b = get_backend(backend)
    monkeypatch.setattr(
        b,
        "limits",
        replace(b.limits, aligned_walk=True, aligned_walk_all_args=False, staged_walks=False),
    )
    rows, v = 5, 20001
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, v, generator=g).to(DEVICE)
    y = torch.randn(rows, v + 8, generator=g).to(DEVICE)[:, :v]
    fd = _softmax_of_sum(torch.float32)
    (out,) = fd.execute([x, y], backend=backend)
    (k,) = fd.kernels
    assert k.schedule.align_walk and len(k.plan.walk_args) == 3, k.schedule.explain()
    torch.testing.assert_close(out, torch.softmax(x + y, 1), rtol=1e-5, atol=1e-7)


def test_flag_options_take_booleans_only() -> None:
    """options={"cudagraphs": "no"} turned CUDA graphs on (a truthy string)."""
    from fuser.dynamo import FuserBackend

    backend = FuserBackend()
    for key in ("cudagraphs", "triton.cudagraphs", "strict", "check"):
        with pytest.raises(ValueError, match=f"option '{key}' takes True or False"):
            backend._with(None, {key: "no"})
    assert not backend._with(None, {"cudagraphs": False}).cudagraphs
    assert backend._with(None, {"check": True}).check


def test_attention_template_bf16_on_cpu_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """FUSER_ATTENTION=template with bf16 q/k/v on the CPU: Triton's interpreter takes a
    bf16 tl.dot's operands as integers (outputs of 1e9); SDPA keeps it, and explain
    says why."""
    import torch.nn.functional as F

    import fuser
    from fuser.config import config
    from fuser.dynamo import FuserBackend

    monkeypatch.setattr(config, "attention", "template")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g).bfloat16() for _ in range(3))

    def f(q, k, v):  # noqa: ANN001, ANN202
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    b = FuserBackend()
    qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
    got = torch.compile(f, backend=b)(qc, kc, vc)
    got.float().sum().backward()
    qe, ke, ve = (x.clone().requires_grad_() for x in (q, k, v))
    want = f(qe, ke, ve)
    want.float().sum().backward()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    for x, y in ((qc, qe), (kc, ke), (vc, ve)):
        torch.testing.assert_close(x.grad, y.grad, atol=2e-2, rtol=2e-2)
    assert "bf16 on the CPU" in str(fuser.explain(b))
    torch._dynamo.reset()


def test_fusion_name_that_is_no_identifier(backend: str) -> None:
    """A FusionDefinition named "3d col-sum" made kernels of that name: generated source
    that did not parse (Triton: SyntaxError 'invalid decimal literal')."""
    with FusionDefinition("3d col-sum (test)") as fd:
        x = fd.define_tensor([-1, -1], torch.float32)
        fd.add_output(fd.ops.sum(fd.ops.mul(x, x), dims=[0]))
    x = torch.randn(37, 5, device=DEVICE)
    (out,) = fd.execute([x], backend=backend)
    torch.testing.assert_close(out, (x * x).sum(0), rtol=1e-5, atol=1e-5)
    assert fd.name == "f_3d_col_sum__test_"
