"""Plans on disk: what executor.plan makes of a fusion for an input signature (its passes,
segments, schedules and rendered kernels), kept across processes so that a new process
compiling the same model does not plan it again (~0.3 s of a warm GPT-2 first step on the
H100 host; the kernels' binaries are Triton's and cuda_backend's own caches).

The key holds everything a plan is made from:
- the bound graph, as its pickle (every node, attribute and value, not a printout: the
  text form leaves out layer_norm's `params`, which says which input is the weight);
- the inputs' shapes, strides, dtypes and pointer alignment (not their device: a plan
  made at lowering for meta tensors is the one their first call runs);
- the fusion's name (kernel names), backend, device description and relaxed precision,
  the output strides asked for;
- the settings of fuser.config that may steer planning (all but the cache's own, debug,
  fp_warnings and how kernels are launched or compiled ahead),
  and whether Triton kernels run in the CPU interpreter (config.use_interpreter: the
  Triton renderer writes bf16 conversions and tanh for the interpreter otherwise than for
  a GPU, and a GPU host with TRITON_INTERPRET=1 plans for the same device);
- the digest of fuser's own source files, and the versions of torch and Triton: any
  change of the code that plans, schedules or renders makes a new key.

Not in the key: module constants or functions changed in place (a test's monkeypatch, a
benchmark's A/B through a patched constant): a process that does so runs with the cache
off (FUSER_PLAN_CACHE=0, config.plan_cache = False), or reads plans made without it.

An entry is a checksum and a pickle; a missing, truncated, corrupt or unreadable one is a
miss (and is written again), never an error. The folder keeps the newest MAX_ENTRIES
entries: a process's first write removes the oldest beyond them. FUSER_PLAN_CACHE=0
turns the cache off (the test suite does, since tests change planning functions in
place).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pickle
from pathlib import Path
from typing import Any

from fuser.config import config, use_interpreter
from fuser.runtime.cache import atomic_write, cache_root, digest, versions

KIND = "plans"
_CHECK = 32  # bytes of sha256 before the pickle
# config fields that do not change a plan (how kernels are launched or compiled ahead is
# no part of one: a process with other workers or another launcher reads the same plans)
_NOT_PLANNING = {
    "cache_dir",
    "debug",
    "disk_cache",
    "plan_cache",
    "fp_warnings",
    "launcher",
    "compile_workers",
    "compile_processes",
}


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 of fuser's own .py files (names and contents), once a process."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def enabled() -> bool:
    """Whether plans are read from and written to the disk (FUSER_PLAN_CACHE, and the
    disk cache as a whole: FUSER_DISABLE_DISK_CACHE)."""
    return config.disk_cache and config.plan_cache


def _settings() -> tuple:
    return tuple(
        (f.name, getattr(config, f.name))
        for f in dataclasses.fields(config)
        if f.name not in _NOT_PLANNING
    )


def plan_key(
    graph: Any,
    inputs: list[Any],
    name: str,
    backend: str,
    device: Any,
    relaxed: bool,
    out_strides: dict[int, tuple[int, ...]] | None,
    align: Any,
) -> str | None:
    """The entry's key, or None where the plan is not to be cached (the graph does not
    pickle). `align(t)` is the alignment build_specs plans `t` for."""
    try:
        graph_bytes = pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL)
        sig = tuple((tuple(t.shape), tuple(t.stride()), str(t.dtype), align(t)) for t in inputs)
    except Exception:  # an object that does not pickle, a non-tensor input
        return None
    outs = tuple(sorted(out_strides.items())) if out_strides else ()
    return digest(
        hashlib.sha256(graph_bytes).hexdigest(),
        sig,
        name,
        backend,
        repr(device),
        relaxed,
        outs,
        _settings(),
        use_interpreter(),
        source_digest(),
        versions(),
    )


def _path(key: str) -> Path:
    return cache_root() / KIND / f"{key}.pkl"


def load(key: str | None, kind: type) -> Any:
    """The cached plan under `key` (an instance of `kind`), or None."""
    if key is None:
        return None
    try:
        raw = _path(key).read_bytes()
        check, body = raw[:_CHECK], raw[_CHECK:]
        if hashlib.sha256(body).digest() != check:
            return None
        plan = pickle.loads(body)
    except Exception:  # missing, unreadable, truncated, from code that no longer loads
        return None
    return plan if isinstance(plan, kind) else None


def store(key: str | None, plan: Any) -> None:
    """Write `plan` under `key` (nothing on failure: a full or read-only disk only costs
    planning again next time). A process's first write also prunes the folder."""
    if key is None:
        return
    try:
        body = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        atomic_write(_path(key), hashlib.sha256(body).digest() + body)
    except Exception:
        return
    _prune_once(cache_root() / KIND)


# entries kept (~10 KB a fusion and input signature: a GPT-2 124M training step writes
# ~50); a process's first write removes the oldest written beyond them (every new source
# digest, shape or setting adds entries; symbolic sizes one per size)
MAX_ENTRIES = 4096


@functools.cache
def _prune_once(folder: Path) -> int:
    """Remove the oldest-written entries of `folder` beyond MAX_ENTRIES, once a process
    and folder; returns how many went (a file another process removed first is skipped)."""
    try:
        entries = sorted(folder.glob("*.pkl"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return 0
    gone = 0
    for path in entries[: max(0, len(entries) - MAX_ENTRIES)]:
        try:
            path.unlink()
            gone += 1
        except OSError:
            pass
    return gone
