"""Generated sources pinned in tests/golden/sources (process replay, as tinygrad does it).

Rendering only: no compile, no launch. A failure shows the first lines that differ; if the
change is intended, run `python -m tests.golden.regen` and review the diff like code.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from fuser.schedulers import heuristics
from tests.golden.cases import BACKENDS, GOLDENS, PRESETS, path_of, render

ROOT = Path(__file__).parent / "golden" / "sources"
PARAMS = [(g, b, p) for g in GOLDENS for b in BACKENDS for p in PRESETS]


def _diff(want: str, got: str, name: str) -> str:
    lines = difflib.unified_diff(
        want.splitlines(), got.splitlines(), f"golden/{name}", "rendered now", lineterm=""
    )
    return "\n".join(list(lines)[:60])


@pytest.mark.parametrize(
    "golden,backend,preset", PARAMS, ids=[f"{g.name}-{b}-{p}" for g, b, p in PARAMS]
)
def test_source_matches_golden(golden, backend, preset):
    name = path_of(golden, backend, preset)
    path = ROOT / name
    assert path.exists(), f"no golden {name}: run python -m tests.golden.regen"
    want, got = path.read_text(), render(golden, backend, preset)
    assert got == want, (
        f"generated source changed:\n{_diff(want, got, name)}\n"
        "intended? python -m tests.golden.regen, then review git diff tests/golden"
    )


def test_no_stale_goldens():
    expected = {path_of(g, b, p) for g, b, p in PARAMS}
    on_disk = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.golden")}
    assert on_disk == expected, f"stale: {sorted(on_disk - expected)}"


def test_a_changed_schedule_shows_as_a_diff(monkeypatch):
    """The comparison is sensitive: one heuristic constant changed (rows per block of a
    7-row fusion) changes the rendered kernel."""
    golden = next(g for g in GOLDENS if g.name == "persistent_seed_7x96")
    want = (ROOT / path_of(golden, "cuda", "h100")).read_text()
    monkeypatch.setattr(heuristics, "MAX_ROWS_PER_BLOCK", 1)
    got = render(golden, "cuda", "h100")
    assert got != want
    assert "rpb1" in _diff(want, got, "x")
