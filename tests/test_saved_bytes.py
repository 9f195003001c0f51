"""What the backward keeps: the bytes a compiled training step saves between forward and
backward, held to what the backward needs (fuser/dynamo/saved.py).

Under bf16 autocast a GPT-2 block keeps each LayerNorm's float32 input with its two per-row
statistics (the input is the residual stream the forward writes anyway, so keeping it costs
no traffic; Inductor keeps the normalized value instead, as many bytes), the bf16 inputs
of its matmuls (the weights' casts among them), the attention's output and log-sum-exp, and
the MLP's pre- and post-GELU values: nothing else in float32, nothing twice. A change that
keeps more (a float32 copy where bf16 would do, the log-probabilities, a value kept in two
dtypes) fails here with the list of what is kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fuser
from fuser.dynamo.backend import FuserBackend
from fuser.dynamo.saved import SavedTensor, saved_for_backward, saved_summary
from fuser.examples.gpt2 import GPT, Block, get_config

F32, BF16 = torch.float32, torch.bfloat16


def _kept(fn: Callable[..., Any], inputs: list[torch.Tensor], *args: Any, **kwargs: Any):
    """(output, {dtype: bytes}, [(shape, dtype)]) of the tensors the step saves for the
    backward that it computed (inputs and parameters kept as they are take no memory of
    their own); a view kept twice counts once."""
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=BF16):
            out = fn(*args, **kwargs)
    given = {t.untyped_storage().data_ptr() for t in inputs}
    seen, by_dtype, listed = set(), Counter(), []
    for t in kept:
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if t.untyped_storage().data_ptr() in given or key in seen:
            continue
        seen.add(key)
        by_dtype[t.dtype] += t.numel() * t.element_size()
        listed.append((tuple(t.shape), t.dtype))
    return out, dict(by_dtype), listed


def gpt2_block_bytes(b: int, t: int, c: int, h: int) -> dict[torch.dtype, int]:
    """What one GPT-2 block keeps beyond its input and parameters, by dtype."""
    btc = b * t * c
    # float32: ln_2's input (ln_1's is the block's input), mean and rstd of both
    # LayerNorms, the attention's log-sum-exp
    f32 = 4 * (btc + 4 * b * t + b * h * t)
    # bf16: ln_1's output, q k v (one buffer), the attention's output and its [rows, C]
    # copy for c_proj, ln_2's output, c_fc's output and the GELU's (4C each): 15 BTC;
    # the weights' casts: c_attn 3C x C, c_proj C x C, c_fc and mlp.c_proj 4C x C each
    bf16 = 2 * (15 * btc + 12 * c * c)
    return {F32: f32, BF16: bf16}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_gpt2_block_keeps_the_bytes_its_backward_needs():
    """Odd sizes (C=48, three heads of 16, T=24, B=3): the kept bytes by dtype are the
    formula's, and the graph-level list (saved_for_backward) agrees with what autograd
    was handed at run time."""
    b, t, c, h = 3, 24, 48, 3
    torch.manual_seed(0)
    block = Block(get_config("tiny", n_embd=c, n_head=h, block_size=t))
    x = torch.randn(b, t, c, requires_grad=True)
    backend = FuserBackend(strict=True)
    compiled = torch.compile(block, backend=backend)
    inputs = [x, *block.parameters()]
    y, kept, listed = _kept(compiled, inputs, x)
    y.float().square().sum().backward()

    assert kept == gpt2_block_bytes(b, t, c, h), listed
    full_f32 = [s for s in listed if s == ((b, t, c), F32)]
    assert len(full_f32) == 1, listed  # ln_2's input, the residual stream after attention

    (forward,) = [g for g in backend.captures[0].graphs if g.kind == "forward"]
    saved = saved_for_backward(forward.module)
    made = Counter()
    for s in saved:
        if not s.is_input:
            made[s.dtype] += s.nbytes
    assert dict(made) == kept, saved
    # the block's input and the LayerNorms' weights: kept as they are
    assert any(s.is_input and s.shape == (b, t, c) for s in saved)
    text = fuser.explain(compiled)
    assert saved_summary(saved) in text


def test_gpt2_keeps_one_float32_activation_per_layernorm():
    """The whole model (two blocks, the tied head, one-pass cross-entropy): the float32
    activations kept are the LayerNorms' inputs, one each (5), and nothing [rows, vocab]
    is kept in float32 (the log-probabilities are recomputed, saved.py); the gradients
    match eager's within bf16 tolerance."""
    b, t, c, h, vocab = 2, 16, 32, 2, 67
    cfg = get_config("tiny", n_embd=c, n_head=h, block_size=t, vocab_size=vocab)
    torch.manual_seed(1)
    model = GPT(cfg)
    idx = torch.randint(0, vocab, (b, t))
    tgt = torch.randint(0, vocab, (b, t))
    compiled = torch.compile(model, backend=FuserBackend(strict=True))
    (_, loss), kept, listed = _kept(compiled, [idx, tgt, *model.parameters()], idx, tgt)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    assert listed.count(((b, t, c), F32)) == 2 * cfg.n_layer + 1, listed
    assert not [s for s in listed if s[1] == F32 and s[0][-1] == vocab], listed
    per_block = gpt2_block_bytes(b, t, c, h)
    # two blocks; the embeddings' sum is block 0's ln_1 input (computed, not an input)
    assert kept[F32] >= cfg.n_layer * per_block[F32] + 4 * b * t * c, kept
    assert kept[BF16] >= cfg.n_layer * per_block[BF16], kept

    model.zero_grad()
    with torch.autocast("cpu", dtype=BF16):
        _, ref = model(idx, tgt)
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=2e-2, rtol=2e-2)
    for n, p in model.named_parameters():
        scale = p.grad.abs().max().item() + 1e-6
        torch.testing.assert_close(grads[n] / scale, p.grad / scale, atol=3e-2, rtol=0, msg=n)


