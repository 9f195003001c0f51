"""Random transformer programs: the structures models are made of, drawn whole.

A random chain of ops (ops.py, layers.py) seldom forms what fuser's graph rewrites are
written for: a norm after a residual add whose input is a matmul's rows, heads split and
merged around attention, rotary embeddings computed from positions, grouped-query heads
repeated and their gradients summed back, an lm head into a cross-entropy. Here a program
is a small decoder (or encoder) drawn with random choices:

- embeddings: token (and learned positions or none), the lm head tied to them or not;
- per layer: pre- or post-norm; LayerNorm, RMSNorm (library or written out, upcast or
  not); q, k, v from one fused projection (split) or three; grouped-query heads; rotary
  embeddings from positions (cos and sin computed in the program) or none; q/k norm;
  SDPA (causal or not) or attention written out (scores, causal mask, softmax); a GELU
  MLP or a SwiGLU one; biases or none;
- the loss: cross-entropy of the logits (upcast or not, label smoothing, ignored
  targets), returned with or without the logits.
"""

from __future__ import annotations

import random

from fuser.fuzz.programs.builder import Builder, Input, Sizes


def _norm(b: Builder, kind: str, x: str, c: int, out: str) -> list[str]:
    lines = []
    if not x.isidentifier():  # an expression (a residual add): named first
        lines.append(f"{out}_x = {x}")
        x = f"{out}_x"
    if kind == "layer":
        w, bias = b.param((c,)), b.param((c,))
        return lines + [f"{out} = F.layer_norm({x}, ({c},), {w}, {bias}, 1e-5)"]
    if kind == "rms":
        return lines + [f"{out} = F.rms_norm({x}, ({c},), {b.param((c,))}, 1e-6)"]
    w = b.param((c,))  # written out, as transformers does: upcast, rsqrt of the mean square
    return lines + [
        f"{out}_f = {x}.float()",
        f"{out}_v = {out}_f.pow(2).mean(-1, keepdim=True)",
        f"{out} = {w} * ({out}_f * torch.rsqrt({out}_v + 1e-6)).to({x}.dtype)",
    ]


def _linear(b: Builder, x: str, n_in: int, n_out: int, bias: bool, out: str) -> str:
    w = b.param((n_out, n_in))
    return f"{out} = F.linear({x}, {w}, {b.param((n_out,)) if bias else 'None'})"


def _attention(b: Builder, rng: random.Random, x: str, dims: dict, i: int) -> list[str]:
    bt, t, c, h, kv, d = dims["B"], dims["T"], dims["C"], dims["H"], dims["KV"], dims["D"]
    bias = rng.random() < 0.5
    lines = []
    if rng.random() < 0.5:  # one projection, split
        lines.append(_linear(b, x, c, (h + 2 * kv) * d, bias, f"qkv{i}"))
        lines.append(f"q{i}, k{i}, v{i} = qkv{i}.split([{h * d}, {kv * d}, {kv * d}], dim=-1)")
    else:
        lines.append(_linear(b, x, c, h * d, bias, f"q{i}"))
        lines.append(_linear(b, x, c, kv * d, bias, f"k{i}"))
        lines.append(_linear(b, x, c, kv * d, bias, f"v{i}"))
    for name, heads in (("q", h), ("k", kv), ("v", kv)):
        lines.append(f"{name}{i} = {name}{i}.view({bt}, {t}, {heads}, {d}).transpose(1, 2)")
    if rng.random() < 0.3:  # q/k norm over the head dim
        for name in ("q", "k"):
            lines += _norm(b, "rms", f"{name}{i}", d, f"{name}{i}")
    if dims["rotary"]:
        for name in ("q", "k"):
            half = d // 2
            rot = f"torch.cat((-{name}{i}[..., {half}:], {name}{i}[..., :{half}]), dim=-1)"
            lines.append(f"{name}{i} = {name}{i} * cos + {rot} * sin")
    if kv != h:
        for name in ("k", "v"):
            lines.append(f"{name}{i} = {name}{i}.repeat_interleave({h // kv}, dim=1)")
    causal = dims["causal"]
    if rng.random() < 0.6:
        lines.append(f"o{i} = F.scaled_dot_product_attention(q{i}, k{i}, v{i}, is_causal={causal})")
    else:  # written out
        lines.append(f"s{i} = (q{i} @ k{i}.transpose(-2, -1)) * {d**-0.5!r}")
        if causal:
            mask = f"torch.ones({t}, {t}, dtype=torch.bool, device=s{i}.device).triu(1)"
            lines.append(f"s{i} = s{i}.masked_fill({mask}, float('-inf'))")
        lines.append(f"o{i} = torch.softmax(s{i}.float(), dim=-1).to(q{i}.dtype) @ v{i}")
    lines.append(f"o{i} = o{i}.transpose(1, 2).reshape({bt}, {t}, {h * d})")
    lines.append(_linear(b, f"o{i}", h * d, c, bias, f"o{i}"))
    return lines


