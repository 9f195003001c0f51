"""Rewrite the golden sources: `python -m tests.golden.regen` (then review `git diff`).

A refactor that changes no kernel leaves the tree clean; a change to a renderer or a
heuristic shows up as a diff of the kernels it changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.golden.cases import BACKENDS, GOLDENS, PRESETS, path_of, render

ROOT = Path(__file__).parent / "sources"


def main() -> int:
    written = changed = 0
    for golden in GOLDENS:
        for backend in BACKENDS:
            for preset in PRESETS:
                path = ROOT / path_of(golden, backend, preset)
                text = render(golden, backend, preset)
                old = path.read_text() if path.exists() else None
                if old != text:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    changed += 1
                    print(f"{'changed' if old else 'new'}: {path.relative_to(ROOT)}")
                written += 1
    print(f"{written} golden sources, {changed} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
