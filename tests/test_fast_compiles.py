"""Fast compiles (fuser/runtime/precompile.py, cuda_backend.cubin_key, runtime/timing.py):
a graph's kernels compile in a pool to the same binaries as one by one, cubins round-trip
through the disk cache into a fresh process, a corrupt entry is rebuilt, the cache key
moves with each thing that changes the binary, and explain says where the first step's
time went. NVRTC compiles for sm_90 without a GPU."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fuser
from fuser import FusionDefinition
from fuser.config import config
from fuser.runtime import cache, cuda_backend, precompile, timing

ROOT = Path(__file__).resolve().parents[1]
F16 = torch.float16


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, dtype=F16, device="meta")


def _kernels() -> list:
    """A few CUDA kernels of different kinds (odd sizes)."""
    with FusionDefinition("fc_ln") as ln:
        x = ln.define_tensor([-1, -1], F16)
        w = ln.define_tensor([-1], F16)
        ln.add_output(ln.ops.layer_norm(x, w, None, 1e-5))
    with FusionDefinition("fc_gelu") as ge:
        ge.add_output(ge.ops.gelu(ge.define_tensor([-1, -1], F16)))
    with FusionDefinition("fc_sum") as su:
        su.add_output(su.ops.sum(su.define_tensor([-1, -1], F16), [0]))
    out = ln.compile([_meta(37, 1001), _meta(1001)], "h100", "cuda")
    out += ge.compile([_meta(9, 127)], "h100", "cuda")
    out += su.compile([_meta(515, 77)], "h100", "cuda")
    return out


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "disk_cache", True)
    cuda_backend.clear_memory_cache()
    yield tmp_path
    cuda_backend.clear_memory_cache()


def test_parallel_compile_gives_the_serial_binaries(fresh_cache: Path) -> None:
    kernels = _kernels()
    assert len(kernels) >= 3
    ledger = timing.Ledger()
    with timing.collecting(ledger):
        parallel = precompile.precompile(kernels, "cuda", n=3, arch="sm_90")
    assert not [r for r in parallel if isinstance(r, Exception)], parallel
    assert {k.origin for k in ledger.kernels} == {"compiled"} and ledger.workers == 3
    assert "compiling" in ledger.seconds
    cuda_backend.clear_memory_cache()
    config.disk_cache = False  # compile again, one by one
    serial = precompile.precompile(kernels, "cuda", n=1, arch="sm_90")
    assert [hashlib.sha256(c).hexdigest() for c in parallel] == [
        hashlib.sha256(c).hexdigest() for c in serial
    ]
    # the launcher's own call now finds them in memory
    for k, cubin in zip(kernels, serial):
        assert cuda_backend.compile_cubin(k.source, k.name, "sm_90") == cubin
        assert cuda_backend.last_compile[k.name].source == "memory"


def test_nothing_to_compile_for_the_cpu_interpreter() -> None:
    with FusionDefinition("fc_cpu") as fd:
        fd.add_output(fd.ops.gelu(fd.define_tensor([-1, -1])))
    kernels = fd.compile([torch.randn(3, 5)])
    assert kernels and precompile.precompile(kernels, "cpu") == []


_CHILD = textwrap.dedent(
    """\
    import hashlib, json, sys
    from fuser.runtime import cuda_backend
    src = sys.argv[1]
    cubin = cuda_backend.compile_cubin(src, "probe", "sm_90")
    print(json.dumps({"origin": cuda_backend.last_compile["probe"].source,
                      "sha": hashlib.sha256(cubin).hexdigest()}))
    """
)


def _child(folder: Path, source: str) -> dict:
    env = {**os.environ, "FUSER_CACHE_DIR": str(folder), "PYTHONPATH": str(ROOT)}
    env.pop("FUSER_DISABLE_DISK_CACHE", None)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, source], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_PROBE = 'extern "C" __global__ void probe(float* y) { y[threadIdx.x] = 2.0f; }\n'


def test_cubin_cache_round_trip_across_processes(tmp_path: Path) -> None:
    first = _child(tmp_path, _PROBE)
    assert first["origin"] == "nvrtc"
    second = _child(tmp_path, _PROBE)  # a fresh process: from disk, the same bytes
    assert second == {"origin": "disk", "sha": first["sha"]}


# a damaged entry, met with an empty memory cache (as a fresh process meets it; the
# round trip across processes is the test above): never trusted, rebuilt, rewritten
@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: {**raw, "body": {**raw["body"], "cubin": "AAAA" + raw["body"]["cubin"]}},
        lambda raw: {**raw, "checksum": "0" * 32},
        lambda raw: {**raw, "versions": {**raw["versions"], "triton": "0.0"}},
    ],
    ids=["cubin bytes", "checksum", "versions"],
)
def test_damaged_cubin_entry_is_rebuilt_and_rewritten(fresh_cache: Path, damage) -> None:
    def compiled() -> tuple[str, str]:
        cubin = cuda_backend.compile_cubin(_PROBE, "probe", "sm_90")
        return cuda_backend.last_compile["probe"].source, hashlib.sha256(cubin).hexdigest()

    origin, sha = compiled()
    assert origin == "nvrtc"
    (entry,) = (fresh_cache / "cuda").glob("*.json")
    entry.write_text(json.dumps(damage(json.loads(entry.read_text()))))
    cuda_backend.clear_memory_cache()
    assert compiled() == ("nvrtc", sha)  # never trusted: rebuilt
    cuda_backend.clear_memory_cache()
    assert compiled() == ("disk", sha)  # and rewritten


def test_cache_key_moves_with_each_input(monkeypatch: pytest.MonkeyPatch) -> None:
    src = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }\n'
    base = cuda_backend.cubin_key(src, "sm_90")
    assert cuda_backend.cubin_key(src, "sm_90") == base  # deterministic
    changed = {
        "source": cuda_backend.cubin_key(src + " ", "sm_90"),
        "capability": cuda_backend.cubin_key(src, "sm_80"),
    }
    monkeypatch.setattr(cuda_backend, "nvrtc_version", lambda: "99.9")
    changed["cuda"] = cuda_backend.cubin_key(src, "sm_90")
    monkeypatch.undo()
    monkeypatch.setattr(cuda_backend, "COMPILER", "bindings")
    changed["compiler"] = cuda_backend.cubin_key(src, "sm_90")
    monkeypatch.undo()
    monkeypatch.setattr(cuda_backend, "_options", lambda arch: [f"-arch={arch}"])
    changed["options"] = cuda_backend.cubin_key(src, "sm_90")
    monkeypatch.undo()
    for lib in ("fuser", "torch", "triton"):
        real = cache.versions()
        monkeypatch.setattr(cuda_backend, "versions", lambda r=real, n=lib: {**r, n: "0.0"})
        changed[lib] = cuda_backend.cubin_key(src, "sm_90")
        monkeypatch.undo()
    keys = list(changed.values())
    assert base not in keys and len(set(keys)) == len(keys), changed


def test_explain_shows_where_the_first_step_went() -> None:
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.GELU(), torch.nn.LayerNorm(24))
    compiled = torch.compile(model, backend="fuser")
    compiled(torch.randn(5, 8)).sum().backward()
    text = str(fuser.explain(model))
    line = next(ln for ln in text.splitlines() if ln.startswith("first step:"))
    for phase in ("tracing", "lowering", "first calls"):
        assert phase in line, line
    assert "planning (within lowering and first calls): passes" in text
    assert "scheduling" in text and "rendering" in text
    torch._dynamo.reset()


def test_ledger_text_counts_kernels_by_origin() -> None:
    ledger = timing.Ledger()
    with timing.collecting(ledger), timing.collecting(ledger):  # nested: counted once
        with timing.phase("lowering"):
            pass
        timing.kernel(timing.KernelTime("a", "cuda", "disk", 0.01))
        timing.kernel(timing.KernelTime("b", "cuda", "compiled", 0.5))
    timing.kernel(timing.KernelTime("c", "cuda", "compiled", 0.5))  # no ledger open
    text = ledger.text()
    assert "lowering" in text and "kernels: 2 (1 compiled, 1 disk)" in text, text
    assert text.index("b [cuda, compiled]") < text.index("a [cuda, disk]")
