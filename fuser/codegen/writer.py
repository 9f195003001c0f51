"""A small indent-aware source writer shared by the renderers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Writer:
    def __init__(self, indent: str = "    "):
        self.lines: list[str] = []
        self.level = 0
        self.unit = indent

    def line(self, text: str = "") -> None:
        self.lines.append(self.unit * self.level + text if text else "")

    def comment(self, text: str, prefix: str = "#") -> None:
        for part in text.splitlines() or [""]:
            self.line(f"{prefix} {part}".rstrip())

    @contextmanager
    def block(self, header: str | None = None, close: str | None = None) -> Iterator[None]:
        if header is not None:
            self.line(header)
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1
            if close is not None:
                self.line(close)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