def test_saved_summary_counts_what_the_forward_computed():
    saved = [
        SavedTensor("w", (8,), F32, 32, True),
        SavedTensor("x", (4, 8), F32, 128, False),
        SavedTensor("y", (4, 8), BF16, 64, False),
        SavedTensor("z", (4, 8), BF16, 64, False),
    ]
    assert saved_summary(saved) == (
        "saved for the backward: 4 tensors (1 of them graph inputs); "
        "computed: 256 B (bfloat16 128 B in 2, float32 128 B in 1)"
    )
    assert saved_summary([]) == "saved for the backward: 0 tensors (0 of them graph inputs)"
    symbolic = [SavedTensor("x", (4, 8), F32, None, False)]
    assert saved_summary(symbolic).endswith("; symbolic sizes")


def test_saved_for_backward_reads_aotautograds_labels():
    """The forward graph's outputs labelled saved-for-backward, not its user outputs; a
    graph without the labels (an inference graph) keeps nothing."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm: torch.fx.GraphModule, _inputs: list) -> Any:
        graphs.append(gm)
        return gm

    backend = aot_autograd(fw_compiler=keep, bw_compiler=lambda gm, _: gm)
    f = torch.compile(lambda a, b: (a.tanh() * b).sum(), backend=backend)
    a = torch.randn(5, 3, requires_grad=True)
    b = torch.randn(5, 3)
    f(a, b).backward()
    # tanh's backward reads its output (computed), the product's b (an input)
    saved = saved_for_backward(graphs[0])
    assert sorted((s.is_input, s.shape, s.dtype, s.nbytes) for s in saved) == [
        (False, (5, 3), F32, 60),
        (True, (5, 3), F32, 60),
    ], saved
    plain = torch.fx.symbolic_trace(lambda x: x + 1)
    assert saved_for_backward(plain) == []


@pytest.mark.parametrize("partition", ["min_cut", "default"])
def test_an_input_written_after_use_is_saved_as_it_was(partition: str) -> None:
    """`w / (x * x + 1)`, then `x.mul_(0.5)`: the backward needs the x the division read, but
    the forward graph writes x in place at its end, and the partitioner saved x itself (torch
    2.13's aot_eager and Inductor return the wrong gradient). saved.save_before_mutation keeps
    a copy (found by fuser.fuzz.programs). Two calls: the second runs the call program."""
    from fuser.dynamo import FuserBackend

    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = w / (x * x + 1.0)
        x.mul_(0.5)
        return y, torch.tanh(x)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=FuserBackend(strict=True, partition=partition))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(5)
    for _ in range(2):
        x0 = torch.randn(6, 7, generator=g).to(dev)
        w = torch.randn(6, 7, generator=g).to(dev).requires_grad_()
        up = torch.randn(6, 7, generator=g).to(dev)
        x = x0.clone()
        y, t = compiled(x, w)
        (gw,) = torch.autograd.grad(y, w, up)
        torch.testing.assert_close(gw, up / (x0 * x0 + 1.0))
        torch.testing.assert_close(x, x0 * 0.5)
        torch.testing.assert_close(t, torch.tanh(x0 * 0.5))
    torch._dynamo.reset()
