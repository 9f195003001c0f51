"""What both renderers say and decide about a check_index node (fuser/ir/guards.py)."""

from __future__ import annotations

from fuser.errors import OutOfBoundsError
from fuser.ir.graph import Node
from fuser.ir.guards import allowed, message


def check_comment(node: Node) -> str:
    """The comment above a rendered check: what is checked and why."""
    x, what = node.inputs[0], node.attr("what") or "index"
    return (
        f"{x.name} ({what}) must lie in {allowed(node)}.\n"
        "One that does not would select nothing and add 0 without a word; PyTorch raises\n"
        "there, and so does fuser: the first bad one is recorded for the host\n"
        "(fuser/runtime/checks.py)"
    )


def record_slot(record: str, number: int) -> str:
    """The pointer to check `number`'s two words in a kernel's error record."""
    return record if number == 0 else f"{record} + {2 * number}"


def static_check(node: Node, consts: dict[int, Node]) -> int | None:
    """For a check of a constant: the constant, checked now (OutOfBoundsError if bad).
    None for a check of a tensor, which the kernel checks."""
    c = consts.get(node.inputs[0].id)
    if c is None:
        return None
    value, bound, ignore = int(c.attr("value")), int(node.attr("bound")), node.attr("ignore")
    if not 0 <= value < bound and value != ignore:
        raise OutOfBoundsError(message(node, 0, value))
    return value
