"""Bugs the fuzzer found that are not fixed yet, each with its strict-xfail regression test.

A failure matching one is counted under its id instead of stopping the run, so a long
soak keeps looking for new bugs; remove the entry when the fix lands (the xfail test
then fails as XPASS and says so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fuser.fuzz.case import FuzzCase


@dataclass(frozen=True)
class Known:
    id: str
    test: str  # the strict-xfail regression test
    matches: Callable[[str, FuzzCase], bool]


_COMPARES = {"lt", "le", "gt", "ge", "eq", "ne"}

KNOWN: tuple[Known, ...] = (
    Known(
        # a checker limit, not a fuser bug: gelu of x near -4.5, where 1 + erf(x / sqrt2)
        # cancels, is ~1% off in float32 (eager's 1.5%, fuser's 0.35% off float64), and a
        # comparison of it with its own bf16 rounding asks which way it rounded; the
        # perturbed runs move gelu and its rounding together and cannot show the flip
        "erf-cancelled-comparison",
        "tests/test_fuzz.py::test_comparison_of_a_cancelled_gelu",
        lambda msg, case: (
            msg.startswith("output")
            and any(s.op == "gelu" for s in case.steps)
            and any(s.op in _COMPARES for s in case.steps)
        ),
    ),
)


def known_issue(message: str, case: FuzzCase) -> str | None:
    """The id of the known bug that `case` failing with `message` shows, if any."""
    for k in KNOWN:
        if k.matches(message, case):
            return k.id
    return None
