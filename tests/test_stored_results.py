"""The stored GPU results stay small: a raw file over 100 KB is kept gzip-compressed
(benchmarks/README.md, "Stored results"), since the device tool copies the working tree,
results included, to the GPU machine under a size limit."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
LIMIT = 100_000
# tables other scripts read back as they are (benchmarks/outer_fit.py reads sweeps)
READ_BACK = {".jsonl", ".csv"}


def test_large_raw_results_are_compressed() -> None:
    assert RESULTS.is_dir(), RESULTS
    big = [
        str(p.relative_to(RESULTS))
        for p in RESULTS.rglob("*")
        if p.is_file() and p.suffix not in READ_BACK | {".gz", ".png"} and p.stat().st_size > LIMIT
    ]
    assert not big, f"gzip these (benchmarks/README.md, 'Stored results'): {big}"
