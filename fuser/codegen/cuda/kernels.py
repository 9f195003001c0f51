"""CUDA kernel bodies per schedule kind: pointwise, inner persistent, inner looped, outer.

Each function writes one `extern "C" __global__` kernel (two for a split column
reduction) with the CudaKernelWriter and returns the source text.
"""

from __future__ import annotations

from fuser.codegen.cuda.inner_outer import inner_outer
from fuser.codegen.cuda.looped import inner_looped
from fuser.codegen.cuda.outer import outer_reduction
from fuser.codegen.cuda.persistent import inner_persistent
from fuser.codegen.cuda.pointwise import pointwise

RENDERERS = {
    "pointwise": pointwise,
    "inner_persistent": inner_persistent,
    "inner_looped": inner_looped,
    "outer_reduction": outer_reduction,
    "inner_outer": inner_outer,
}
