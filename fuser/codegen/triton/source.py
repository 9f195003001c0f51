"""A KernelPlan as Triton source: the header, the imports, the helpers, the body."""

from __future__ import annotations

from fuser.codegen.header import header_lines
from fuser.codegen.triton.inner_outer import inner_outer
from fuser.codegen.triton.kernels import RENDERERS as KERNELS
from fuser.codegen.triton.looped import inner_looped
from fuser.codegen.triton.render import CONSTANTS, TritonKernelWriter
from fuser.codegen.triton.templates import HELPERS, helper_names
from fuser.codegen.writer import Writer
from fuser.errors import CompileError
from fuser.plan.kernel_plan import KernelPlan

RENDERERS = {**KERNELS, "inner_looped": inner_looped, "inner_outer": inner_outer}


def render_triton(plan: KernelPlan) -> str:
    """Triton source for one kernel (plus its finalize kernel for split reductions)."""
    if plan.kind not in RENDERERS:
        raise CompileError(f"cannot render a {plan.kind} schedule for triton")
    kw = TritonKernelWriter(plan)
    body = RENDERERS[plan.kind](kw)
    if kw.reports:  # a check whose report no kernel body wrote: never silently unchecked
        raise CompileError(f"{plan.spec.name}: {plan.kind} left index checks unreported")
    top = Writer()
    top.comment("\n".join(header_lines(plan.spec, plan.schedule, "triton")))
    top.line("import triton")
    top.line("import triton.language as tl")
    if "libdevice." in body:
        top.line("from triton.language.extra.cuda import libdevice")
    top.line()
    for name, value in CONSTANTS.items():
        top.line(f"{name} = tl.constexpr({value})")
    top.line()
    helpers = set(kw.helpers)
    for h in list(helpers):  # helpers that call helpers
        helpers.update(helper_names(HELPERS[h].split("\n", 2)[2]))
    for h in sorted(helpers):
        top.lines += HELPERS[h].splitlines()
        top.line()
    return top.text() + "\n" + body
