"""The frontend op table (fuser/frontend/registry.py): it lists every fd.ops method that
computes on values, each entry's kernels match its torch reference on random data in its
domains, and what it tells the fuzzer and the op_db pass holds."""

from __future__ import annotations

import inspect
import math
import zlib
from typing import Any

import pytest
import torch
from op_registry import output_tolerance

from fuser import FusionDefinition
from fuser.frontend.ops import Ops
from fuser.frontend.registry import (
    BY_NAME,
    BY_OP,
    ENTRIES,
    ERRORS,
    KINDS,
    STRUCTURAL,
    OpEntry,
    random_operands,
    random_params,
)
from fuser.fuzz import patterns
from fuser.ir.dtypes import dtype_of
from fuser.ir.ops import COMPOSITE, ELEMENTWISE, REDUCE

# odd on purpose: 5 rows (a tail of row blocks), 37 columns (no power of two divides them,
# past one warp's 32); small, since the interpreter runs every program one after another
SHAPE = (5, 37)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_every_frontend_op_has_an_entry() -> None:
    methods = {n for n, f in inspect.getmembers(Ops, callable) if not n.startswith("_")}
    assert not set(BY_NAME) & STRUCTURAL
    assert methods == set(BY_NAME) | STRUCTURAL, (
        f"fd.ops methods without an entry: {sorted(methods - set(BY_NAME) - STRUCTURAL)}; "
        f"entries without an fd.ops method: {sorted(set(BY_NAME) | STRUCTURAL - methods)}"
    )
    # and every IR op that computes on values is some entry's
    assert set(BY_OP) == ELEMENTWISE | REDUCE | COMPOSITE
    assert len(BY_NAME) == len(ENTRIES) == len(BY_OP)


def test_entries_are_well_formed() -> None:
    groups = {"unary", "binary", "compare", "logical", "reduce", "composite"}
    for e in ENTRIES:
        assert e.kind in KINDS and e.error in ERRORS, e.name
        assert e.arity >= 1 and e.dtypes and e.calls and e.weight >= 1, e.name
        # a group the fuzzer draws from, or the pattern of its own name (where, cast)
        assert e.fuzz is None or e.fuzz in groups | set(patterns.PATTERN_FNS), e.name
    drawn = patterns.UNARY + patterns.BINARY + patterns.COMPARE + patterns.LOGICAL
    drawn += patterns.REDUCE + patterns.COMPOSITE
    assert set(drawn) == {e.name for e in ENTRIES if e.fuzz in groups}


def _reduced(entry: OpEntry, shape: tuple) -> int:
    """How many elements feed one output element, at most (the tolerance grows with it)."""
    return 1 if entry.kind == "elementwise" else math.prod(shape)


def _wide(xs: Any) -> Any:
    """The float tensors of a list, or of a dict's values, in float64."""
    if isinstance(xs, dict):
        return dict(zip(xs, _wide(list(xs.values()))))
    return [t.double() if t.is_floating_point() else t for t in xs]


def _outputs(result: Any) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]


def _call_id(call: dict) -> str:
    """dims=[0], keepdim=True -> 'dims0_keepdim'; no keyword arguments -> 'plain'."""
    parts = []
    for k, v in call.items():
        if isinstance(v, torch.dtype):
            v = dtype_of(v).short
        elif isinstance(v, list):
            v = "".join(str(d) for d in v)
        parts.append(k if v is True else f"{k}{v}")
    return "_".join(parts) or "plain"


# bugs this test found that fuser/codegen has yet to fix: (name, dtype, call id) -> a
# strict xfail mark saying what is known (none now: integer pow and log_softmax's masked
# lanes over dim 0 were the last, fixed)
KNOWN: dict[tuple, pytest.MarkDecorator] = {}


def _cases() -> list:
    cases = []
    for e in ENTRIES:
        for dtype in e.dtypes:
            for call in e.calls:
                key = (e.name, dtype, _call_id(call))
                name = f"{e.name}-{dtype_of(dtype).short}-{key[2]}"
                cases.append(pytest.param(e, dtype, call, id=name, marks=KNOWN.get(key, ())))
    return cases


@pytest.mark.parametrize("entry,dtype,call", _cases())
def test_kernels_match_the_reference(
    entry: OpEntry, dtype: torch.dtype, call: dict, request: pytest.FixtureRequest
) -> None:
    """fd.ops.<entry>(operands, **call) on random operands in the entry's domains (and its
    params, if any), run by fd.execute (Triton's interpreter on CPU) against the entry's
    torch reference (on the CPU, in float64)."""
    g = torch.Generator().manual_seed(zlib.crc32(request.node.name.encode()))
    inputs = random_operands(entry, SHAPE, dtype, g)
    params = random_params(entry, SHAPE, dtype, g)
    with FusionDefinition(f"table_{entry.name}") as fd:
        xs = [fd.from_torch(t) for t in inputs]
        outs = getattr(fd.ops, entry.name)(
            *xs, **{k: fd.from_torch(t) for k, t in params.items()}, **call
        )
        for out in _outputs(outs):
            fd.add_output(out)
    assert entry.op in fd.graph.ops(), f"fd.ops.{entry.name} adds no {entry.op}"
    # the float64 answer rounded once to eager's dtypes: eager's own half log_softmax on
    # CPU is 2-3 ulps off it, fuser's within one
    eager = _outputs(entry.reference(*inputs, **params, **call))
    exact = _outputs(entry.reference(*_wide(inputs), **_wide(params), **call))
    expected = [x.to(e.dtype) for x, e in zip(exact, eager)]
    got = fd.execute([t.to(DEVICE) for t in inputs + list(params.values())])
    extra = 2 if call.get("return_mean_rstd") else 0
    assert len(got) == len(expected) == entry.outputs + extra
    repro = f"repro: python -m pytest '{request.node.nodeid}'"
    for i, (a, e) in enumerate(zip(got, expected)):
        atol, rtol = output_tolerance(e.dtype, _reduced(entry, SHAPE))
        torch.testing.assert_close(
            a.cpu(),
            e,
            atol=atol,
            rtol=rtol,
            equal_nan=True,
            msg=lambda m, i=i: f"{entry.name}({call}) {dtype} output {i}: {m}\n{repro}",
        )


def test_op_db_reaches_every_entry_it_names() -> None:
    """Every ATen op an entry names is claimed by the lowering tables, and the op_db pass
    runs each OpInfo it names for them (a backward op's with gradients)."""
    from fuser.opdb.claims import claimed_ops, targets

    claims = claimed_ops()
    found, _ = targets()
    by_opinfo: dict[str, list] = {}
    for t in found:
        by_opinfo.setdefault(t.opinfo.name, []).append(t)
    for e in ENTRIES:
        assert set(e.aten) <= set(claims), (e.name, set(e.aten) - set(claims))
        assert e.opdb and e.aten, f"{e.name}: no OpInfo of op_db exercises it"
        for name in e.opdb:
            assert name in by_opinfo, f"{e.name}: OpInfo {name!r} is no op_db target"
            for t in by_opinfo[name]:
                assert set(e.aten) <= set(t.claims), (t.name, e.aten, t.claims)
                backward = any(claims[a].backward for a in e.aten)
                assert t.grad or not backward or not t.opinfo.supports_autograd, t.name
