"""The on-disk caches: generated Triton modules (runtime/triton_backend.py) and checksummed
entries (runtime/cache.py, used by the CUDA backend for cubins). A missing, truncated or
corrupt file is rebuilt, never trusted; writes are atomic."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fuser.config import config
from fuser.runtime import cache, triton_backend
from fuser.runtime.cache import atomic_write, digest, load_entry, store_entry

SOURCE = textwrap.dedent(
    """\
    import triton
    import triton.language as tl


    @triton.jit
    def fill(x_ptr, value):
        tl.store(x_ptr + tl.arange(0, 4), value + tl.zeros([4], tl.float32))
    """
)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache folder and an empty in-memory module table, restored afterwards."""
    monkeypatch.setattr(config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "disk_cache", True)
    monkeypatch.setattr(triton_backend, "_modules", {})
    yield tmp_path


def module_path(folder: Path, source: str = SOURCE) -> Path:
    return folder / "triton" / f"k_{digest(source)}.py"


def run_fill(module: object) -> torch.Tensor:
    device = "cpu" if triton_backend.use_interpreter() else "cuda"
    x = torch.zeros(4, device=device)
    module.fill[(1,)](x, 2.5)
    return x.cpu()


def load() -> object:
    return triton_backend.load_module(SOURCE, triton_backend.use_interpreter())


# -- generated Triton modules -------------------------------------------------------------
def test_module_written_once_and_reused(cache_dir: Path) -> None:
    module = load()
    path = module_path(cache_dir)
    assert path.read_text() == SOURCE
    assert torch.equal(run_fill(module), torch.full((4,), 2.5))
    stamp = path.stat().st_mtime_ns
    triton_backend._modules.clear()
    load()
    assert path.stat().st_mtime_ns == stamp, "an intact file is not rewritten"
    assert not list(path.parent.glob("*.tmp")), "no temporary files left behind"


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda s: s[: len(s) // 2], id="truncated"),
        pytest.param(lambda s: b"", id="empty"),
        pytest.param(lambda s: s.replace(b"2", b"3").replace(b"value", b"vaXue"), id="edited"),
        pytest.param(lambda s: b"\xff\xfe\x00\x80 not utf-8", id="binary"),
    ],
)
def test_corrupt_module_file_is_rebuilt(cache_dir: Path, corrupt: object) -> None:
    """A damaged k_<digest>.py is detected (compared byte for byte with the source) and
    rewritten before it is imported. The binary case raised UnicodeDecodeError before."""
    path = module_path(cache_dir)
    path.parent.mkdir(parents=True)
    path.write_bytes(corrupt(SOURCE.encode()))
    module = load()
    assert path.read_bytes() == SOURCE.encode()
    assert torch.equal(run_fill(module), torch.full((4,), 2.5))


def test_corrupt_bytecode_is_never_read(cache_dir: Path) -> None:
    """A .pyc next to the module whose header matches but whose body is garbage: the
    import system trusted it ("bad marshal data" on every later load); the module is now
    compiled from the source in hand and no .pyc is written."""
    path = module_path(cache_dir)
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE)
    st = path.stat()
    pyc = Path(importlib.util.cache_from_source(str(path)))
    pyc.parent.mkdir()
    header = importlib.util.MAGIC_NUMBER + b"\0\0\0\0"
    header += int(st.st_mtime).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(
        4, "little"
    )
    pyc.write_bytes(header + b"\x00garbage" * 8)
    module = load()
    assert torch.equal(run_fill(module), torch.full((4,), 2.5))
    pyc.unlink()
    triton_backend._modules.clear()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    code = "import sys; sys.dont_write_bytecode = False\n" + _LOAD_IN_CHILD
    _child(code, cache_dir, env)
    assert not list(cache_dir.rglob("*.pyc")), "generated modules leave no bytecode"


_LOAD_IN_CHILD = """
from fuser.runtime import triton_backend
from fuser.config import use_interpreter
import sys
source = open(sys.argv[1]).read()
module = triton_backend.load_module(source, use_interpreter())
assert module.fill is not None
print("loaded")
"""


