"""Which ATen ops fuser claims, and the OpInfo entries of PyTorch's op_db that exercise them.

The claims come from the code: the lowering table (`LOWERINGS`, filled by the lowering
modules) and the ops the backend decomposes before lowering (`decompositions()`). An
OpInfo exercises a claimed op when its name, its last dotted name part or its aten_name is
the op's forward name: `native_layer_norm` -> `layer_norm`, `nll_loss_forward` ->
`nll_loss`, `gelu_backward` -> `gelu` (run with gradients). Some OpInfos carry another
name (ALSO): those the frontend op table (fuser/frontend/registry.py) lists for the ATen
ops that reach a frontend op (`x.double()` is _to_copy, relu's gradient is
threshold_backward, F.rms_norm is _fused_rms_norm), and those of the views (expand, view,
reshape), which have no entry there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import fuser.dynamo.support  # noqa: F401  (registers the lowerings)
from fuser.dynamo.backend import decompositions
from fuser.dynamo.context import LOWERINGS
from fuser.frontend.registry import ENTRIES

# the views' OpInfos named after the Python API (the op table has no entry for a view)
VIEWS = {"expand": ("expand_as", "broadcast_to"), "view": ("view_as",), "reshape": ("reshape_as",)}


def _also() -> dict[str, tuple[str, ...]]:
    also = dict(VIEWS)
    for e in ENTRIES:
        for a in e.aten:
            also[a] = also.get(a, ()) + e.opdb
    return also


# claimed ATen op (base name or forward name) -> the OpInfos that exercise it
ALSO = _also()


def _random(opinfo: Any) -> bool:
    """Random results cannot be compared with eager sample by sample."""
    return "dropout" in opinfo.name and not opinfo.name.endswith("_backward")


@dataclass(frozen=True)
class Claim:
    """One ATen op (base name) fuser takes: lowered directly or decomposed first."""

    name: str  # "add", "native_layer_norm", "gelu_backward"
    how: str  # "lowered" or "decomposed"
    overloads: tuple[str, ...]

    @property
    def forward(self) -> str:
        """The name of the op whose OpInfo exercises this one."""
        n = self.name.removeprefix("_").removeprefix("native_")
        for suffix in ("_backward_data", "_backward", "_forward"):
            n = n.removesuffix(suffix)
        return n

    @property
    def backward(self) -> bool:
        return "_backward" in self.name


def _base(target: Any) -> tuple[str, str] | None:
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name.split("::")[-1]
    return name, target._overloadname


def claimed_ops() -> dict[str, Claim]:
    """Every ATen op fuser claims, by base name, from the lowering and decomposition tables."""
    found: dict[tuple[str, str], set[str]] = {}
    for targets, how in ((LOWERINGS, "lowered"), (decompositions(), "decomposed")):
        for t in targets:
            b = _base(t)
            if b is not None:
                found.setdefault((b[0], how), set()).add(b[1])
    claims: dict[str, Claim] = {}
    for (name, how), overloads in sorted(found.items()):
        if name not in claims or how == "lowered":
            claims[name] = Claim(name, how, tuple(sorted(overloads)))
    return claims


@dataclass
class Target:
    """One OpInfo to run, and the claimed ops that brought it in."""

    opinfo: Any
    claims: list[str]
    grad: bool  # a claimed backward op maps to it: compare gradients too

    @property
    def name(self) -> str:
        v = self.opinfo.variant_test_name
        return self.opinfo.name + (f".{v}" if v else "")


def _keys(opinfo: Any) -> set[str]:
    return {opinfo.name, opinfo.name.split(".")[-1], opinfo.aten_name}


def targets(ops: list[str] | None = None) -> tuple[list[Target], list[str]]:
    """The OpInfos that exercise the claimed ops (or only `ops`: claimed names or OpInfo
    names), and the claimed ops no OpInfo exercises."""
    from torch.testing._internal.common_methods_invocations import op_db

    claims = claimed_ops()
    by_key: dict[str, list[Any]] = {}
    for o in op_db:
        if o.name.startswith("masked.") or _random(o):
            continue
        for k in _keys(o):
            by_key.setdefault(k, []).append(o)
    chosen: dict[int, Target] = {}
    orphans = []
    for c in claims.values():
        names = {c.name, c.forward, *ALSO.get(c.name, ()), *ALSO.get(c.forward, ())}
        # one OpInfo may answer to several of the names
        infos = list({id(o): o for n in names for o in by_key.get(n, [])}.values())
        if not infos:
            orphans.append(c.name)
        for o in infos:
            t = chosen.setdefault(id(o), Target(o, [], False))
            t.claims.append(c.name)
            t.grad |= c.backward and o.supports_autograd and c.name != o.name
    result = sorted(chosen.values(), key=lambda t: t.name)
    if ops:
        want = set(ops)
        result = [t for t in result if want & {t.name, t.opinfo.name, *t.claims}]
        orphans = [o for o in orphans if o in want]
    return result, orphans
