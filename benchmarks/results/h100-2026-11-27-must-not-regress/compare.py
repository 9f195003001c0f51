"""The before/after table of this folder: the median of each fuser case's rounds per tree.

python benchmarks/results/h100-2026-11-27-must-not-regress/compare.py > table.txt
"""

from __future__ import annotations

import collections
import glob
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    times: dict[tuple, list[float]] = collections.defaultdict(list)
    schedule: dict[tuple, str] = {}
    for path in sorted(glob.glob(str(HERE / "bench" / "*" / "results.jsonl"))):
        tree, backend, _ = Path(path).parent.name.split("_")
        for line in open(path):
            row = json.loads(line)
            if row.get("impl", "").startswith("fuser") and row.get("ms"):
                key = (backend, row["op"], row["shape"], row["dtype"])
                times[key + (tree,)].append(row["ms"])
                schedule[key + (tree,)] = row.get("schedule") or ""
    for key in sorted({k[:4] for k in times}):
        before, after = times.get(key + ("before",)), times.get(key + ("after",))
        if not before or not after:
            print(*key, "only", "after" if after else "before")
            continue
        b, a = statistics.median(before), statistics.median(after)
        s_b, s_a = schedule[key + ("before",)], schedule[key + ("after",)]
        same = "same" if s_b == s_a else f"{s_b} -> {s_a}"
        flag = " <-- slower" if a / b - 1 > 0.02 else ""
        name = f"{key[0]:6} {key[1]:28} {key[2]:12} {key[3]:9}"
        print(f"{name} {b * 1e3:9.2f} {a * 1e3:9.2f} us {(a / b - 1) * 100:+6.1f}%  {same}{flag}")


if __name__ == "__main__":
    main()
