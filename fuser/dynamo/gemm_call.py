"""The FX target a GEMM template call is (dynamo/gemm.py puts it in place of a matched
matmul chain), and what runtime/precompile.py and explain read from a graph's calls: one
warm-up per call (its kernels compiled from the call's fake argument values before the
first call) and each template's source."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import fx

from fuser.runtime.gemm import gemm, shape_of, source_of, warm_up
from fuser.runtime.precompile import TemplateWarmup
from fuser.schedulers.gemm import Epilogue, GemmPlan


class GemmCall:
    """FX target replacing a matched chain: (a, b, bias, pre, residual, mask) ->
    (C, [pre-activation], [sums])."""

    __name__ = "fuser_gemm"

    def __init__(
        self,
        epilogue: Epilogue,
        plan: GemmPlan,
        mkn: tuple,
        scales: tuple[float | None, float | None],
        out: Any,
        why: str,
    ):
        self.epilogue, self.plan, self.mkn, self.why = epilogue, plan, mkn, why
        self.scale, self.mask_scale = scales  # the prologue's, dropout's (1 / (1 - p))
        self.out_dtype, self.sum_shape = out

    def _kw(self, bias: Any, pre: Any, residual: Any, mask: Any) -> dict[str, Any]:
        return {
            "bias": bias, "residual": residual, "pre": pre, "mask": mask,
            "scale": self.scale, "mask_scale": self.mask_scale, "out_dtype": self.out_dtype,
        }  # fmt: skip

    def __call__(
        self, a: Any, b: Any, bias: Any, pre: Any, residual: Any, mask: Any = None
    ) -> tuple:
        m, n, k = self.mkn
        a = a if a.dim() == 2 else a.reshape(m, k)
        e = self.epilogue
        shape = shape_of(a, b, e, self.out_dtype, bias, residual, pre, mask)
        plan = self.plan if self.plan.shape == shape else None
        out, aux, sums = gemm(a, b, e, plan=plan, **self._kw(bias, pre, residual, mask))
        results = [out] + ([aux] if e.aux else [])
        if e.reduce != "none":
            results.append(sums.reshape(self.sum_shape))
        return tuple(results)

    def warmup(
        self, a: Any, b: Any, bias: Any, pre: Any, residual: Any, mask: Any = None
    ) -> GemmPlan:
        """Compile the kernels a call with tensors like these (fake ones) launches."""
        m, n, k = self.mkn
        a = a if a.dim() == 2 else a.reshape(m, k)
        kw = self._kw(bias, pre, residual, mask)
        return warm_up(a, b, self.epilogue, plan=self.plan, **kw)

    def __repr__(self) -> str:
        return f"GemmCall({self.plan.name})"


def template_sources(gm: fx.GraphModule) -> list[str]:
    """ "source of <kernel>:" and the source, for each GEMM template a graph calls."""
    plans = {n.target.plan: None for n in gm.graph.nodes if isinstance(n.target, GemmCall)}
    return [f"source of {p.name}:\n{source_of(p)}" for p in plans]


def template_warmups(gm: fx.GraphModule) -> list[TemplateWarmup]:
    """The GEMM template calls of a lowered graph as runtime/precompile.py warms them up
    before the first call (from each call's fake argument values)."""
    out = []
    for node in gm.graph.nodes:
        call = node.target
        if node.op != "call_function" or not isinstance(call, GemmCall):
            continue
        vals = [x.meta.get("val") if isinstance(x, fx.Node) else x for x in node.args]
        if any(isinstance(x, fx.Node) and v is None for x, v in zip(node.args, vals)):
            continue  # no fake value to warm it up from: its first call compiles it
        key = tuple(
            (tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else v
            for v in vals
        )
        out.append(
            TemplateWarmup(call.plan.name, source_of(call.plan), partial(call.warmup, *vals), key)
        )
    return out
