"""Helpers every scheduler shares: powers of two, the vector width, the index width, the
backend's register estimate and the Estimate of a chosen schedule."""

from __future__ import annotations

import math
from dataclasses import replace

from fuser.backends.base import Backend
from fuser.backends.registry import get_backend
from fuser.plan.build import make_plan
from fuser.schedulers.device import Device
from fuser.schedulers.schedule import Estimate, Schedule
from fuser.schedulers.spec import KernelSpec, access_width, view_width


def pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def vector_width(spec: KernelSpec, reasons: list[str], masked_tail: bool = True) -> int:
    """Elements per access: 16 bytes where every FULL input's rows allow it.

    The loads decide (the kernel waits on them); an output whose rows allow less gets
    narrower stores (the CUDA renderer packs each argument as its alignment allows,
    Triton vectorizes what its alignment analysis proves). Only the row starts must be
    aligned: the row's last partial vector is masked when `masked_tail` (the renderers
    predicate each element of a slot that straddles the row end); without it the vector
    must also divide the column count.
    """
    fulls = spec.full_args()
    widest = max((a.dtype.itemsize for a in fulls), default=4)
    v = max(16 // widest, 1)
    loads = [a for a in fulls if not a.is_output] or fulls
    limits = [a.name for a in loads if access_width(spec, a, v) < v]
    v = min((access_width(spec, a, v) for a in loads), default=v)
    views = [n for n in spec.views if view_width(spec, n, v) < v]
    v = min((view_width(spec, n, v) for n in views), default=v)
    aligned = v
    while not masked_tail and v > 1 and spec.cols % v:
        v //= 2
    why = f"vector {v}: {v * widest} bytes per access of the widest tensor ({widest} B elements)"
    if limits:
        why += f"; narrowed by stride/alignment of {', '.join(sorted(set(limits)))}"
    if views:
        why += "; narrowed by the column offsets of " + ", ".join(
            f"{n.out.name} (a read of {n.inputs[0].name} at {n.attr('scale')} * j + "
            f"{n.attr('offset')}, columns [{n.attr('lo')}, {n.attr('hi')}))"
            for n in views
        )
    narrow = sorted({a.name for a in fulls if a.is_output and access_width(spec, a, v) < v})
    if narrow:
        why += f"; narrower stores to {', '.join(narrow)} (their rows start unaligned)"
    if v < aligned:
        why += f"; {spec.cols} columns allow no wider vector (this kernel has no masked tail)"
    elif spec.cols % v:
        why += f"; rows aligned: vector {v} with a masked tail of {spec.cols % v} column(s)"
    reasons.append(why)
    return v


def _estimate(
    spec: KernelSpec, dev: Device, s: Schedule, regs: int, buf: int, covered: int
) -> Estimate:
    blocks = math.prod(s.grid)
    bps = max(dev.blocks_per_sm(s.threads, regs), 1)
    return Estimate(
        registers=regs,
        buffer_registers=buf,
        blocks_per_sm=bps,
        warps_per_sm=bps * s.num_warps,
        waves=blocks / (dev.sms * bps),
        bytes_moved=spec.bytes_moved(),
        lane_efficiency=spec.cols / covered if covered else 1.0,
    )


def index_bits(spec: KernelSpec) -> int:
    span = max((a.extent(spec.rows, spec.cols) for a in spec.args), default=0)
    return 64 if span >= 2**31 - 1 else 32


def registers(spec: KernelSpec, s: Schedule, backend: Backend | str) -> int:
    """The backend's register estimate for `s`: what the choice is made with."""
    return get_backend(backend).estimate(make_plan(spec, s))


def _with(s: Schedule, est: Estimate, reasons: list[str]) -> Schedule:
    return replace(s, estimate=est, reasons=tuple(reasons)).validate()
