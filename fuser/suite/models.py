"""The suite's models: twelve families from `transformers`, built from a configuration with
random weights (no download), at two sizes.

"tiny": 2 layers, hidden 64, for a CPU (CI's parity check). "full": 12 layers, hidden 768
(1024 for the encoders' T=512), roughly 100-350M parameters, trained at B=8, T=1024 (the
encoders at T=512, the ViT at 224x224 and B=64). Decoders use grouped-query attention
where the family has it (4 key-value heads of 12).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SIZES = ("tiny", "full")
# the configuration fields the families name their dropout probabilities by
DROPOUTS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "dropout_rate",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout",
    "attention_dropout",
)


@dataclass(frozen=True)
class Family:
    """One model family: its transformers class, its kind and its configuration."""

    name: str
    cls: str  # the transformers class
    kind: str  # "decoder" (causal LM), "encoder" (masked LM), "seq2seq" or "vision"
    config: str  # the transformers configuration class
    sizes: Callable[[bool], dict[str, Any]]  # tiny -> configuration fields


def _llama_like(tiny: bool) -> dict[str, Any]:
    if tiny:  # head_dim 64 as at full size: the rotary kernels' shapes are real ones
        return dict(
            hidden_size=128,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=256,
            max_position_embeddings=64,
        )
    return dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=1024,
    )


def _gemma(tiny: bool) -> dict[str, Any]:
    return dict(_llama_like(tiny), head_dim=64)


def _phi(tiny: bool) -> dict[str, Any]:
    out = _llama_like(tiny)
    out["num_key_value_heads"] = out["num_attention_heads"]
    return out


def _neox(tiny: bool) -> dict[str, Any]:
    out = _phi(tiny)
    out["intermediate_size"] = 4 * out["hidden_size"]
    return out


def _gpt2(tiny: bool) -> dict[str, Any]:
    if tiny:
        tokens = dict(bos_token_id=0, eos_token_id=0)
        return dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, **tokens)
    return dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)


def _opt(tiny: bool) -> dict[str, Any]:
    if tiny:
        return dict(
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=256,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
        )
    return dict(
        hidden_size=768,
        ffn_dim=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        vocab_size=50272,
        max_position_embeddings=1024,
        word_embed_proj_dim=768,
    )


def _bert(tiny: bool) -> dict[str, Any]:
    if tiny:
        return dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=256,
            max_position_embeddings=64,
        )
    return dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=12,
        num_attention_heads=16,
        vocab_size=30522,
        max_position_embeddings=512,
    )


def _t5(tiny: bool) -> dict[str, Any]:
    tokens = dict(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    if tiny:
        return dict(
            d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=256, **tokens
        )
    return dict(
        d_model=768, d_ff=2048, num_layers=12, num_heads=12, d_kv=64, vocab_size=32128, **tokens
    )


def _vit(tiny: bool) -> dict[str, Any]:
    if tiny:
        return dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
            num_labels=10,
        )
    return dict(
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        image_size=224,
        patch_size=16,
        num_labels=1000,
    )


FAMILIES = {
    f.name: f
    for f in (
        Family("gpt2", "GPT2LMHeadModel", "decoder", "GPT2Config", _gpt2),
        Family("llama", "LlamaForCausalLM", "decoder", "LlamaConfig", _llama_like),
        Family("mistral", "MistralForCausalLM", "decoder", "MistralConfig", _llama_like),
        Family("qwen2", "Qwen2ForCausalLM", "decoder", "Qwen2Config", _llama_like),
        Family("gemma", "GemmaForCausalLM", "decoder", "GemmaConfig", _gemma),
        Family("phi", "PhiForCausalLM", "decoder", "PhiConfig", _phi),
        Family("gpt-neox", "GPTNeoXForCausalLM", "decoder", "GPTNeoXConfig", _neox),
        Family("opt", "OPTForCausalLM", "decoder", "OPTConfig", _opt),
        Family("bert", "BertForMaskedLM", "encoder", "BertConfig", _bert),
        Family("roberta", "RobertaForMaskedLM", "encoder", "RobertaConfig", _bert),
        Family("t5", "T5ForConditionalGeneration", "seq2seq", "T5Config", _t5),
        Family("vit", "ViTForImageClassification", "vision", "ViTConfig", _vit),
    )
}


def shape(family: Family, size: str, device: str) -> tuple[int, int]:
    """(batch, sequence length or image side) of the suite's step for `family`."""
    if size == "tiny":
        return (2, 32) if family.kind == "vision" else (2, 16)
    if family.kind == "vision":
        return 64, 224
    return (8, 512) if family.kind in ("encoder", "seq2seq") else (8, 1024)


def build(name: str, size: str, device: str, seed: int = 0) -> torch.nn.Module:
    """The model `name` at `size` on `device`, with the seed's random weights."""
    import transformers

    transformers.logging.set_verbosity_error()  # its notes on random configurations
    if name not in FAMILIES:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(FAMILIES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    family = FAMILIES[name]
    fields = family.sizes(size == "tiny")
    if family.kind != "vision":
        fields["attn_implementation"] = "sdpa"
    if family.kind == "encoder" and "max_position_embeddings" in fields:
        fields["max_position_embeddings"] += 2  # RoBERTa's positions start after padding
    config = getattr(transformers, family.config)(**fields)
    for drop in DROPOUTS:  # deterministic steps: parity step by step
        if hasattr(config, drop):
            setattr(config, drop, 0.0)
    torch.manual_seed(seed)
    return getattr(transformers, family.cls)(config).to(device)


def batch(
    name: str,
    size: str,
    model: torch.nn.Module,
    device: str,
    seed: int,
    dims: tuple[int, int] | None = None,
) -> dict:
    """The keyword arguments of one training step's forward (labels included); `dims`:
    (batch, sequence length or image side) in place of the suite's own."""
    family = FAMILIES[name]
    b, n = dims or shape(family, size, device)
    g = torch.Generator().manual_seed(seed)
    if family.kind == "vision":
        pixels = torch.randn(b, 3, n, n, generator=g).to(device)
        labels = torch.randint(0, model.config.num_labels, (b,), generator=g).to(device)
        return {"pixel_values": pixels, "labels": labels}
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (b, n), generator=g).to(device)
    # A training step has no use for a KV cache, yet transformers builds one by default.
    # OPT's cache is guarded layer by layer (`layers[i].is_initialized`): Dynamo compiles
    # each layer anew, reaches its recompile limit (8) and runs the last layers eagerly,
    # whichever the backend.
    if family.kind == "seq2seq":
        labels = torch.randint(0, vocab, (b, n), generator=g).to(device)
        return {"input_ids": ids, "labels": labels, "use_cache": False}
    out = {"input_ids": ids, "labels": ids.clone()}  # decoders shift the labels themselves
    return {**out, "use_cache": False} if family.kind == "decoder" else out
