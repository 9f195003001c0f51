"""The call program's allocations on a GPU: straight from torch's allocator
(`torch._C._dynamo.guards._empty_strided_cuda`, what Inductor's wrapper calls: no
dispatcher, ~3 us less a buffer), which allocates on the current device, so the program
first checks the current device and takes the old path under another one. Emitted from
hand-made steps (the source is only compiled, not run: no GPU here)."""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo.program.emit import emit_program
from fuser.dynamo.program.memory import MemoryPlan
from fuser.dynamo.program.step import Step
from fuser.dynamo.program.steps import Names

CUDA1 = torch.device("cuda", 1)


def _steps(device: torch.device) -> list[Step]:
    return [
        Step("alloc", ("buf0",), (), alloc=((4, 6), (8, 1), torch.bfloat16, device)),
        Step("alloc", ("buf1",), (), alloc=((3,), (1,), torch.float32, torch.device("cpu"))),
        Step("launch", (), ("x", "buf0"), "pass  # a launch", on_stream=True, device=device),
    ]


def _source(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> str:
    # the CPU build has no CUDA stream getter: the program only binds it here
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda i: 0, raising=False)
    old_path_calls: list = []
    out = emit_program(
        "g", _steps(device), MemoryPlan(), Names({"x"}), ["x"], "buf0", {}, device,
        old_path_calls.append,
    )  # fmt: skip
    return out.source


def test_gpu_buffers_come_from_the_allocator_on_the_checked_device(monkeypatch) -> None:
    src = _source(CUDA1, monkeypatch)
    lines = [ln.strip() for ln in src.splitlines()]
    assert "if current_device() != 1:" in lines, src
    assert lines[lines.index("if current_device() != 1:") + 1] == "return old_path(args)"
    # the check comes before the inputs are released (the old path needs them)
    assert lines.index("if current_device() != 1:") < lines.index(
        "args.clear()  # each input is freed after its last use"
    )
    # rows 8 apart: the storage spans whole rows, 4 * 8 elements (runtime/buffers.py)
    assert "buf0 = reinterpret(empty_cuda((32,), (1,), bfloat16), (4, 6), (8, 1), 0)" in [
        ln.split("  #")[0] for ln in lines
    ], src
    # a buffer on another device keeps torch.empty_strided, with its device
    assert any(
        ln.startswith("buf1 = empty_strided((3,), (1,), dtype=float32, device=") for ln in lines
    )


def test_no_index_no_fast_path(monkeypatch) -> None:
    """`cuda` without an index says nothing of which device is current: torch.empty_strided."""
    src = _source(torch.device("cuda"), monkeypatch)
    assert "current_device" not in src and "empty_cuda" not in src, src
