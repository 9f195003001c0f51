"""check_index: an index-like value checked against its range, in one place.

`check_index(x, bound, ignore, what)` passes the integer tensor x through unchanged and
requires every element to lie in [0, bound) or to equal `ignore` (None: no exception).
Ops that compare an index with a class counter (cross-entropy's target against an iota
of the classes) check the index first: an index that matches no class would otherwise
select nothing and silently add 0, where PyTorch raises ("Target 16 is out of bounds.").
Every index-like op the IR gains (gather, embedding, scatter) checks its index the same
way, so the rule lives here: the predicate, the error message, and the ATen evaluation.

How a failed check is reported depends on where it runs: the reference evaluator and
every CPU path raise OutOfBoundsError at once; generated kernels write an error record
that the runtime raises (fuser/runtime/checks.py).
"""

from __future__ import annotations

import torch

from fuser.errors import OutOfBoundsError
from fuser.ir.graph import Node, freeze_attrs
from fuser.ir.ops import Op


def index_attrs(bound: object, ignore: int | None = None, what: str = "index") -> dict:
    """check_index's attributes (the builder's fd.ops.check_index takes the same)."""
    return {"bound": bound, "ignore": None if ignore is None else int(ignore), "what": what}


def target_check(cross_entropy: Node) -> Node:
    """The check of a cross_entropy node's target: what its decomposition adds."""
    logits, target = cross_entropy.inputs
    attrs = index_attrs(logits.shape[1], cross_entropy.attr("ignore_index"), "target")
    return Node(Op.CHECK_INDEX, (target,), (target,), freeze_attrs(attrs))


def allowed(node: Node) -> str:
    """The valid values of `node`'s index, in words: "[0, 16) or be -100 (ignore_index)"."""
    text = f"[0, {node.attr('bound')})"
    ignore = node.attr("ignore")
    return text if ignore is None else f"{text} or be {ignore} (ignore_index)"


def unravel(flat: int, shape: tuple) -> tuple[int, ...]:
    """The index of element `flat` of a row-major tensor of `shape`."""
    out = []
    for size in reversed([int(s) for s in shape]):
        out.append(flat % max(size, 1))
        flat //= max(size, 1)
    return tuple(reversed(out))


def message(node: Node, flat: int, value: int | None, origin: str = "") -> str:
    """What OutOfBoundsError says for element `flat` of `node`'s input holding `value`
    (None: a kernel could not tell, past element 2**31 - 1). Its start is PyTorch's own
    wording ("Target 16 is out of bounds")."""
    x = node.inputs[0]
    what = node.attr("what") or "index"
    where = unravel(flat, tuple(x.shape))
    if value is None:
        at = f"{x.name} at element {flat} or later"
    elif len(where) == 1:
        at = f"{x.name}[{where[0]}] (row {where[0]})"
    elif where:
        at = f"{x.name}[{', '.join(map(str, where))}] (element {flat})"
    else:
        at = x.name
    said = f"{what[0].upper()}{what[1:]} {'?' if value is None else value}"
    text = f"{said} is out of bounds: {at} must lie in {allowed(node)}"
    return text + (f"; {origin}" if origin else "")


def bad(node: Node, x: torch.Tensor) -> torch.Tensor:
    """Where `x` (the node's input) fails the check."""
    out = (x < 0) | (x >= int(node.attr("bound")))
    ignore = node.attr("ignore")
    return out if ignore is None else out & (x != ignore)


def check_eager(node: Node, x: torch.Tensor, asynchronous: bool = False) -> torch.Tensor:
    """`x`, checked with ATen. Raises OutOfBoundsError naming the first bad element; with
    `asynchronous` on a GPU it asserts on the device instead, as ATen's own nll_loss does
    (the executor's ATen segments: no host synchronization per call)."""
    failed = bad(node, x)
    if asynchronous and x.device.type == "cuda":
        torch._assert_async(~failed.any(), f"{node.attr('what') or 'index'} out of bounds")
        return x
    flat = failed.reshape(-1)
    if flat.numel() and bool(flat.any()):
        i = int(flat.int().argmax())  # the first bad element
        raise OutOfBoundsError(message(node, i, int(x.reshape(-1)[i])))
    return x
