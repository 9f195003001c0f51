"""A KernelPlan as CUDA C++ source: the header, the helpers the body uses, the body."""

from __future__ import annotations

from fuser.codegen.cuda.kernels import RENDERERS
from fuser.codegen.cuda.render import CudaKernelWriter
from fuser.codegen.cuda.templates import helpers_for
from fuser.codegen.header import header_lines
from fuser.codegen.writer import Writer
from fuser.errors import CompileError
from fuser.plan.kernel_plan import KernelPlan


def render_cuda(plan: KernelPlan) -> str:
    """CUDA C++ source for one kernel (plus its finalize kernel for split reductions)."""
    if plan.kind not in RENDERERS:
        raise CompileError(f"cannot render a {plan.kind} schedule for cuda")
    body = RENDERERS[plan.kind](CudaKernelWriter(plan))
    top = Writer()
    top.comment("\n".join(header_lines(plan.spec, plan.schedule, "cuda")), "//")
    top.line()
    for h in helpers_for(body):
        top.lines += h.splitlines()
        top.line()
    return top.text() + body