def _mlp(b: Builder, rng: random.Random, x: str, c: int, i: int) -> list[str]:
    f = rng.choice((2 * c, 3 * c + 1))
    if rng.random() < 0.5:  # GELU
        bias = rng.random() < 0.7
        act = rng.choice(("F.gelu({})", "F.gelu({}, approximate='tanh')"))
        return [
            _linear(b, x, c, f, bias, f"m{i}"),
            f"m{i} = {act.format(f'm{i}')}",
            _linear(b, f"m{i}", f, c, bias, f"m{i}"),
        ]
    return [  # SwiGLU
        _linear(b, x, c, f, False, f"g{i}"),
        _linear(b, x, c, f, False, f"u{i}"),
        _linear(b, f"F.silu(g{i}) * u{i}", f, c, False, f"m{i}"),
    ]


def draw_block_program(seed: int, sizes: Sizes) -> Builder:
    """The transformer program of `seed` (see the module docstring), its dims drawn small
    on a CPU and larger on a GPU."""
    rng = random.Random(seed)
    b = Builder(rng, seed, sizes)
    big = sizes.max_numel > 100_000
    d = rng.choice((8, 16, 32, 64) if big else (4, 8, 16))
    h = rng.choice((1, 2, 4))
    kv = rng.choice([k for k in (1, 2, 4) if h % k == 0])
    dims = dict(
        B=rng.choice((1, 2, 3)),
        T=rng.choice((1, 5, 8, 33, 128) if big else (1, 4, 7, 8)),
        H=h,
        KV=kv,
        D=d,
        C=h * d,
        V=rng.choice((37, 257, 1000) if big else (16, 33)),
        causal=rng.random() < 0.8,
        rotary=rng.random() < 0.5,
    )
    bt, t, c, v = dims["B"], dims["T"], dims["C"], dims["V"]
    ids, targets = f"x{len(b.program.inputs)}", f"x{len(b.program.inputs) + 1}"
    b.program.inputs.append(Input(ids, (bt, t), "ids", high=v))
    b.program.inputs.append(Input(targets, (bt * t,), "ids", high=v, ignore=True))
    wte = b.param((v, c))
    lines = [f"h = F.embedding({ids}, {wte})"]
    if not dims["rotary"] and rng.random() < 0.7:
        lines.append(f"h = h + {b.param((t, c))}")
    if dims["rotary"]:  # cos and sin from positions, as transformers computes them
        lines += [
            f"inv = 1.0 / (10000 ** (torch.arange(0, {d}, 2, device=h.device).float() / {d}))",
            f"freqs = torch.arange({t}, device=h.device).float()[:, None] * inv[None, :]",
            "emb = torch.cat((freqs, freqs), dim=-1)",
            "cos, sin = emb.cos()[None, None], emb.sin()[None, None]",
        ]
    pre = rng.random() < 0.8
    norm_kind = rng.choice(("layer", "rms", "rms_written"))
    for i in range(rng.choice((1, 2))):
        if pre:
            lines += _norm(b, norm_kind, "h", c, f"a{i}")
            lines += _attention(b, rng, f"a{i}", dims, i)
            lines.append(f"h = h + o{i}")
            lines += _norm(b, norm_kind, "h", c, f"n{i}")
            lines += _mlp(b, rng, f"n{i}", c, i)
            lines.append(f"h = h + m{i}")
        else:  # post-norm (BERT's order)
            lines += _attention(b, rng, "h", dims, i)
            lines += _norm(b, norm_kind, f"h + o{i}", c, "h")
            lines += _mlp(b, rng, "h", c, i)
            lines += _norm(b, norm_kind, f"h + m{i}", c, "h")
    lines += _norm(b, norm_kind, "h", c, "hf")
    head = wte if rng.random() < 0.5 else b.param((v, c))
    lines.append(f"logits = F.linear(hf, {head})")
    up = ".float()" if rng.random() < 0.5 else ""
    smooth = ", label_smoothing=0.1" if rng.random() < 0.3 else ""
    lines.append(f"loss = F.cross_entropy(logits{up}.view(-1, {v}), {targets}{smooth})")
    b.program.lines = lines
    b.program.returns = ["loss", "logits"] if rng.random() < 0.4 else ["loss"]
    return b
