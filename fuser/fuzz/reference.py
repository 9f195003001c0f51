"""The float64 references a fuser output is judged against (check.py): the fusion
evaluated op by op in float64 (as eager's roundings give it, or correctly rounded), with
every op's result moved by a few ulps to measure each output's sensitivity, and with
uncertain comparisons recorded or turned (`flip_uncertain`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fuser.frontend.registry import ENTRIES
from fuser.ir.evaluate import constant_ids, eval_node
from fuser.ir.graph import Graph, Node
from fuser.ir.ops import COMPARE, COMPOSITE, LAYOUT, REDUCE, Op

PERTURB_ULPS = {torch.float32: 16.0, torch.float16: 2.0, torch.bfloat16: 2.0}
# a comparison's operands and result, by the id of its result (`reference(record=...)`)
Operands = dict[int, list[torch.Tensor]]
# comparison results to force: (where, to what), by the id of the result
Flips = dict[int, tuple[torch.Tensor, torch.Tensor]]


def _perturbable(node: Node) -> bool:
    """Ops that compute (and may round): not the ones that only move or copy values."""
    return (
        node.op not in (Op.CONST, Op.IOTA, Op.CAST, Op.BROADCAST_IN_DIM) and node.op not in LAYOUT
    )


def _narrowing(node: Node) -> bool:
    """A cast of a float to a narrower float (float32 -> float16)."""
    if node.op != Op.CAST or not node.attr("dtype").is_float:
        return False
    src = node.inputs[0].dtype
    return src.is_float and src.itemsize > node.attr("dtype").itemsize


# ops whose GPU versions may err by an amount absolute rather than relative to the
# result (log(1 + tiny) from an approximate log2; sin/cos near their zeros), and those
# whose argument is uncertain too (sin(1e30)): the op table's `error`
ABSOLUTE_ERROR = frozenset(e.op for e in ENTRIES if e.error in ("absolute", "argument"))
MOVED_ARGUMENT = frozenset(e.op for e in ENTRIES if e.error == "argument")


def _moved(
    t: torch.Tensor,
    rel: float,
    sign: float | None,
    g: torch.Generator,
    floor: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """`t` +- rel * (|t| + floor): one sign for all (`sign`), or a random sign each."""
    if sign is None:
        s = torch.randint(0, 2, t.shape, generator=g).to(t.device) * 2.0 - 1.0
    else:
        s = torch.full_like(t, sign)
    return torch.where(t.isfinite(), t + s * rel * (t.abs() + floor), t)  # inf stays inf


def _phase_lost(
    out: torch.Tensor, arg: torch.Tensor, rel: float, sign: float | None, g: torch.Generator
) -> torch.Tensor:
    """sin or cos where the argument's uncertainty (`rel` * |arg|) spans half a period:
    any value in [-1, 1], so the run takes the extreme in its direction (+-1, or a random
    one each). One moved argument is one sample of that range, and a few runs' samples
    can all land near the answer: cos(exp(16.11)), exp 1 float32 ulp (1 rad) off eager's,
    was judged against a spread of 0.29."""
    lost = arg.isfinite() & (rel * arg.abs() >= math.pi)
    if not bool(lost.any()):
        return out
    if sign is None:
        s = torch.randint(0, 2, out.shape, generator=g).to(out.device) * 2.0 - 1.0
    else:
        s = torch.full_like(out, sign)
    return torch.where(lost, s.to(out.dtype), out)


def _eval(
    node: Node, args: list[torch.Tensor], device: torch.device, constants: frozenset[int]
) -> list[torch.Tensor]:
    outs = eval_node(node, args, device, constants)
    # ATen's var_mean and native_layer_norm (Welford) give NaN or +-inf for the mean of a
    # row holding an infinity depending on where it sits ([inf, 1] -> NaN, [1, inf] ->
    # inf, [inf] -> NaN); judge against torch.mean, which is what the mean is
    if node.op == Op.VAR_MEAN:
        x, dims = args[0], list(node.attr("dims"))
        mean = torch.mean(x, dims, keepdim=node.attr("keepdim", False))
        outs = [outs[0], torch.where(outs[1].isnan() & mean.isinf(), mean, outs[1])]
    if node.op == Op.RMS_NORM:
        # CUDA ATen's fused rms_norm of a half row holding an infinity is NaN across the
        # whole row; its definition x * rsqrt(mean(x^2) + eps) (CPU ATen's answer, CUDA's
        # for float32, and fuser's) is 0 at the finite elements: judge by the definition
        outs = [torch.where(outs[0].isnan(), _rms_norm_definition(node, args), outs[0])]
    if node.op == Op.LAYER_NORM and node.attr("return_mean_rstd"):
        x = args[0]
        mean = torch.mean(x.to(outs[1].dtype), -1, keepdim=True)
        outs = [outs[0], torch.where(outs[1].isnan() & mean.isinf(), mean, outs[1]), outs[2]]
    return outs


def _rms_norm_definition(node: Node, args: list[torch.Tensor]) -> torch.Tensor:
    x = args[0]
    wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    y = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + node.attr("eps"))
    params = dict(zip(node.attr("params"), args[1:]))
    if "weight" in params:
        y = y * params["weight"].to(wide.dtype)
    return y.to(x.dtype)


def reference(
    graph: Graph,
    inputs: Sequence[torch.Tensor],
    upcast: bool = False,
    seed: int | None = None,
    sign: float | None = None,
    rounded: bool = False,
    record: Operands | None = None,
    flips: Flips | None = None,
) -> list[torch.Tensor]:
    """`graph` evaluated op by op with ATen, as `fd.reference` (but see `_eval`).

    upcast: in float64 (casts still round, as `fd.reference(upcast=True)`).
    rounded: in float64, every result rounded to its own dtype: the correctly rounded
    op-by-op answer (CPU ATen's bf16 log_softmax is 1 ulp off it in 3% of elements).
    seed: in float64 with every op's float result moved by +-k ulps of the op's own
    dtype, and the operands of every reduction and composite moved by +-16 float32 ulps
    per element: the size of float32 accumulation error (a sum of n terms errs by
    ~eps * sum|x|, not eps * |sum|; two-pass and Welford variances differ by eps * mean^2).
    With sign -1, results below the smallest normal flush to zero (a GPU's approximate
    exp2 does). Comparisons are not moved: `judge` holds them (`held`) and turns the
    uncertain ones in runs of their own (`flip_uncertain`).
    sin and cos take their argument moved by +-16 float32 ulps (sin(1e30) is anyone's
    guess), and a float cast to a narrower float its operand (a value at a half rounding
    boundary may land on either neighbour), in the run's direction: moving a result
    instead cancels against its operand's move wherever the op decreases.
    record: filled with the operands and the result of every comparison, by the id of
    its result.
    flips: comparison results (by id) forced where the mask is set (`flip_uncertain`).
    """
    g = torch.Generator().manual_seed(seed or 0)
    wide = upcast or rounded or seed is not None
    eps32 = PERTURB_ULPS[torch.float32] * torch.finfo(torch.float32).eps
    env: dict[int, torch.Tensor] = {}
    for v, t in zip(graph.inputs, inputs):
        env[v.id] = t.double() if wide and t.is_floating_point() else t
    device = inputs[0].device if inputs else torch.device("cpu")
    constants = constant_ids(graph)
    for node in graph.nodes:
        args = [env[v.id] for v in node.inputs]
        if seed is not None and (node.op in REDUCE or node.op in COMPOSITE):
            args = [_moved(a, eps32, sign, g) if a.is_floating_point() else a for a in args]
        if seed is not None and (node.op in MOVED_ARGUMENT or _narrowing(node)):
            # the operand moves, in this run's direction: the value about to round is a
            # few float32 ulps off on a GPU (exp, division), and sin's argument too; moving
            # the result instead cancels against the operand's own move wherever the op
            # decreases (exp up then neg up; sin(exp(x)) near 323: exp up, sin up)
            args = [_moved(args[0], eps32, sign, g)]
        if wide and node.op == Op.CAST and node.attr("dtype").is_float:
            outs = [args[0].to(node.attr("dtype").torch).double()]  # keep the rounding
        else:
            outs = _eval(node, args, device, constants)
            if wide:
                outs = [o.double() if o.is_floating_point() else o for o in outs]
        if seed is not None and node.op in MOVED_ARGUMENT:
            outs = [_phase_lost(outs[0], args[0], eps32, sign, g)]
        if node.op in COMPARE:
            if flips and node.out.id in flips:
                mask, value = (t.to(outs[0].device) for t in flips[node.out.id])
                outs = [torch.where(mask, value, outs[0])]
            if record is not None:
                record[node.out.id] = [*(a.double() for a in args), outs[0]]
        if rounded:
            outs = [o.to(v.dtype.torch).double() if v.dtype.is_float else o
                    for o, v in zip(outs, node.outputs)]  # fmt: skip
        if seed is not None and _perturbable(node):
            for i, (o, v) in enumerate(zip(outs, node.outputs)):
                ulps = PERTURB_ULPS.get(v.dtype.torch)
                if ulps is None or not o.is_floating_point():
                    continue
                rel = ulps * torch.finfo(v.dtype.torch).eps
                floor = 1.0 if node.op in ABSOLUTE_ERROR else 0.0
                o = _moved(o, rel, sign, g, floor)
                if sign == -1.0:
                    o = torch.where(o.abs() < torch.finfo(v.dtype.torch).tiny, 0.0, o)
                outs[i] = o
        for v, o in zip(node.outputs, outs):
            env[v.id] = o
    outs = [env[v.id] for v in graph.outputs]
    return outs if wide else [o.to(v.dtype.torch) for o, v in zip(outs, graph.outputs)]


def widen_spread(spread: Operands, central: Operands, moved: Operands) -> None:
    """Grow `spread` (each comparison operand's largest distance from `central`) by one
    perturbed run's operands, `moved`; non-finite values do not count (NaN and inf
    placement is judged on its own)."""
    for key, operands in central.items():
        if key not in moved:
            continue
        widths = spread.setdefault(key, [torch.zeros_like(x) for x in operands[:2]])
        for i, (x, y) in enumerate(zip(operands[:2], moved[key][:2])):
            y = y.to(x.device)
            d = torch.where(x.isfinite() & y.isfinite(), (y - x).abs(), 0.0)
            widths[i] = torch.maximum(widths[i], d)


def held(decided: Operands) -> Flips:
    """Every comparison forced to the result `decided` recorded for it."""
    return {key: (torch.ones((), dtype=torch.bool), ops[2]) for key, ops in decided.items()}


def flip_uncertain(central: Operands, spread: Operands) -> Flips:
    """Where each comparison may go either way (its operands, as `central` recorded them,
    lie within their spreads (`widen_spread`) of each other), the other answer.

    The perturbed runs cannot show such a flip where both operands move together: gelu(x)
    compared with its own bf16 rounding asks which way it rounded, and when 1 + erf(x)
    cancels, float32 gelus 1% apart (eager's, fuser's) sit on either side of it.
    """
    flips = {}
    for key, operands in central.items():
        if len(operands) != 3 or key not in spread:
            continue
        a, b, result = operands
        margin = spread[key][0] + spread[key][1]
        # NaN operands: never (their comparisons are False); equal operands that no run
        # moves (gelu(x) == x once erf rounds to 1): never
        mask = ((a - b).abs() <= margin) & (margin > 0)
        if bool(mask.any()):
            flips[key] = (mask, ~result)
    return flips
