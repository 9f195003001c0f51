"""Bugs the fuzzer found that are not fixed yet, each with its strict-xfail regression test.

A failure matching one is counted under its id instead of stopping the run, so a long
soak keeps looking for new bugs; remove the entry when the fix lands (the xfail test
then fails as XPASS and says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fuser.config import use_interpreter
from fuser.fuzz.case import FuzzCase, build
from fuser.ir.dtypes import DType
from fuser.ir.ops import ELEMENTWISE


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


def _mixes_half_dtypes(case: FuzzCase) -> bool:
    """An elementwise op on float16 and bfloat16 tensors: Triton computes it in float16
    (its rule 3), torch in float32."""
    try:
        graph = build(case).graph
    except Exception:
        return False
    for n in graph.nodes:
        if n.op in ELEMENTWISE:
            kinds = {v.dtype for v in n.inputs if v.rank and v.dtype.is_float}
            if {DType.float16, DType.bfloat16} <= kinds:
                return True
    return False


KNOWN: tuple[Known, ...] = (
    Known(
        "mixed-dtype-float-math",
        "tests/test_fuzz.py::test_div_of_float32_by_float16",
        lambda msg, case: "Expected dtype" in msg and "but got" in msg,
    ),
    Known(
        "float16-with-bfloat16",
        "tests/test_fuzz.py::test_add_float16_bfloat16",
        lambda msg, case: msg.startswith("output") and _mixes_half_dtypes(case),
    ),
    Known(
        "outer-reduction-skips-scalar-nodes",
        "tests/test_fuzz.py::test_column_sum_of_one_row_minus_its_variance",
        lambda msg, case: "NameError" in msg and "is not defined" in msg,
    ),
    Known(
        "where-bf16-scalar-interpreter",
        "tests/test_fuzz.py::test_where_bf16_with_python_scalar",
        lambda msg, case: use_interpreter() and "get_bf16" in msg,
    ),
    Known(
        "scalar-bool-and-interpreter",
        "tests/test_fuzz.py::test_pow_python_scalar_exponent",
        lambda msg, case: use_interpreter() and ("bitwise_and" in msg or "bitwise_or" in msg),
    ),
)


def known_issue(message: str, case: FuzzCase) -> str | None:
    """The id of the known bug that `case` failing with `message` shows, if any."""
    for k in KNOWN:
        if k.matches(message, case):
            return k.id
    return None
