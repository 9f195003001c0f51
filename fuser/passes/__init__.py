"""Graph -> graph passes. `run_pipeline` keeps every intermediate graph for printing."""

from __future__ import annotations

from dataclasses import dataclass

from fuser.ir.graph import Graph
from fuser.passes.broadcasts import casts_after_row_broadcasts, has_cast_row_broadcasts
from fuser.passes.decompose import decompose
from fuser.passes.simplify import concretize, cse, dce, eliminate_casts, fold_constants
from fuser.passes.views import has_views, lower_views

__all__ = [
    "Pipeline",
    "casts_after_row_broadcasts",
    "concretize",
    "cse",
    "dce",
    "decompose",
    "eliminate_casts",
    "fold_constants",
    "lower_views",
    "run_pipeline",
]


@dataclass(frozen=True)
class Pipeline:
    """Every graph the pipeline produced, first to last."""

    stages: tuple[Graph, ...]

    @property
    def final(self) -> Graph:
        return self.stages[-1]

    def __str__(self) -> str:
        return "\n\n".join(str(g) for g in self.stages)


def run_pipeline(graph: Graph, relaxed_precision: bool = False) -> Pipeline:
    """[lower views ->] decompose -> fold constants -> eliminate casts [-> casts after row
    broadcasts] -> CSE -> DCE."""
    stages = [graph]
    if has_views(graph):  # a stage only where it does something: other pipelines print as before
        stages.append(lower_views(stages[-1]))
    stages.append(decompose(stages[-1]))
    stages.append(fold_constants(stages[-1]))
    stages.append(eliminate_casts(stages[-1], relaxed_precision))
    if has_cast_row_broadcasts(stages[-1]):  # as views: a stage only where it acts
        stages.append(casts_after_row_broadcasts(stages[-1]))
    stages.append(cse(stages[-1]))
    stages.append(dce(stages[-1]))
    return Pipeline(tuple(stages))
