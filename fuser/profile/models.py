"""The training steps `python -m fuser.profile` profiles: a model, a batch, a backend.

Models: the project's GPT-2 (fuser.examples.gpt2: gpt2 is its 124M configuration,
gpt2-small and gpt2-tiny smaller ones) and models from `transformers` built from a
configuration, with random weights and no download (llama-125m: LlamaForCausalLM of
hidden 768, 12 layers, 12 heads, MLP 2048, vocabulary 32000; hf-gpt2: GPT2LMHeadModel
at GPT-2's 124M; llama-tiny, hf-gpt2-tiny for a CPU); and every family of the model suite
as `suite:<family>` (its full size, at the suite's batch and length unless `--batch` or
`--seq` say otherwise) or `suite:<family>-tiny`. As in benchmarks/gpt2_bench.py: on a
GPU the forward runs under bf16 autocast and AdamW is the fused one; every backend starts
from the same weights (one seed) and trains on the same batch.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from fuser.examples.gpt2 import GPT, get_config
from fuser.suite import models as suite
from fuser.suite.run import compiled

MODELS = (
    ("gpt2", "gpt2-small", "gpt2-tiny", "llama-125m", "llama-tiny", "hf-gpt2", "hf-gpt2-tiny")
    + tuple(f"suite:{name}" for name in suite.FAMILIES)
    + tuple(f"suite:{name}-tiny" for name in suite.FAMILIES)
)
BACKENDS = ("fuser", "inductor", "eager")


def _hf_config(name: str, seq: int) -> Any:
    import transformers as tf

    tiny = name.endswith("tiny")
    if name.startswith("llama"):
        size = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12)
        size.update(num_attention_heads=12, num_key_value_heads=12, vocab_size=32000)
        if tiny:
            size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
            size.update(num_attention_heads=4, num_key_value_heads=4, vocab_size=256)
        kw = dict(size, max_position_embeddings=max(seq, 64), tie_word_embeddings=False)
        kw.update(attn_implementation="sdpa")
        return tf.LlamaForCausalLM, tf.LlamaConfig(**kw)
    kw = dict(n_positions=max(seq, 64), attn_implementation="sdpa")
    if tiny:
        kw.update(n_embd=64, n_layer=2, n_head=4, vocab_size=256)
    return tf.GPT2LMHeadModel, tf.GPT2Config(**kw)


def build(name: str, seq: int, device: str, seed: int = 0) -> tuple[torch.nn.Module, int, str]:
    """(model on `device`, vocabulary size, a one-line description)."""
    torch.manual_seed(seed)
    if name.startswith("gpt2"):
        cfg = get_config({"gpt2": "124m"}.get(name, name.removeprefix("gpt2-")))
        model = GPT(cfg).to(device)
        return model, cfg.vocab_size, f"GPT-2 {name} (fuser.examples.gpt2)"
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
    cls, cfg = _hf_config(name, seq)
    model = cls(cfg).to(device)
    return model, cfg.vocab_size, f"{cls.__name__} {name} (transformers, from a config)"


def _loss(model: Any, x: torch.Tensor, y: torch.Tensor, hf: bool) -> torch.Tensor:
    if hf:
        return model(input_ids=x, labels=x).loss  # transformers shifts the labels itself
    return model(x, y)[1]


PARAM_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def training_step(
    name: str,
    backend: str,
    batch: int | None,
    seq: int | None,
    device: str,
    seed: int = 0,
    param_dtype: str = "fp32",
) -> tuple[Callable[[], None], str]:
    """A closure running one training step of `name` compiled by `backend`, and a title.
    `batch`, `seq`: None for the default (a suite model's own shape; else 16 x 1024 on a
    GPU, 2 x 8 on a CPU). `param_dtype` "bf16": the parameters themselves in bf16
    (pure-bf16 training, and what FSDP2's mixed precision hands the compiled blocks),
    still under autocast."""
    torch._dynamo.reset()  # each backend compiles from scratch and frees the last one's
    gc.collect()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
    suite_kwargs = None
    if name.startswith("suite:"):  # the suite's own model, size and batch
        family = name.removeprefix("suite:").removesuffix("-tiny")
        size = "tiny" if name.endswith("-tiny") else "full"
        b, n = suite.shape(suite.FAMILIES[family], size, device)
        batch, seq = batch or b, seq or n
        model = suite.build(family, size, device, seed)
        suite_kwargs = suite.batch(family, size, model, device, seed + 1, dims=(batch, seq))
        vocab, what = 0, f"{type(model).__name__} {name} (transformers, the suite's {size} size)"
    else:
        batch, seq = batch or (16 if cuda else 2), seq or (1024 if cuda else 8)
        model, vocab, what = build(name, seq, device, seed)
    if param_dtype not in PARAM_DTYPES:
        raise ValueError(f"param_dtype={param_dtype!r}; expected one of {list(PARAM_DTYPES)}")
    model = model.to(PARAM_DTYPES[param_dtype])
    step_model, _ = compiled(model, backend)
    opt = torch.optim.AdamW(
        model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda
    )
    if suite_kwargs is None:
        g = torch.Generator().manual_seed(seed + 1)
        idx = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        x, y = idx[:, :-1].to(device), idx[:, 1:].to(device)
    hf = not name.startswith("gpt2")

    def step() -> None:
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
            if suite_kwargs is not None:
                loss = step_model(**suite_kwargs).loss
            else:
                loss = _loss(step_model, x, y, hf)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    amp = "bf16 autocast, fused AdamW" if cuda else "fp32, AdamW"
    if param_dtype != "fp32":
        amp += f", {param_dtype} parameters"
    return step, f"{what}, B={batch} T={seq}, {amp}"
