"""PyTorch's op_db through the fuser backend, short form (the full pass: python -m fuser.opdb).

Every OpInfo that exercises an op fuser claims (claims from the lowering tables, see
fuser/opdb/claims.py) runs two samples per dtype (the first and the last, where op_db puts
its edge cases) in float32, float16 and bfloat16, compiled with
torch.compile(backend=FuserBackend(strict=True)) against eager; no sample may fail. An op
fuser cannot do correctly is declined by its lowering (a visible fallback), not skipped
here. Every failure message ends with the one-line command that reruns the sample.
"""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo import pointwise
from fuser.dynamo.context import LOWERINGS, NotLowerable
from fuser.opdb import DEFAULT_DTYPES, claimed_ops, run_target, targets
from fuser.opdb.run import FAILED, FALLBACK, PASSED, spread

SAMPLES = 2  # per target and dtype
TARGETS, NO_OPINFO = targets()
BY_NAME = {t.name: t for t in TARGETS}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_opinfo_samples_match_eager(name: str):
    report = run_target(BY_NAME[name], DEFAULT_DTYPES, "cpu", SAMPLES)
    failed = [s for s in report.samples if s.status == FAILED]
    lines = [f"{s.dtype} sample {s.index}: {s.detail}\n  repro: {s.repro}" for s in failed]
    assert not failed, f"{name} ({', '.join(report.claims)}):\n" + "\n".join(lines)


def test_claims_come_from_the_lowering_tables():
    claims = claimed_ops()
    assert claims["add"].how == "lowered" and "Tensor" in claims["add"].overloads
    assert claims["silu_backward"].how == "decomposed"
    assert claims["native_layer_norm_backward"].forward == "layer_norm"
    assert BY_NAME["nn.functional.gelu"].grad  # gelu_backward is claimed: grads compared
    assert not BY_NAME["abs"].grad
    # claimed ops no OpInfo exercises: views, casts and detach, which test_dynamo covers
    # (F.rms_norm's fused ops: nn.functional.rms_norm, from the frontend op table)
    allowed = {"_unsafe_view", "alias", "convert_element_type", "detach"}
    # fuser's own one-pass cross-entropy's backward, which test_cross_entropy_one_pass covers
    allowed |= {"cross_entropy_grad"}
    assert set(NO_OPINFO) <= allowed, NO_OPINFO


def test_a_wrong_lowering_is_a_failure_with_a_repro(monkeypatch):
    monkeypatch.setitem(pointwise.UNARY, torch.ops.aten.neg.default, "abs")
    report = run_target(BY_NAME["neg"], [torch.float32], "cpu", 1)
    (sample,) = report.samples
    assert sample.status == FAILED and "not close" in sample.detail
    assert sample.repro.startswith("python -m fuser.opdb --ops neg --dtypes float32")


def test_a_declined_op_is_a_fallback_with_its_reason(monkeypatch):
    def decline(ctx, node):
        raise NotLowerable("declined by the test")

    monkeypatch.setitem(LOWERINGS, torch.ops.aten.exp.default, decline)
    report = run_target(BY_NAME["exp"], [torch.float32], "cpu", 1)
    (sample,) = report.samples
    assert sample.status == FALLBACK and "declined by the test" in sample.detail
    monkeypatch.undo()
    assert run_target(BY_NAME["exp"], [torch.float32], "cpu", 1).samples[0].status == PASSED


def test_spread_keeps_the_first_and_last_samples():
    assert spread(7, 2) == [0, 6]
    assert spread(7, 3) == [0, 3, 6]
    assert spread(2, 5) == [0, 1]
    assert spread(5, 1) == [0] and spread(5, None) == [0, 1, 2, 3, 4]


def test_sharded_runs_merge_into_one_report(tmp_path, capsys):
    """`--shard K/N` runs add up with `--merge` to what one run reports."""
    import json

    from fuser.opdb.__main__ import main

    args = ["--ops", "neg", "abs", "sigmoid", "--dtypes", "float32", "--max-samples", "2"]
    assert main([*args, "--json", str(tmp_path / "all.json")]) == 0
    shards = [str(tmp_path / f"s{k}.json") for k in range(2)]
    for k, path in enumerate(shards):
        assert main([*args, "--shard", f"{k}/2", "--json", path]) == 0
    capsys.readouterr()
    assert main(["--merge", *shards, "--json", str(tmp_path / "merged.json")]) == 0
    assert "3 OpInfo targets" in capsys.readouterr().out

    def statuses(path):
        ops = json.loads((tmp_path / path).read_text())["ops"]
        return sorted(
            (s["target"], s["dtype"], s["index"], s["status"]) for r in ops for s in r["samples"]
        )

    assert statuses("merged.json") == statuses("all.json")
    assert len(statuses("all.json")) >= 3
