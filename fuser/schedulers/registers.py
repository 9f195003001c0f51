"""The register-pressure estimate.

registers/thread ~= overhead + persistent buffer words per thread. Constants are
calibrated against ptxas on sm_90 (see tests/test_resources.py, which checks the
estimate against the compiler for every sweep size).
"""

from __future__ import annotations

import math

from fuser.ir.ops import Op
from fuser.schedulers.spec import KernelSpec

# Calibrated on the seed fusion's sweep compiled by ptxas for sm_90 (Triton 3.6): a
# persistent kernel used ~22 registers of overhead, one register per fp32 row element kept
# across the reductions, ~2 per chunk (address and mask arithmetic) and ~1 per doubling
# of the warps (the cross-warp reduction). Estimates landed within 10% of ptxas.
BASE_OVERHEAD = 22
PER_CHUNK = 2
# exp/log/erf/tanh expand into several instructions with live temporaries
TRANSCENDENTAL = {Op.EXP, Op.EXP2, Op.LOG, Op.LOG2, Op.LOG1P, Op.TANH, Op.ERF, Op.POW, Op.SIGMOID}


def overhead(spec: KernelSpec, chunks: int, warps: int) -> int:
    extra = 4 if any(n.op in TRANSCENDENTAL for n in spec.nodes) else 0
    return BASE_OVERHEAD + extra + PER_CHUNK * chunks + int(math.log2(max(warps, 1)))


def buffer_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers holding the row between reductions (none if nothing crosses one)."""
    return math.ceil(elements_per_thread * spec.crossing_words())


def working_registers(spec: KernelSpec, elements_per_thread: int) -> int:
    """Registers for the chunk in flight: the loaded elements, packed 32 bits a register."""
    words = sum(a.dtype.itemsize for a in spec.full_args() if not a.is_output) / 4
    return math.ceil(elements_per_thread * max(words, 1.0))


def estimate_registers(
    spec: KernelSpec, elements_per_thread: int, chunks: int, warps: int, persistent: bool
) -> tuple[int, int]:
    """(total, buffer) registers per thread for `elements_per_thread` row elements."""
    buf = buffer_registers(spec, elements_per_thread) if persistent else 0
    work = buf if persistent and buf else working_registers(spec, elements_per_thread)
    return min(overhead(spec, chunks, warps) + work, 255), buf
