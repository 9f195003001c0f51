"""Issue 20's targets table: per op x variant x shape, each implementation's GB/s, fuser's
speedup over the peers, and PASS/FAIL against the issue's bars.

The bars (H100, bf16; GB/s are the case's counted bytes over GPU time):
- LayerNorm, residual LayerNorm, RMSNorm fwd+bwd: >= 1800 GB/s at H < 1024, >= 2100 at
  H < 1600, >= 2400 from 1600, and faster than every peer measured (eager, Inductor,
  Liger, QuACK).
- bias gradient: faster than Inductor at every shape; >= 2600 GB/s where dy is 48 MiB or
  more.
- cross-entropy fwd+bwd: at V <= 50257, >= 2700 GB/s and faster than Inductor and Liger;
  at larger V, faster than every peer.
A fuser row passes only when it is correct and did not fall back to ATen; a peer that is
missing, skipped or wrong is left out of the comparison (and named so).

QuACK does not install on the GPU machine, so its published H100 figures (bf16, 32K
rows) stand beside fuser's as a share of a copy ceiling: fuser's of the run's own copy,
QuACK's of the H100 copy measured in shared/anchors/README.md (3002 GB/s), QuACK
publishing none of its own. Source: the performance figure of QuACK's README
(github.com/Dao-AILab/quack, media/bf16_kernel_benchmarks_single_row.svg, read off the
plot in shared/anchors/README.md) for the RMSNorm forward and the cross-entropy
forward+backward; issue 20 for the RMSNorm backward (~2500 GB/s).
"""

from __future__ import annotations

from collections import defaultdict

PEERS = ["eager", "compile", "liger", "quack"]
NORMS = ("layernorm_fwd_bwd", "residual_layernorm_fwd_bwd", "rmsnorm_fwd_bwd")
H100_COPY_GBPS = 3002.0  # shared/anchors/README.md, 2026-11-21
MiB = 2**20


def _combined(fwd: float, bwd: float) -> float:
    """GB/s of forward (2 units of traffic) then backward (3 units) run back to back."""
    return 5 / (2 / fwd + 3 / bwd)


QUACK_PUBLISHED: dict[str, dict[int, tuple[float, str]]] = {
    "rmsnorm_fwd_bwd": {
        1024: (_combined(2581, 2500), "fwd 2581 (N=1K) + bwd ~2500"),
        2048: (_combined(2761, 2500), "fwd 2761 (N=2K) + bwd ~2500"),
        4096: (_combined(2900, 2500), "fwd 2900 (N=4K) + bwd ~2500"),
    },
    "cross_entropy_fwd_bwd": {
        32000: (3021.0, "fwd+bwd 3021 at V=32K"),
        50257: (3021.0, "fwd+bwd 3021 at V=32K, 3182 at 65K"),
    },
}


def bar(op: str, rows: int, cols: int) -> tuple[float | None, list[str]]:
    """(the GB/s bar or None, the peers fuser must beat) at this shape."""
    if op in NORMS:
        return (1800.0 if cols < 1024 else 2100.0 if cols < 1600 else 2400.0), PEERS
    if op == "bias_grad":
        return (2600.0 if rows * cols * 2 >= 48 * MiB else None), ["compile"]
    if op == "cross_entropy_fwd_bwd":
        return (2700.0, ["compile", "liger"]) if cols <= 50257 else (None, PEERS)
    return None, []


def verdict(fuser: dict, peers: dict[str, dict]) -> str:
    """PASS, or FAIL with the reasons, for one fuser row against its bar and peers."""
    if fuser.get("ok") is True and fuser.get("ms") is None:
        return "untimed"
    if fuser.get("ok") is not True or not fuser.get("gbps"):
        return "FAIL (" + (fuser.get("error") or fuser.get("skipped") or "no time")[:60] + ")"
    gbps = fuser["gbps"]
    need, beat = bar(fuser["op"], fuser["rows"], fuser["cols"])
    why = []
    if need is not None and gbps < need:
        why.append(f"< {need:.0f}")
    for name in beat:
        p = peers.get(name)
        if p and p.get("ok") is not False and p.get("gbps") and p["gbps"] >= gbps:
            why.append(f"<= {name}")
    return "PASS" if not why else "FAIL (" + ", ".join(why) + ")"


def _key(r: dict) -> tuple:
    return (r["op"], r.get("variant", ""), r.get("rows", 0), r.get("cols", 0))


def targets_table(rows: list[dict]) -> str:
    """The table as text (rows of one training-suite run)."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r.get("suite") == "training" and r["op"] != "copy":
            groups[_key(r)][r["impl"]] = r
    if not groups:
        return "no training-suite rows"
    every = PEERS + ["fuser-triton", "fuser-cuda"]
    impls = [i for i in every if any(i in g for g in groups.values())]
    head = f"{'op[variant]':36s} {'shape':12s} " + " ".join(f"{i[:12]:>12s}" for i in impls)
    head += "  fuser/best peer   bar  verdicts (GB/s)"
    out = ["issue 20 targets: GB/s of counted bytes; fuser's speedup over its best peer", head]
    passed = total = 0
    for (op, variant, m, n), g in groups.items():
        label = f"{op}[{variant}]" if variant else op
        cells = [f"{label:36s}", f"{m}x{n:<12d}"[:12].ljust(12)]
        for i in impls:
            r = g.get(i, {})
            gb = r.get("gbps")
            mark = "!" if r.get("ok") is False else ""
            cells.append(f"{(f'{gb:.0f}' if gb else '-') + mark:>12s}")
        peers = {p: g[p] for p in PEERS if p in g}
        fusers = [g[i] for i in ("fuser-triton", "fuser-cuda") if i in g]
        best_fuser = max((f.get("gbps") or 0 for f in fusers), default=0)
        peer_best = max(
            (p.get("gbps") or 0 for p in peers.values() if p.get("ok") is not False), default=0
        )
        cells.append(f"{best_fuser / peer_best:10.2f}x" if best_fuser and peer_best else " " * 11)
        need = bar(op, m, n)[0]
        cells.append(f"{need:6.0f}" if need else " " * 6)
        vs = []
        for f in fusers:
            v = verdict(f, peers)
            total += v != "untimed"
            passed += v == "PASS"
            vs.append(f"{f['impl'].removeprefix('fuser-')} {v}")
        cells.append("  " + "; ".join(vs))
        out.append(" ".join(cells))
    out.append(f"{passed}/{total} fuser rows PASS  ('!' = wrong or fell back to ATen)")
    out += quack_lines(groups)
    return "\n".join(out)


def quack_lines(groups: dict[tuple, dict[str, dict]]) -> list[str]:
    """fuser's share of the run's copy beside QuACK's published share of an H100 copy."""
    lines = []
    for (op, variant, m, n), g in groups.items():
        pub = QUACK_PUBLISHED.get(op, {}).get(n)
        fusers = [r for i, r in g.items() if i.startswith("fuser-") and r.get("gbps")]
        if not pub or not fusers:
            continue
        best = max(fusers, key=lambda r: r["gbps"])
        ceil = best.get("copy_gbps")
        if not ceil:
            continue
        label = f"{op}[{variant}]" if variant else op
        lines.append(
            f"  {label:36s} {m}x{n}: {best['impl']} {best['gbps'] / ceil:6.1%} of copy;"
            f" QuACK published {pub[0]:.0f} GB/s = {pub[0] / H100_COPY_GBPS:6.1%} ({pub[1]})"
        )
    if lines:
        lines.insert(0, "QuACK (published H100 figures, not measured here; fuser.bench.targets):")
    return lines
