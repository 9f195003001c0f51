"""Plans kept on disk across processes (fuser/runtime/plan_cache.py): a fusion planned once
is read back, not planned again, and runs as before; what a plan depends on (an attribute
the printed graph leaves out, the alignment, a planning setting, fuser's own source)
makes another entry; a corrupt entry is a miss. The suite runs with the cache off
(conftest.no_plan_cache); these tests turn it on in a folder of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fuser import FusionDefinition
from fuser.config import config
from fuser.runtime import executor, plan_cache

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The plan cache on, in tmp_path; returns the names of the fusions planned afresh."""
    monkeypatch.setattr(config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "disk_cache", True)
    monkeypatch.setattr(config, "plan_cache", True)
    planned: list[str] = []
    original = executor._plan

    def counting(graph, inputs, name, *args):  # noqa: ANN001, ANN002, ANN202
        planned.append(name)
        return original(graph, inputs, name, *args)

    monkeypatch.setattr(executor, "_plan", counting)
    return planned


def _norm(which: str) -> FusionDefinition:
    """layer_norm with its one parameter as the weight or as the bias: the same text in
    graph_text (which leaves out `params`), a different kernel."""
    with FusionDefinition("norm") as fd:
        x = fd.define_tensor([-1, -1], torch.float32)
        p = fd.define_tensor([-1], torch.float32)
        fd.add_output(fd.ops.layer_norm(x, **{which: p}, eps=1e-5))
    return fd


def _inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, 40, generator=g).to(DEV), torch.randn(40, generator=g).to(DEV)]


def _want(which: str, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    kw = {"weight": p.double()} if which == "weight" else {"bias": p.double()}
    return torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), **kw, eps=1e-5)


def test_a_plan_is_read_back_not_made_again(cache: list[str]) -> None:
    x, w = _inputs()
    first = _norm("weight")
    (a,) = first.execute([x, w])
    second = _norm("weight")  # a new definition: as a new process would build it
    (b,) = second.execute([x, w])
    assert cache == ["norm"]  # planned once
    assert "read from the plan cache" in second.explain()
    assert [k.source for k in second.kernels] == [k.source for k in first.kernels]
    torch.testing.assert_close(b, a, rtol=0, atol=0)
    torch.testing.assert_close(b.double(), _want("weight", x, w), rtol=1e-5, atol=1e-5)


def test_what_the_printout_leaves_out_is_in_the_key(cache: list[str]) -> None:
    x, p = _inputs(1)
    for which in ("weight", "bias"):
        fd = _norm(which)
        (out,) = fd.execute([x, p])
        torch.testing.assert_close(out.double(), _want(which, x, p), rtol=1e-5, atol=1e-5)
    assert cache == ["norm", "norm"]  # the bias form was not read from the weight's entry


def test_alignment_settings_and_source_are_in_the_key(
    cache: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    x, w = _inputs(2)
    _norm("weight").execute([x, w])
    flat = torch.randn(6 * 40 + 1, device=DEV)
    shifted = flat[1:].view(6, 40)  # 4 bytes past a 16-byte boundary
    (out,) = _norm("weight").execute([shifted, w])
    torch.testing.assert_close(out.double(), _want("weight", shifted, w), rtol=1e-5, atol=1e-5)
    assert len(cache) == 2
    monkeypatch.setattr(config, "looped_stages", 3)  # a setting planning reads
    _norm("weight").execute([x, w])
    assert len(cache) == 3
    monkeypatch.setattr(plan_cache, "source_digest", lambda: "another fuser")
    _norm("weight").execute([x, w])
    assert len(cache) == 4
    monkeypatch.setattr(config, "plan_cache", False)  # off: planned every time
    _norm("weight").execute([x, w])
    _norm("weight").execute([x, w])
    assert len(cache) == 6


def test_launch_and_compile_settings_are_not_in_the_key(
    cache: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    x, w = _inputs(4)
    _norm("weight").execute([x, w])
    monkeypatch.setattr(config, "compile_workers", 3)  # no part of a plan
    monkeypatch.setattr(config, "launcher", "python")
    fd = _norm("weight")
    (out,) = fd.execute([x, w])
    assert cache == ["norm"] and "read from the plan cache" in fd.explain()
    torch.testing.assert_close(out.double(), _want("weight", x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_a_corrupt_entry_is_a_miss(cache: list[str], tmp_path: Path, damage: str) -> None:
    x, w = _inputs(3)
    _norm("weight").execute([x, w])
    (entry,) = (tmp_path / plan_cache.KIND).glob("*.pkl")
    raw = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        entry.write_bytes(raw[:-10] + bytes(b ^ 0xFF for b in raw[-10:]))
    else:
        entry.write_bytes(b"\x00" * 32 + b"not a pickle")
    fd = _norm("weight")
    (out,) = fd.execute([x, w])
    torch.testing.assert_close(out.double(), _want("weight", x, w), rtol=1e-5, atol=1e-5)
    assert cache == ["norm", "norm"] and "read from the plan cache" not in fd.explain()
    (again,) = _norm("weight").execute([x, w])  # written again: read back now
    assert cache == ["norm", "norm"]
    torch.testing.assert_close(again, out, rtol=0, atol=0)


def test_a_compiled_model_reads_its_plans_back(cache: list[str]) -> None:
    """A tiny GPT-2 step compiled twice (Dynamo reset between, as in a new process):
    the second lowering plans nothing and gives the first one's loss and gradients."""
    from fuser.dynamo import FuserBackend
    from fuser.examples.gpt2 import GPT, get_config

    results = []
    for _ in range(2):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = GPT(get_config("tiny")).to(DEV)
        backend = FuserBackend(strict=True)
        idx = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1)).to(DEV)
        _, loss = torch.compile(model, backend=backend)(idx[:, :-1], idx[:, 1:])
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()], len(cache)))
    (loss0, grads0, planned0), (loss1, grads1, planned1) = results
    assert planned0 > 0 and planned1 == planned0  # nothing planned the second time
    torch.testing.assert_close(loss1, loss0, rtol=0, atol=0)
    for g0, g1 in zip(grads0, grads1):
        torch.testing.assert_close(g1, g0, rtol=0, atol=0)


