"""Bugs the fuzzer found that are not fixed yet, each with its strict-xfail regression test.

A failure matching one is counted under its id instead of stopping the run, so a long
soak keeps looking for new bugs; remove the entry when the fix lands (the xfail test
then fails as XPASS and says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fuser.fuzz.case import FuzzCase


@dataclass(frozen=True)
class Known:
    id: str
    test: str  # the strict-xfail regression test
    matches: Callable[[str, FuzzCase], bool]


def _has(case: FuzzCase, op: str) -> bool:
    return any(s.op == op for s in case.steps)


def _nan_source(case: FuzzCase) -> bool:
    """NaN in the data, or a NaN constant in the fusion."""
    consts = [a for s in case.steps for a in s.args if isinstance(a, float)]
    return case.specials != "none" or any(math.isnan(a) for a in consts)


def _scalar_product_compared(message: str, case: FuzzCase) -> bool:
    """A bool output from a 16-bit tensor multiplied or divided by a float scalar."""
    half = any(i.dtype in ("float16", "bfloat16") for i in case.inputs)
    scaled = any(
        s.op in ("mul", "div") and any(isinstance(a, float) for a in s.args) for s in case.steps
    )
    return half and scaled and "(torch.bool)" in message


# the last five before this one (mixed-dtype math, float16 with bfloat16, the outer
# reduction's scalar nodes, bf16 where and 0-d `&` under the interpreter) were fixed in
# fuser/codegen
KNOWN: tuple[Known, ...] = (
    Known(
        # The reference evaluator makes a float scalar a 0-d float32 tensor, which ATen
        # rounds to the 16-bit tensor's dtype before a mul/div (0.001 -> 0.0010004); the
        # kernels keep it unrounded, as eager's `x * 0.001` does with a Python number. The
        # products differ by an ulp, and a comparison of them at a tie (== 0.1) flips.
        "scalar-mul-reference",
        "tests/test_fuzz.py::test_scalar_product_compared_at_a_tie",
        _scalar_product_compared,
    ),
)


def known_issue(message: str, case: FuzzCase) -> str | None:
    """The id of the known bug that `case` failing with `message` shows, if any."""
    for k in KNOWN:
        if k.matches(message, case):
            return k.id
    return None
