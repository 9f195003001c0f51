"""What every `explain()` in fuser returns.

One convention everywhere (fd.explain(), fuser.explain(model), Trace.explain(),
kernel.explain(), schedule.explain()): the report is returned, never printed. It is a
str, so it can be searched, split and printed, and its repr is the text itself, so a REPL
or a notebook shows the report once, laid out (as torch.fx's print_readable and Triton's
asm dict are read). In a script: print(fd.explain()).
"""

from __future__ import annotations


class Explanation(str):
    """A report: a str whose repr is its text."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__str__(self)
