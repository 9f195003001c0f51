"""The training suite of the benchmark (issue 20) on CPU: every op's tiny shape runs
through the interpreter for eager and fuser-triton, is checked against the fp32
reference, and leaves well-formed rows; the check catches a wrong gradient; the targets
table judges rows by the issue's bars."""

from __future__ import annotations

import json

import pytest
import torch

from fuser.bench import training_measure as tm
from fuser.bench.report import main as report_main
from fuser.bench.targets import bar, targets_table, verdict
from fuser.bench.training import OPS, VARIANTS, cases
from fuser.bench.training_run import main

ROW_KEYS = {"suite", "op", "variant", "shape", "impl", "ms", "gbps", "copy_gbps", "ok", "bytes"}


@pytest.fixture(scope="module")
def cpu_rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("training")
    assert main(["--suite", "training", "--cpu", "--out", str(out)]) == 0
    return [json.loads(x) for x in open(out / "results.jsonl")]


def test_every_case_runs_and_is_correct(cpu_rows) -> None:
    expected = {(op, v) for op in OPS for v in VARIANTS.get(op, [""])}
    for impl in ("eager", "fuser-triton"):
        rows = [r for r in cpu_rows if r["impl"] == impl]
        assert {(r["op"], r["variant"]) for r in rows} == expected
        for r in rows:
            assert ROW_KEYS <= set(r), set(ROW_KEYS) - set(r)
            assert r["ok"] is True, (r["op"], r["variant"], r["error"])
            assert r["suite"] == "training" and r["bytes"] > 0 and r["max_err"] < 0.05
    for r in cpu_rows:
        if r["impl"] == "fuser-triton":
            assert r["fuser_kernels"] >= 1 and r["schedule"] and not r["fell_back"]


def test_report_prints_the_targets_table(cpu_rows, tmp_path, capsys) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in cpu_rows))
    assert report_main([str(path)]) == 0
    text = capsys.readouterr().out
    for op in OPS:
        assert op in text
    assert "untimed" in text  # no GPU: no verdict on speed


def test_check_catches_a_wrong_gradient() -> None:
    case = next(cases(["layernorm_fwd_bwd"], tiny=True))
    inp = tm.leaves(case.make("cpu"))
    ref = tm.reference(case.fn, inp)
    got = tm.step(case.fn, inp)
    names = tm.output_names(1, inp)
    assert tm.check(got, ref, case.reduction_length, names)[0] is None
    bad = [g.detach().clone() for g in got]
    bad[2][3] += 0.25 * bad[2].abs().max()  # one element of dw off by a quarter of its scale
    wrong, _ = tm.check(bad, ref, case.reduction_length, names)
    assert wrong is not None and "grad(arg1)" in wrong
    assert "shape" in tm.check([bad[0][:1]] + bad[1:], ref, 1, names)[0]


def test_shapes_and_bytes_follow_the_issue() -> None:
    norms = list(cases(["layernorm_fwd_bwd"]))
    assert [c.cols for c in norms] == [768, 1024, 1600, 2048, 4096, 8192]
    assert norms[0].nbytes == 2 * 5 * 8192 * 768 + 2 * 2 * 2 * 768
    res = next(cases(["residual_layernorm_fwd_bwd"], ["768"]))
    assert res.nbytes == 2 * 8 * 8192 * 768 + 2 * 2 * 2 * 768
    ce = list(cases(["cross_entropy_fwd_bwd"], ["32768x50257"], ["float"]))
    assert len(ce) == 1 and ce[0].nbytes == 4 * 32768 * 50257 and ce[0].variant == "float"
    bias = list(cases(["bias_grad"]))
    assert len(bias) == 8 * 3
    assert {(c.rows, c.cols) for c in bias if c.rows == 32768} == {(32768, 768), (32768, 3072)}


def test_bars_and_verdicts() -> None:
    assert bar("layernorm_fwd_bwd", 8192, 768)[0] == 1800
    assert bar("rmsnorm_fwd_bwd", 8192, 1024)[0] == 2100
    assert bar("residual_layernorm_fwd_bwd", 8192, 1600)[0] == 2400
    assert bar("bias_grad", 8192, 2304)[0] is None  # dy is 36 MiB
    assert bar("bias_grad", 8192, 3072)[0] == 2600  # 48 MiB
    assert bar("cross_entropy_fwd_bwd", 8192, 128256)[0] is None
    row = {"op": "layernorm_fwd_bwd", "rows": 8192, "cols": 768, "ok": True, "ms": 1.0}
    peers = {"compile": {"gbps": 1500.0, "ok": True}, "liger": {"gbps": 2000.0, "ok": False}}
    assert verdict({**row, "gbps": 1900.0}, peers) == "PASS"  # a wrong Liger is left out
    assert verdict({**row, "gbps": 1700.0}, peers) == "FAIL (< 1800)"
    assert "<= compile" in verdict({**row, "gbps": 1400.0}, peers)
    assert verdict({**row, "ok": False, "error": "x"}, peers).startswith("FAIL")
    table = targets_table([{**row, "suite": "training", "variant": "", "impl": "fuser-triton",
                            "gbps": 1900.0, "copy_gbps": 3000.0}])  # fmt: skip
    assert "1/1 fuser rows PASS" in table


def test_no_gpu_says_so(capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["--suite", "training"]) == 2
    assert "--cpu" in capsys.readouterr().out
