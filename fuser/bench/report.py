"""What a benchmark run leaves behind: a terminal table, JSON lines, plots, a regret summary."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fuser.bench.targets import targets_table


def header() -> str:
    """The terminal table's header row."""
    cells = [f"{'op':22s}", f"{'shape':12s}", f"{'impl':14s}", f"{'pass':4s}"]
    cells += [f"{'time':>11s}", f"{'bandwidth':>11s}", f"{'%copy':>6s}", "schedule / error"]
    return " ".join(cells)


def verdict(r: dict) -> str:
    """The pass column: FAIL for a wrong or failed run, ok for one checked against eager,
    blank for a row that is a timing only (the copy ceiling, confirmed sweep timings)."""
    if r.get("error"):
        return "FAIL"
    return "ok" if "error" in r else ""


def line(r: dict) -> str:
    """One row of the terminal table (columns as in header())."""
    ms, gbps, ceil = r.get("ms"), r.get("gbps"), r.get("copy_gbps")
    cells = [f"{r['op']:22s}", f"{r['shape']:12s}", f"{r['impl']:14s}", f"{verdict(r):4s}"]
    cells.append(f"{ms:8.4f} ms" if ms else " " * 11)
    cells.append(f"{gbps:6.0f} GB/s" if gbps else " " * 11)
    cells.append(f"{gbps / ceil:5.1%}" if gbps and ceil else " " * 6)
    if r.get("error"):
        cells.append(f"WRONG/FAILED: {r['error']}")
    elif r.get("schedule"):
        regs = r.get("registers")
        est = r.get("est_registers")
        cells.append(r["schedule"] + (f"  regs {regs} (est {est})" if regs else ""))
        if r.get("heuristic"):
            cells.append("<- heuristic")
    return " ".join(cells)


def write_jsonl(rows: list[dict], path: Path) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def regret(rows: list[dict]) -> list[dict]:
    """Per (op, shape, backend, kernel): the heuristic's time against the best candidate."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    confirmed: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        key = (r["op"], r["shape"], r["impl"].split("-", 1)[-1], r.get("kernel"))
        if r["impl"].startswith("sweep-") and r.get("ms"):
            groups[key].append(r)
        elif r["impl"].startswith("confirm-") and r.get("ms"):
            confirmed[key].append(r)
    out = []
    for (op, shape, backend, kernel), swept in groups.items():
        # the re-timed heuristic and fastest candidates where the sweep has them
        rs = confirmed.get((op, shape, backend, kernel)) or swept
        best = min(rs, key=lambda r: r["ms"])
        mine = [r for r in rs if r.get("heuristic")]
        if not mine:
            continue
        out.append(
            {
                "op": op,
                "shape": shape,
                "backend": backend,
                "kernel": kernel,
                "heuristic": mine[0]["schedule"],
                "heuristic_ms": mine[0]["ms"],
                "best": best["schedule"],
                "best_ms": best["ms"],
                "regret": mine[0]["ms"] / best["ms"] - 1,
                "candidates": len(swept),
                "confirmed": rs is not swept,
            }
        )
    return out


def regret_summary(reg: list[dict]) -> str:
    if not reg:
        return ""
    lines = ["heuristic regret = time(heuristic) / time(best candidate) - 1"]
    for r in reg:
        lines.append(
            f"  {r['op']:14s} {r['shape']:12s} {r['backend']:7s} {r['kernel']}: "
            f"{r['regret']:6.1%}  heuristic {r['heuristic']} ({r['heuristic_ms']:.4f} ms), "
            f"best of {r['candidates']}: {r['best']} ({r['best_ms']:.4f} ms)"
        )
    by_backend: dict[str, list[float]] = defaultdict(list)
    for r in reg:
        by_backend[r["backend"]].append(r["regret"])
    for b, v in by_backend.items():
        lines.append(
            f"  {b}: median regret {statistics.median(v):.1%}, worst {max(v):.1%} "
            f"over {len(v)} kernels"
        )
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> list[Path]:
    """Bandwidth against hidden size per op (one line per implementation, copy dashed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    by_op: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        timing_only = r["impl"].split("-")[0] in ("sweep", "confirm")
        if r.get("gbps") and not timing_only and r["op"] != "copy":
            by_op[(r["op"], r["dtype"])].append(r)
    paths = []
    for (op, dtype), rs in by_op.items():
        if len({r["shape"] for r in rs}) < 2:
            continue
        fig, ax = plt.subplots(figsize=(9, 5))
        for impl in sorted({r["impl"] for r in rs}):
            pts = sorted(
                (int(r["shape"].split("x")[1]), r["gbps"]) for r in rs if r["impl"] == impl
            )
            ax.plot(*zip(*pts), marker="o", label=impl)
        ceil = rs[0].get("copy_gbps")
        if ceil:
            ax.axhline(ceil, color="gray", ls="--", label=f"copy {ceil:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"hidden size H ({rs[0]['shape'].split('x')[0]} rows, {dtype})")
        ax.set_ylabel("GB/s (minimal bytes)")
        ax.set_title(f"{op} on {rs[0]['device']}")
        ax.legend()
        path = out / f"{op}_{dtype}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """`python -m fuser.bench.report RESULTS.jsonl...`: issue 20's targets table of training
    runs (python -m fuser.bench --suite training; several files are read as one run), or
    the regret summary of a sweep."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m fuser.bench.report RESULTS.jsonl [MORE.jsonl ...]")
        return 2
    rows = [json.loads(x) for path in argv for x in open(path) if x.strip()]
    if any(r.get("suite") == "training" for r in rows):
        print(targets_table(rows))
    else:
        print(regret_summary(regret(rows)) or "no training rows and no sweep in this file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
