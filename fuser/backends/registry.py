"""The backends by name: the one place a backend's name is looked up."""

from __future__ import annotations

from fuser.backends.base import Backend
from fuser.backends.cuda import CudaBackend
from fuser.backends.triton import TritonBackend
from fuser.errors import FuserError

BACKENDS: dict[str, Backend] = {b.name: b for b in (TritonBackend(), CudaBackend())}


def get_backend(backend: str | Backend) -> Backend:
    """The backend object for a name (or the object itself)."""
    if isinstance(backend, Backend):
        return backend
    found = BACKENDS.get(backend)
    if found is None:
        raise FuserError(f"unknown backend {backend!r}; expected one of {tuple(BACKENDS)}")
    return found
