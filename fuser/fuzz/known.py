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
    test: str  # the strict-xfail regression test: tests/test_fuzz_found_*.py::name
    matches: Callable[[str, FuzzCase], bool]


KNOWN: tuple[Known, ...] = ()


def known_issue(message: str, case: FuzzCase) -> str | None:
    """The id of the known bug that `case` failing with `message` shows, if any."""
    for k in KNOWN:
        if k.matches(message, case):
            return k.id
    return None
