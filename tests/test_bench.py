"""The benchmark command's CPU smoke mode: every op runs through the interpreter and is
checked against eager; the sweep's candidates are legal and correct; files are written."""

from __future__ import annotations

import json

import pytest

from fuser.bench.__main__ import _sizes, main, parser
from fuser.bench.cases import OPS


def test_sizes_parse() -> None:
    assert _sizes("768,1600") == [768, 1600]
    assert _sizes("1024:2048:512") == [1024, 1536, 2048]


def test_help_names_every_op() -> None:
    text = parser().format_help()
    for op in OPS:
        assert op in text


def test_no_gpu_says_so(tmp_path, capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["--out", str(tmp_path)]) == 2
    assert "--cpu-smoke" in capsys.readouterr().out


def test_cpu_smoke_every_op(tmp_path) -> None:
    assert main(["--cpu-smoke", "--hidden", "37,100", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
    fuser_rows = [r for r in rows if r["impl"] == "fuser-triton"]
    assert {r["op"] for r in fuser_rows} == set(OPS)
    assert all(r["correct"] and r["schedule"] for r in fuser_rows)


def test_cpu_smoke_sweep(tmp_path) -> None:
    args = [
        "--cpu-smoke",
        "--sweep",
        "--ops",
        "ln_fused,bias_grad,cross_entropy_fwd_bwd",
        "--sweep-ops",
        "ln_fused,bias_grad,cross_entropy_fwd_bwd",
        "--hidden",
        "300",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
    sweep = [r for r in rows if r["impl"] == "sweep-triton"]
    kinds = {r["schedule"].split()[0] for r in sweep}
    assert {"inner_persistent", "outer_reduction"} <= kinds
    assert all(r["correct"] for r in sweep), [r["error"] for r in sweep if r["error"]]
    # a case whose fuser run finishes the fusion's outputs (the cross-entropy's row losses
    # into their mean) is swept with the same finish
    assert any(r["op"] == "cross_entropy_fwd_bwd" for r in sweep)
    # the heuristic's own choice is among the candidates, once per kernel
    assert sum(r["heuristic"] for r in sweep if r["op"] == "ln_fused") == 1


def test_regret_prefers_the_confirmed_timings() -> None:
    """The sweep's single quick timings pick the best; the re-timed medians decide."""
    from fuser.bench.report import regret

    def row(impl: str, ms: float, mine: bool, sched: str) -> dict:
        return {"op": "x", "shape": "8x64", "impl": impl, "kernel": "k0", "ms": ms,
                "heuristic": mine, "schedule": sched}  # fmt: skip

    swept = [row("sweep-cuda", 1.0, True, "h"), row("sweep-cuda", 0.5, False, "b")]
    (only,) = regret(swept)
    assert only["regret"] == pytest.approx(1.0) and not only["confirmed"]
    confirmed = [row("confirm-cuda", 0.9, True, "h"), row("confirm-cuda", 0.8, False, "b")]
    (both,) = regret(swept + confirmed)
    assert both["backend"] == "cuda" and both["confirmed"] and both["candidates"] == 2
    assert both["regret"] == pytest.approx(0.9 / 0.8 - 1)


def test_smoke_run_leaves_the_current_folder_alone(tmp_path, monkeypatch, capsys) -> None:
    """No --out: results go under fuser's cache folder (printed), not the current folder
    (a checkout); the table has a header row and a pass column."""
    from fuser.config import config

    here = tmp_path / "checkout"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(config, "cache_dir", tmp_path / "cache")
    assert main(["--cpu-smoke", "--ops", "bias_grad", "--hidden", "37"]) == 0
    assert list(here.iterdir()) == []
    out = tmp_path / "cache" / "bench" / "latest"
    assert (out / "results.jsonl").exists()
    lines = capsys.readouterr().out.splitlines()
    assert f"results -> {out}" in lines
    head = next(i for i, ln in enumerate(lines) if ln.startswith("op "))
    assert lines[head].split()[:4] == ["op", "shape", "impl", "pass"]
    row = lines[head + 1].split()
    assert row[:4] == ["bias_grad", "3x37", "fuser-triton", "ok"]


def test_pass_column() -> None:
    from fuser.bench.report import header, line

    col = header().index("pass")
    wrong = {"op": "x", "shape": "8x64", "impl": "fuser-triton", "error": "max |diff| 1"}
    right = {**wrong, "error": None, "correct": True}
    timing = {"op": "copy", "shape": "1GiB", "impl": "torch-copy", "gbps": 3e3, "copy_gbps": 3e3}
    assert [line(r)[col : col + 4].strip() for r in (wrong, right, timing)] == ["FAIL", "ok", ""]
