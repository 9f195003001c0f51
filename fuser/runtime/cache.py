"""The on-disk cache: atomic writes, checksummed entries, stale or corrupt ones rebuilt."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from fuser.config import config
from fuser.version import __version__


def versions() -> dict[str, str]:
    import torch  # heavy: only when a cache entry is read or written
    import triton

    return {"fuser": __version__, "torch": torch.__version__, "triton": triton.__version__}


def digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def cache_root() -> Path:
    return config.cache_dir


def load_entry(kind: str, key: str) -> dict | None:
    """A cached JSON entry, or None when missing, corrupt, or built by other versions."""
    if not config.disk_cache:
        return None
    path = cache_root() / kind / f"{key}.json"
    try:
        raw = json.loads(path.read_text())
        body, check = raw["body"], raw["checksum"]
        if digest(json.dumps(body, sort_keys=True)) != check or raw["versions"] != versions():
            return None
        return body
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_entry(kind: str, key: str, body: dict) -> None:
    if not config.disk_cache:
        return
    raw = {
        "versions": versions(),
        "checksum": digest(json.dumps(body, sort_keys=True)),
        "body": body,
    }
    try:
        atomic_write(cache_root() / kind / f"{key}.json", json.dumps(raw).encode())
    except OSError:
        pass  # a read-only or full disk only costs a rebuild next time