def test_the_interpreter_is_in_the_key(cache: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's renderer writes bf16 conversions (and tanh) for the CPU interpreter
    otherwise than for a GPU, on a device description that can be the same (a GPU host
    with TRITON_INTERPRET=1): a plan made for one is not read back for the other."""
    from fuser.config import use_interpreter

    def bf16_scale() -> FusionDefinition:
        with FusionDefinition("scale") as fd:
            x = fd.define_tensor([-1, -1], torch.bfloat16)
            fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.cast(x, torch.float32), 3.0), x.dtype))
        return fd

    x = [torch.empty(6, 40, dtype=torch.bfloat16, device="meta")]
    sources = []
    for interpreted in (use_interpreter(), not use_interpreter()):
        monkeypatch.setenv("TRITON_INTERPRET", "1" if interpreted else "0")
        (k,) = bf16_scale().compile(x, backend="triton")
        assert ("bf16_rne" in k.source) == interpreted
        sources.append(k.source)
    assert cache == ["scale", "scale"] and sources[0] != sources[1]


_CHILD = """
import torch
from fuser import FusionDefinition
with FusionDefinition("norm") as fd:
    x = fd.define_tensor([-1, -1], torch.float32)
    w = fd.define_tensor([-1], torch.float32)
    fd.add_output(fd.ops.layer_norm(x, weight=w, eps=1e-5))
g = torch.Generator().manual_seed(0)
x, w = torch.randn(6, 40, generator=g), torch.randn(40, generator=g)
(out,) = fd.execute([x, w])
want = torch.nn.functional.layer_norm(x, (40,), weight=w, eps=1e-5)
torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
print("from disk" if "read from the plan cache" in fd.explain() else "planned")
"""


def test_another_process_reads_the_plan(tmp_path: Path) -> None:
    """The promise itself: a second process (another hash seed: nothing in the key may
    depend on set or dict order of strings) reads the plan the first one wrote."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    said = []
    for seed in ("1", "2"):
        env = {
            **os.environ,
            "FUSER_CACHE_DIR": str(tmp_path),
            "FUSER_PLAN_CACHE": "1",
            "FUSER_DISABLE_DISK_CACHE": "0",
            "PYTHONHASHSEED": seed,
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
            "CUDA_VISIBLE_DEVICES": "",  # the interpreter in both
        }
        run = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr[-2000:]
        said.append(run.stdout.strip().splitlines()[-1])
    assert said == ["planned", "from disk"]


def test_the_folder_keeps_the_newest_entries(
    cache: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's first write prunes the folder to MAX_ENTRIES, the oldest written first;
    the entry just written stays and is read back."""
    import os

    folder = tmp_path / plan_cache.KIND
    folder.mkdir()
    for i in range(6):  # older entries, from other keys
        old = folder / f"old{i}.pkl"
        old.write_bytes(b"x")
        os.utime(old, (1000 + i, 1000 + i))
    monkeypatch.setattr(plan_cache, "MAX_ENTRIES", 3)
    plan_cache._prune_once.cache_clear()
    x, w = _inputs(4)
    _norm("weight").execute([x, w])
    left = sorted(p.name for p in folder.glob("*.pkl"))
    assert len(left) == 3 and {"old4.pkl", "old5.pkl"} < set(left), left
    fd = _norm("weight")
    fd.execute([x, w])
    assert cache == ["norm"] and "read from the plan cache" in fd.explain()
    plan_cache._prune_once.cache_clear()
