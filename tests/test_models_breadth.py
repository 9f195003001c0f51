"""What running transformers families the suite does not cover through backend="fuser"
found, each reduced to the few ops that show it, against eager.

The families (tiny, random weights; a training step, an eval forward, greedy generate)
are benchmarks/family_configs.py's, run by benchmarks/families.py; the findings:

- Mamba's selective scan (state 8) reduced rows of 8 columns: no persistent layout put
  32 threads on them within 4 rows a block, so each row got the looped kernel's warp (a
  grid of 4096 one-warp programs, 94% of their lanes idle; 30 s a launch in Triton's
  interpreter, over 5 minutes for the tiny model's step).

test_family_training_step runs whole 1-layer models of three structurally different
families (a batch-norm CNN in training mode, an encoder-decoder, a state-space model) for
one training step against eager (~35 s on 2 cores, kernels compiled cold).
"""

from __future__ import annotations

import copy

import pytest
import torch

import fuser
from fuser.frontend.fusion_definition import FusionDefinition


def _softmax(dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition("narrow_softmax") as fd:
        x = fd.define_tensor([-1, -1], dtype)
        fd.add_output(fd.ops.cast(fd.ops.softmax(fd.ops.cast(x, torch.float32)), dtype))
    return fd


@pytest.mark.parametrize("cols", [2, 3, 8])
@pytest.mark.parametrize("rows", [37, 300])
def test_narrow_rows_share_a_warp(backend: str, rows: int, cols: int) -> None:
    """A softmax over a few columns (an MoE router's experts) puts a warp of rows in a
    block, not a warp on each row; odd row counts leave the last block part empty, and a
    non-contiguous input is read through its strides."""
    g = torch.Generator().manual_seed(rows * 100 + cols)
    x = torch.randn(rows, 2 * cols + 1, generator=g)[:, 1 : cols + 1]
    fd = _softmax(torch.float32)
    (out,) = fd.execute([x], backend=backend)
    (k,) = fd.kernels
    s = k.schedule
    assert s.kind == "inner_persistent", s.explain()
    assert s.threads_per_row * s.rows_per_block >= 32, s.explain()
    torch.testing.assert_close(out, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)


def test_narrow_rows_keep_wider_schedules() -> None:
    """Rows that 4 rows a block already fill a warp with keep their layout: the wider
    search only runs when nothing else fits."""
    fd = _softmax(torch.float32)
    (k,) = fd.compile([torch.empty(1000, 16, device="meta")], device="h100")
    assert (k.schedule.threads_per_row, k.schedule.rows_per_block) == (8, 4), k.schedule.explain()


def test_scan_state_reduction_through_compile() -> None:
    """Mamba's scan backward, reduced: a product summed over a state of 8 per (batch,
    channel, step), forward and backward against eager."""

    def scan_step(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return (torch.exp(a) * b * c[:, None, :, :]).sum(-1)

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(2, 16, 5, 8, generator=g, requires_grad=True) for _ in range(2))
    c = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    want = scan_step(a, b, c)
    grads_want = torch.autograd.grad(want.sum(), (a, b, c))
    t = fuser.trace(scan_step, a, b, c, backward=False)
    got = t.outputs
    grads = torch.autograd.grad(got.sum(), (a, b, c))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for gg, gw in zip(grads, grads_want):
        torch.testing.assert_close(gg, gw, rtol=1e-5, atol=1e-6)
    kinds = {k.schedule.kind for k in t.kernels}
    assert "inner_looped" not in kinds, t.explain()


# -- whole tiny models of structurally different families, one training step -------------
TOK = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    # a CNN whose batch norms run in training mode (batch statistics, running stats updated)
    "resnet": (
        "ResNetForImageClassification",
        "ResNetConfig",
        dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=10),
    ),
    # an encoder-decoder: cross-attention, a causal decoder, tied embeddings
    "bart": (
        "BartForConditionalGeneration",
        "BartConfig",
        dict(
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            vocab_size=128,
            max_position_embeddings=32,
            decoder_start_token_id=2,
            attn_implementation="sdpa",
            **TOK,
        ),
    ),
    # a state-space model: depthwise causal conv and the selective scan's sequential loop
    "mamba": (
        "MambaForCausalLM",
        "MambaConfig",
        dict(hidden_size=32, num_hidden_layers=1, vocab_size=128, state_size=8, **TOK),
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_training_step(family: str) -> None:
    """One forward and backward of a tiny (1-layer, random weights) transformers model
    through backend="fuser": the loss, every parameter's gradient and the batch norms'
    running statistics against eager's, from the same weights. (An MoE is left to
    benchmarks/families.py: its expert loop graph-breaks into ~28 graphs, ~100 s here.)"""
    transformers = pytest.importorskip("transformers")
    from fuser.dynamo import FuserBackend
    from fuser.suite.run import _grad_errors

    transformers.logging.set_verbosity_error()
    cls, config, fields = FAMILIES[family]
    if family == "bart":  # deterministic steps
        fields = dict(fields, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(0)
    base = getattr(transformers, cls)(getattr(transformers, config)(**fields)).train()
    g = torch.Generator().manual_seed(1)
    if family == "resnet":
        kw = {"pixel_values": torch.randn(4, 3, 32, 32, generator=g)}
        kw["labels"] = torch.randint(0, 10, (4,), generator=g)
    else:
        ids = torch.randint(3, 128, (2, 8), generator=g)
        kw = {"input_ids": ids, "labels": ids.clone()}
    runs = {}
    for impl in ("eager", "fuser"):
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        backend = FuserBackend()
        fwd = model if impl == "eager" else torch.compile(model, backend=backend)
        loss = fwd(**kw).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        runs[impl] = (loss.detach(), grads, dict(model.named_buffers()))
    (loss, grads, bufs), (want, want_grads, want_bufs) = runs["fuser"], runs["eager"]
    fused = sum(len(r.nodes) for c in backend.captures for gr in c.graphs for r in gr.fused)
    fell = [r.fallback for c in backend.captures for gr in c.graphs for r in gr.regions]
    assert fused > 0 and not [f for f in fell if f and "computes nothing" not in f], fell
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    errs = _grad_errors(grads, want_grads)
    worst = max(errs, key=errs.get)
    assert errs[worst] <= 1e-4, f"{family}: gradient of {worst} off by {errs[worst]:.3g}"
    for name, b in want_bufs.items():
        if b.is_floating_point():
            torch.testing.assert_close(bufs[name], b, rtol=1e-5, atol=1e-6, msg=name)
