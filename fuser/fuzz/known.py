"""Bugs the fuzzer found that are not fixed yet, each with its strict-xfail regression test.

A failure matching one is counted under its id instead of stopping the run, so a long
soak keeps looking for new bugs; remove the entry when the fix lands (the xfail test
then fails as XPASS and says so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fuser.config import use_interpreter
from fuser.fuzz.case import FuzzCase


@dataclass(frozen=True)
class Known:
    id: str
    test: str  # the strict-xfail regression test
    matches: Callable[[str, FuzzCase], bool]


KNOWN: tuple[Known, ...] = (
    Known(
        "relu-drops-nan",
        "tests/test_fuzz.py::test_relu_propagates_nan",
        lambda msg, case: "NaN pattern" in msg and any(s.op == "relu" for s in case.steps),
    ),
    Known(
        "mixed-dtype-float-math",
        "tests/test_fuzz.py::test_div_of_float32_by_float16",
        lambda msg, case: "Expected dtype" in msg and "but got" in msg,
    ),
    Known(
        "kernel-without-full-input",
        "tests/test_fuzz.py::test_softmax_of_a_broadcast_column",
        lambda msg, case: "max() arg is an empty sequence" in msg and "schedule_inner" in msg,
    ),
    Known(
        "where-bf16-scalar-interpreter",
        "tests/test_fuzz.py::test_where_bf16_with_python_scalar",
        lambda msg, case: use_interpreter() and "get_bf16" in msg,
    ),
    Known(
        "pow-scalar-exponent-interpreter",
        "tests/test_fuzz.py::test_pow_python_scalar_exponent",
        lambda msg, case: use_interpreter() and "bitwise_and" in msg and "pow_(" in msg,
    ),
)


def known_issue(message: str, case: FuzzCase) -> str | None:
    """The id of the known bug that `case` failing with `message` shows, if any."""
    for k in KNOWN:
        if k.matches(message, case):
            return k.id
    return None