def _child(code: str, folder: Path, env: dict | None = None) -> str:
    src = folder / "source.txt"
    src.write_text(SOURCE)
    env = dict(env or os.environ)
    env["FUSER_CACHE_DIR"] = str(folder)
    out = subprocess.run(
        [sys.executable, "-c", code, str(src)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_fresh_process_rebuilds_a_truncated_module(cache_dir: Path) -> None:
    """What a second process sharing FUSER_CACHE_DIR meets after a crash mid-write by a
    writer that did not write atomically (or a full disk): half a file."""
    load()
    path = module_path(cache_dir)
    path.write_bytes(SOURCE.encode()[:40])
    assert "loaded" in _child(_LOAD_IN_CHILD, cache_dir)
    assert path.read_text() == SOURCE


# -- checksummed entries (runtime/cache.py) ------------------------------------------------
BODY = {"name": "k0", "arch": "sm_90", "cubin": "AAECAw=="}


def entry_path(folder: Path, key: str = "abc") -> Path:
    return folder / "cuda" / f"{key}.json"


def test_entry_round_trip(cache_dir: Path) -> None:
    store_entry("cuda", "abc", BODY)
    assert load_entry("cuda", "abc") == BODY
    assert load_entry("cuda", "other") is None


def _tamper_body(raw: dict) -> dict:
    raw["body"]["cubin"] = "AAECBA=="
    return raw


def _other_versions(raw: dict) -> dict:
    raw["versions"]["torch"] = "0.0"
    return raw


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b"\xff\xfe\x00 not json", id="binary"),
        pytest.param(lambda b: b"[1, 2]", id="a list"),
        pytest.param(lambda b: b"null", id="null"),
        pytest.param(lambda b: json.dumps(_tamper_body(json.loads(b))).encode(), id="body"),
        pytest.param(lambda b: json.dumps(_other_versions(json.loads(b))).encode(), id="versions"),
        pytest.param(
            lambda b: json.dumps(
                {k: v for k, v in json.loads(b).items() if k != "checksum"}
            ).encode(),
            id="no checksum",
        ),
    ],
)
def test_damaged_entry_is_a_miss(cache_dir: Path, damage: object) -> None:
    store_entry("cuda", "abc", BODY)
    path = entry_path(cache_dir)
    path.write_bytes(damage(path.read_bytes()))
    assert load_entry("cuda", "abc") is None
    store_entry("cuda", "abc", BODY)  # the rebuild overwrites it
    assert load_entry("cuda", "abc") == BODY


def test_disabled_disk_cache_neither_reads_nor_writes(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_entry("cuda", "abc", BODY)
    monkeypatch.setattr(config, "disk_cache", False)
    assert load_entry("cuda", "abc") is None
    store_entry("cuda", "new", BODY)
    assert not entry_path(cache_dir, "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_cache_folder_only_costs_a_rebuild(cache_dir: Path) -> None:
    (cache_dir / "cuda").mkdir()
    (cache_dir / "cuda").chmod(0o500)
    try:
        store_entry("cuda", "abc", BODY)  # no exception
        assert load_entry("cuda", "abc") is None
    finally:
        (cache_dir / "cuda").chmod(0o700)


def test_atomic_write_never_shows_half_a_file(tmp_path: Path) -> None:
    """8 threads rewrite one file with different 1 MB payloads while a reader reads it:
    every read is one whole payload, and no temporary file is left."""
    path = tmp_path / "entry.bin"
    payloads = [bytes([i]) * (1 << 20) for i in range(8)]
    atomic_write(path, payloads[0])
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            seen.add(data[:1] + data[-1:] + len(data).to_bytes(4, "little"))

    def writer(i: int) -> None:
        for _ in range(5):
            atomic_write(path, payloads[i])

    r = threading.Thread(target=reader)
    r.start()
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    r.join()
    whole = {bytes([i, i]) + (1 << 20).to_bytes(4, "little") for i in range(8)}
    assert seen <= whole, "a reader saw a mixed or partial file"
    assert path.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["entry.bin"]


def test_digest_separates_its_parts() -> None:
    assert digest("ab", "c") != digest("a", "bc")
    assert digest(1) != digest("1")
    assert len(cache.digest("x")) == 32
