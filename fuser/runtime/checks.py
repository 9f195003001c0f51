"""Failed check_index nodes (fuser/ir/guards.py) reported by generated kernels.

A kernel with checks takes two more pointers after its tensors: its own error record on
the tensors' device, two int64 words per check, and the process's flag, one int64 in
pinned host memory. A bad element makes two atomic minima on its check's words, of its
index shifted up 32 bits joined with the low and the high half of its value, so both
words end up holding the smallest bad element's (deterministic, like PyTorch's CPU loop,
and no atomic returns a value: Triton would route one through shared memory and a
barrier); it also stores 1 to the flag. While every index is good these are
predicated-off instructions: one compare per row, no memory traffic, no extra pass.

On CPU (Triton's interpreter, the CUDA emulator) a launch has finished when it returns:
the record is read at once and the launching call raises. On a GPU a launch returns
before the kernel runs, and reading a record would synchronize the host. The flag needs
no synchronization: with unified addressing a GPU stores to pinned host memory directly,
and the host reads it as plain memory. Every fuser call reads it first (`poll`); once it
is set the runtime synchronizes, reads the records and raises, naming the kernel. So a
bad batch raises at the first fuser call after its kernel ran (a step later, typically),
or where the program calls fuser.check_errors(). A reported error is cleared, so it is
raised once, and the CUDA context stays usable (a device-side assert would end it).
Kernels replayed from a CUDA graph report the same way: the record and the flag are
allocated at the first (eager) launch and stay put.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from fuser.errors import OutOfBoundsError
from fuser.ir.guards import message

EMPTY = 2**63 - 1  # a record word no bad element has lowered
CLAMPED = 2**31 - 1  # the largest element index a record word holds

_lock = threading.RLock()
_gpu_flag: torch.Tensor | None = None  # pinned; every GPU kernel with checks writes it
_gpu_flag_view: np.ndarray | None = None  # the same memory, read without torch
_cpu_flag: torch.Tensor | None = None
# (kernel, device) of every record on a GPU: what a raised flag makes the host read
_gpu_records: list[tuple[weakref.ref, torch.device]] = []


def _flag(device: torch.device) -> torch.Tensor:
    global _gpu_flag, _gpu_flag_view, _cpu_flag
    if device.type != "cuda":
        if _cpu_flag is None:
            _cpu_flag = torch.zeros(1, dtype=torch.int64)
        return _cpu_flag
    if _gpu_flag is None:
        # cudaHostAlloc'd: under unified addressing its pointer is valid on every GPU
        flag = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        _gpu_flag_view = flag.numpy()
        _gpu_flag = flag
    return _gpu_flag


def check_args(kernel: Any, device: torch.device) -> list[torch.Tensor]:
    """[error record, flag]: the arguments `kernel` (which has checks) takes on `device`
    after its tensors and workspaces. Made on the kernel's first launch there."""
    got = kernel._records.get(device)
    if got is None:
        with _lock:
            got = kernel._records.get(device)
            if got is None:
                words = 2 * len(kernel.spec.checks)
                record = torch.full((words,), EMPTY, dtype=torch.int64, device=device)
                got = kernel._records[device] = [record, _flag(device)]
                if device.type == "cuda":
                    _gpu_records.append((weakref.ref(kernel), device))
    return got


def _decode(words: list[int]) -> tuple[int, int, int | None] | None:
    """(check, element, value) of the first check a record's words report, or None. The
    value is None where the element index was clamped (its two halves may then come
    from two different elements)."""
    for check in range(len(words) // 2):
        low, high = words[2 * check], words[2 * check + 1]
        if low == EMPTY:
            continue
        element = low >> 32
        value = ((high & 0xFFFFFFFF) << 32) | (low & 0xFFFFFFFF)
        value -= 2**64 if value >= 2**63 else 0
        return check, element, None if element == CLAMPED else value
    return None


def _error(kernel: Any, found: tuple[int, int, int | None], origin: str) -> OutOfBoundsError:
    check, element, value = found
    return OutOfBoundsError(message(kernel.spec.checks[check], element, value, origin))


def raise_claimed(kernel: Any, record: torch.Tensor) -> None:
    """After a CPU launch of `kernel`: raise the error its record holds, if any."""
    found = _decode(record.tolist())
    if found is not None:
        record.fill_(EMPTY)
        raise _error(kernel, found, f"found by kernel {kernel.name}")


def poll() -> None:
    """Raise an error that a GPU kernel has reported (read from pinned memory: no
    synchronization unless one is there). Every fuser call starts with it."""
    if _gpu_flag_view is not None and _gpu_flag_view[0]:
        _raise_reported()


def check_errors() -> None:
    """Wait for every GPU that ran a kernel with checks, then raise the first bad index
    one reported (an OutOfBoundsError naming the kernel, the element and the value)."""
    if _gpu_flag_view is None:
        return
    for device in {d for _, d in _gpu_records}:
        torch.cuda.synchronize(device)
    poll()


def _raise_reported() -> None:
    with _lock:
        for device in {d for _, d in _gpu_records}:
            torch.cuda.synchronize(device)
        found = None
        for ref, device in _gpu_records:
            kernel = ref()
            if kernel is None:
                continue
            record = kernel._records[device][0]
            reported = _decode(record.tolist())
            if reported is not None:
                record.fill_(EMPTY)
                found = found or (kernel, reported)
        assert _gpu_flag_view is not None
        _gpu_flag_view[0] = 0
        _gpu_records[:] = [(r, d) for r, d in _gpu_records if r() is not None]
    if found is None:
        # the flag was raised but no live kernel holds a record: the kernel that found
        # the bad index was freed since (its graph recompiled or reset). Say so rather
        # than clear the flag in silence: its outputs were computed from a bad index.
        raise OutOfBoundsError(
            "a fuser kernel on the GPU reported an out-of-range index, but the kernel has "
            "been freed since (its compiled graph was recompiled or reset), so which "
            "element and value are unknown; its results were computed from a bad index"
        )
    kernel, reported = found
    origin = (
        f"reported by kernel {kernel.name} on the GPU (raised by the first fuser call "
        "after it ran, or by fuser.check_errors())"
    )
    raise _error(kernel, reported, origin)
