"""The one place fuser reads the environment.

FUSER_DEBUG   0 quiet; 1 one line per compiled fusion; 2 + the explain() report;
              3 + the graphs after every pass; 4 + the full generated source
FUSER_BACKEND default backend of fd.execute: "triton" (default) or "cuda"
FUSER_CACHE_DIR  where compiled kernels are cached on disk (default ~/.cache/fuser)
FUSER_DISABLE_DISK_CACHE  1 keeps the cache in memory only
FUSER_PAD_MATMULS  0 leaves torch.compile(backend="fuser") graphs' unaligned matmuls as they
              are (default 1: pad them, fuser/dynamo/pad_mm.py)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Config:
    debug: int
    backend: str
    cache_dir: Path
    disk_cache: bool
    pad_matmuls: bool


def _read() -> Config:
    return Config(
        debug=int(os.environ.get("FUSER_DEBUG", "0") or 0),
        backend=os.environ.get("FUSER_BACKEND", "triton"),
        cache_dir=Path(os.environ.get("FUSER_CACHE_DIR", Path.home() / ".cache" / "fuser")),
        disk_cache=os.environ.get("FUSER_DISABLE_DISK_CACHE", "0") in ("", "0"),
        pad_matmuls=os.environ.get("FUSER_PAD_MATMULS", "1") not in ("", "0"),
    )


config = _read()


def debug_print(level: int, text: str) -> None:
    """Print `text` when FUSER_DEBUG is at least `level`."""
    if config.debug >= level:
        print(text, flush=True)


def use_interpreter() -> bool:
    """Whether Triton kernels run in Triton's CPU interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _choose_triton_mode() -> None:
    # Triton decides interpreter-or-compiler when its modules are first imported, so the
    # choice is made here, before fuser imports Triton: no GPU means the interpreter.
    if "TRITON_INTERPRET" in os.environ:
        return
    import sys

    if "triton" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_choose_triton_mode()
