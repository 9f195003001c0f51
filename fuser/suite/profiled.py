"""A suite run's step under the step profiler (`python -m fuser.suite --profile`): its GPU
time by category and its fused-op coverage by GPU time (StepProfile.coverage), kept in
the Result, with the profiler's report beside the suite's table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fuser.profile.profiler import profile
from fuser.profile.report import StepProfile, dumps
from fuser.suite.run import Result


def profiled(step: Callable[[], object], res: Result, out: Path) -> None:
    """Profile one more of `res`'s steps (`step` runs one) and keep its GPU time by
    category and its coverage; the report goes to `out`/<model>-<impl>/."""
    prof = profile(step, name=res.impl, steps=3, warmup=1, timed=5, title=res.model)
    assert isinstance(prof, StepProfile)
    res.gpu_ms = dict(prof.categories)
    cov = prof.coverage()
    res.gpu_coverage = cov["share"] if cov else float("nan")
    res.own_coverage = cov["own_share"] if cov else float("nan")
    if cov and "outside_graphs_ms" in cov:
        res.outside_graphs_ms = cov["outside_graphs_ms"]
        res.own_coverage_in_graphs = cov["own_share_in_graphs"]
    folder = out / f"{res.model}-{res.impl}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "profile.txt").write_text(str(prof.table(top=30)) + "\n")
    (folder / "profile.json").write_text(dumps(prof.to_json()))
