"""Two profiles of the same step lined up: by category (the headline: each category's
delta in ms) and, where they can be matched, by kernel.

Kernel matching works on the memory-bound kernels of one step, in order: fuser's region
calls (a region's kernels together) against Inductor's Triton kernels. Each carries the
ATen ops it covers (fuser's region ops; the ops in Inductor's kernel name, with
_log_softmax and the like expanded into what fuser's regions hold after decomposition),
without the ops that only view or move data. A weighted longest-common-subsequence
alignment pairs units whose op sets overlap (Jaccard at least MATCH); the units it leaves
(the two compilers order some kernels differently) are then paired by best overlap,
nearest position first. Pairs are summed by their (block-merged) labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fuser.explanation import Explanation
from fuser.profile.classify import CATEGORIES, IDLE
from fuser.profile.report import StepProfile

MATCH = 0.34  # least Jaccard overlap of two op sets for a pair (1 op of 3 shared)


def similarity(a: list[str], b: list[str]) -> float:
    sa, sb = set(a), set(b)
    if not sa or not sb:
        return 1.0 if sa == sb else 0.0
    return len(sa & sb) / len(sa | sb)


def align(a: list[dict], b: list[dict]) -> list[tuple[int, int]]:
    """Index pairs (i, j), increasing in both, maximizing the summed similarity."""
    n, m = len(a), len(b)
    score = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, prev = score[i], score[i - 1]
        for j in range(1, m + 1):
            best = max(prev[j], row[j - 1])
            s = similarity(a[i - 1]["ops"], b[j - 1]["ops"])
            if s >= MATCH:
                best = max(best, prev[j - 1] + s)
            row[j] = best
    pairs, i, j = [], n, m
    while i and j:
        s = similarity(a[i - 1]["ops"], b[j - 1]["ops"])
        if s >= MATCH and abs(score[i][j] - (score[i - 1][j - 1] + s)) < 1e-9:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif score[i][j] == score[i - 1][j]:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def pair_leftovers(a: list[dict], b: list[dict], pairs: list[tuple[int, int]]) -> list:
    """Pairs among the units `pairs` left out: best overlap first, then nearest in
    relative position."""
    used_a, used_b = {i for i, _ in pairs}, {j for _, j in pairs}
    na, nb = max(len(a), 1), max(len(b), 1)
    cands = []
    for i in range(len(a)):
        if i in used_a:
            continue
        for j in range(len(b)):
            s = similarity(a[i]["ops"], b[j]["ops"]) if j not in used_b else 0.0
            if s >= MATCH:
                cands.append((-s, abs(i / na - j / nb), i, j))
    out = []
    for _, _, i, j in sorted(cands):
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            out.append((i, j))
    return out


@dataclass
class Match:
    a_label: str
    b_label: str
    calls: int = 0
    a_ms: float = 0.0
    b_ms: float = 0.0

    @property
    def delta_ms(self) -> float:
        return self.a_ms - self.b_ms


@dataclass
class Comparison:
    a: StepProfile
    b: StepProfile
    matches: list[Match] = field(default_factory=list)
    only_a: dict[str, list[float]] = field(default_factory=dict)  # label -> [calls, ms]
    only_b: dict[str, list[float]] = field(default_factory=dict)

    def deltas(self) -> dict[str, float | None]:
        """Per category (idle included) and for the step: a's ms minus b's."""
        out: dict[str, float | None] = {}
        for c in (*CATEGORIES, IDLE):
            va, vb = self.a.categories.get(c), self.b.categories.get(c)
            if va is None and vb is None:
                continue
            out[c] = None if va is None or vb is None else va - vb
        for k in ("window_ms", "busy_ms", "idle_ms", "host_ms"):
            va, vb = self.a.budget.get(k), self.b.budget.get(k)
            out[k] = None if va is None or vb is None else va - vb
        ta, tb = self.a.timing.get("unprofiled_ms"), self.b.timing.get("unprofiled_ms")
        out["step_ms"] = None if not ta or not tb else ta - tb
        ia, ib = self.a.idle_unprofiled_ms, self.b.idle_unprofiled_ms
        out["idle_at_unprofiled_step_ms"] = None if ia is None or ib is None else ia - ib
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.name,
            "b": self.b.name,
            "deltas_ms": self.deltas(),
            "categories_ms": {self.a.name: self.a.categories, self.b.name: self.b.categories},
            "matches": [
                {
                    self.a.name: m.a_label,
                    self.b.name: m.b_label,
                    "calls": m.calls,
                    f"{self.a.name}_ms": m.a_ms,
                    f"{self.b.name}_ms": m.b_ms,
                    "delta_ms": m.delta_ms,
                }
                for m in self.matches
            ],
            f"only_{self.a.name}": self.only_a,
            f"only_{self.b.name}": self.only_b,
        }

    def table(self, top: int | None = 25) -> Explanation:
        a, b = self.a.name, self.b.name
        d = self.deltas()
        lines = [f"{a} vs {b}: {self.a.title}".rstrip(": "), ""]
        lines.append(f"  {'ms per step':24s}{a:>10s}{b:>10s}{'delta':>10s}")
        rows = [("step (unprofiled)", self.a.timing.get("unprofiled_ms"),
                 self.b.timing.get("unprofiled_ms"), d.get("step_ms"))]  # fmt: skip
        for c in (*CATEGORIES, IDLE):
            if c in d:
                rows.append((c, self.a.categories.get(c), self.b.categories.get(c), d[c]))
        for k, name in (("busy_ms", "GPU busy"), ("host_ms", "host")):
            rows.append((name, self.a.budget.get(k), self.b.budget.get(k), d.get(k)))
        ia, ib = self.a.idle_unprofiled_ms, self.b.idle_unprofiled_ms
        di = None if ia is None or ib is None else ia - ib
        rows.append(("idle, unprofiled step", ia, ib, di))
        for name, va, vb, dv in rows:
            lines.append(f"  {name:24s}{_f(va)}{_f(vb)}{_f(dv, True)}")
        ms = sorted(self.matches, key=lambda m: -abs(m.delta_ms))
        shown = ms if top is None else ms[:top]
        lines += ["", f"matched memory-bound kernels ({len(ms)} kinds), by |delta|:"]
        lines.append(f"  {a:>8s} {b:>8s} {'delta':>8s} {'calls':>5s}  {a} region  <->  {b} kernel")
        for m in shown:
            lines.append(
                f"  {m.a_ms:8.2f} {m.b_ms:8.2f} {m.delta_ms:+8.2f} {m.calls:5d}  "
                f"{m.a_label}  <->  {m.b_label}"
            )
        ta, tb = sum(m.a_ms for m in ms), sum(m.b_ms for m in ms)
        lines.append(f"  {ta:8.2f} {tb:8.2f} {ta - tb:+8.2f}        all matched kernels")
        for who, only in ((a, self.only_a), (b, self.only_b)):
            if only:
                total = sum(v[1] for v in only.values())
                lines.append(f"  unmatched in {who}: {len(only)} kinds, {total:.2f} ms")
        return Explanation("\n".join(lines))

    def __str__(self) -> str:
        return self.table()


def _f(v: float | None, sign: bool = False) -> str:
    if v is None:
        return f"{'-':>10s}"
    return f"{v:+10.2f}" if sign else f"{v:10.2f}"


def compare(a: StepProfile, b: StepProfile) -> Comparison:
    """Line up profile a (say fuser) with profile b (say Inductor)."""
    cmp = Comparison(a, b)
    pairs = align(a.units, b.units)
    pairs += pair_leftovers(a.units, b.units, pairs)
    got: dict[tuple[str, str], Match] = {}
    for i, j in pairs:
        ua, ub = a.units[i], b.units[j]
        m = got.setdefault((ua["label"], ub["label"]), Match(ua["label"], ub["label"]))
        m.calls += 1
        m.a_ms += ua["ms"]
        m.b_ms += ub["ms"]
    cmp.matches = list(got.values())
    used_a, used_b = {i for i, _ in pairs}, {j for _, j in pairs}
    for units, used, only in ((a.units, used_a, cmp.only_a), (b.units, used_b, cmp.only_b)):
        for k, u in enumerate(units):
            if k not in used:
                v = only.setdefault(u["label"], [0, 0.0])
                v[0] += 1
                v[1] += u["ms"]
    return cmp
