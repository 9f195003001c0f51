"""The register-pressure estimate.

registers/thread ~= overhead + persistent buffer words per thread. Constants are
calibrated against ptxas on sm_90 (see tests/test_resources.py, which checks the
estimate against the compiler for every sweep size).
"""

from __future__ import annotations

import math

from fuser.ir.ops import Op
from fuser.schedulers.spec import KernelSpec

# registers for indices, pointers, masks and the reduction scaffolding (nvFuser budgets
# ~16 beyond the buffers; Triton kernels measured here sit a little higher)
BASE_OVERHEAD = 20
# exp/log/erf/tanh expand into several instructions with live temporaries
TRANSCENDENTAL = {Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.LOG1P, Op.TANH, Op.ERF, Op.POW, Op.SIGMOID}


def overhead(spec: KernelSpec) -> int:
    extra = 6 if any(n.op in TRANSCENDENTAL for n in spec.nodes) else 0
    return BASE_OVERHEAD + extra + len(spec.args)


def persistent_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers holding the row between reductions."""
    return math.ceil(elements_per_thread * spec.crossing_words())


def working_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers for the chunk in flight: the widest loads of one pass, packed."""
    words = sum(a.dtype.itemsize for a in spec.full_args() if not a.is_output) / 4
    return math.ceil(elements_per_thread * max(words, 1.0))


def estimate_registers(
    spec: KernelSpec, elements_per_thread: int, persistent: bool
) -> tuple[int, int]:
    """(total, buffer) registers per thread for `elements_per_thread` row elements."""
    buf = persistent_registers(spec, elements_per_thread) if persistent else 0
    work = working_registers(spec, elements_per_thread)
    total = overhead(spec) + max(buf, work) + (min(buf, work) // 2 if persistent else 0)
    return min(total, 255), buf
