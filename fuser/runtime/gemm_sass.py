"""The warpgroup MMAs in a kernel's SASS, and the register hazards around them.

On sm_90 a wgmma (HGMMA in SASS) reads its register operands asynchronously: A's
fragment where A comes from registers, and the fp32 accumulator. Until a
WARPGROUP.DEPBAR retires its group, writing those registers (or reading the accumulator)
is undefined (PTX ISA, wgmma.mma_async). `hazards` walks the kernel's control flow with
the groups each path may still have in flight and lists every instruction that touches
such a register: what ptxas before CUDA 13.3 makes of Triton's pipelined register-A
wgmmas (Triton issue 9433: the next step's writes of the A fragment moved above the
wait). Reads what cuobjdump -sass prints; decides nothing, and needs no GPU.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Za-z0-9_.]+)\s*([^;]*);")
_REG = re.compile(r"(?<![\w.])R(\d+)")
_STORES = ("ST", "STS", "STG", "STL", "RED", "LDGSTS")  # their first operand is an address


class Instr(NamedTuple):
    addr: int
    pred: str  # "@P0 ", "@!PT " or ""
    op: str
    args: str

    def text(self) -> str:
        return f"/*{self.addr:04x}*/ {self.pred}{self.op} {self.args}".rstrip()


def parse(sass: str) -> list[Instr]:
    return [
        Instr(int(m.group(1), 16), m.group(2) or "", m.group(3), m.group(4).strip())
        for m in _LINE.finditer(sass)
    ]


def _width(op: str) -> int:
    """32-bit registers an operand of `op` spans (LDS.128: 4, IMAD.WIDE: 2)."""
    parts = op.split(".")
    if "128" in parts or parts[-1] in ("x4", "4") and parts[0] == "LDSM":
        return 4
    if "64" in parts or "WIDE" in parts or parts[0] == "CS2R" and "32" not in parts:
        return 2
    if parts[0] == "LDSM" and parts[-1] in ("x2", "2"):
        return 2
    return 1


def _span(token: str, width: int) -> set[int]:
    m = _REG.match(token.strip().lstrip("-|"))
    return set(range(int(m.group(1)), int(m.group(1)) + width)) if m else set()


def _writes(i: Instr) -> set[int]:
    base = i.op.split(".")[0]
    if base in _STORES or base.startswith(("HGMMA", "WARPGROUP", "BAR", "BRA", "DEPBAR")):
        return set()
    width = 4 if base == "HMMA" else _width(i.op)
    return _span(i.args.split(",")[0], width)


def _reads(i: Instr) -> set[int]:
    """The registers an instruction reads (its sources; a store's data at its width)."""
    base = i.op.split(".")[0]
    operands = i.args.split(",")
    sources = operands if base in _STORES else operands[1:]
    out: set[int] = set()
    for k, token in enumerate(sources):
        width = _width(i.op) if base in _STORES and k == len(sources) - 1 else 1
        for m in _REG.finditer(token):
            out |= set(range(int(m.group(1)), int(m.group(1)) + width))
    return out


def hgmma_operands(i: Instr) -> tuple[set[int], set[int]]:
    """(A's fragment registers, or none when A is a shared-memory descriptor; the
    accumulator's registers) of an HGMMA.64xNxK: 4 A registers, N/2 accumulators."""
    n = int(re.search(r"64x(\d+)x", i.op).group(1))
    parts = [p.strip() for p in i.args.split(",")]
    return _span(parts[1], 4), _span(parts[0], n // 2)


def register_a(sass: str) -> int:
    """How many HGMMAs read A from registers."""
    return sum(1 for i in parse(sass) if i.op.startswith("HGMMA") and hgmma_operands(i)[0])


def hazards(sass: str, limit: int = 200_000) -> list[str]:
    """Each (HGMMA, instruction) where the instruction writes a register the in-flight
    HGMMA reads (A's fragment, its accumulator) or reads its accumulator, on some path,
    before a WARPGROUP.DEPBAR.LE gsb0, n retires its group (all but the newest n)."""
    code = parse(sass)
    at = {ins.addr: k for k, ins in enumerate(code)}
    regs = {k: hgmma_operands(ins) for k, ins in enumerate(code) if ins.op.startswith("HGMMA")}
    found: dict[tuple[int, int], set[int]] = {}
    seen: set = set()
    work: list[tuple[int, tuple, tuple]] = [(0, (), ())]  # pc, closed groups, open group
    while work:
        state = work.pop()
        pc, groups, open_ = state
        if state in seen or pc >= len(code):
            continue
        seen.add(state)
        if len(seen) > limit:
            raise RuntimeError(f"gemm_sass.hazards: more than {limit} states")
        ins = code[pc]
        if not ins.op.startswith("HGMMA"):
            written, read = _writes(ins), _reads(ins)
            for h in [h for g in groups for h in g] + list(open_):
                a, acc = regs[h]
                bad = (written & (a | acc)) | (read & acc)
                if bad:
                    found.setdefault((h, pc), set()).update(bad)
        else:
            open_ = (*open_, pc)
            if "gsb0" in ins.args:
                groups, open_ = (*groups, open_), ()
        if ins.op.startswith("WARPGROUP.DEPBAR"):
            keep = int(re.search(r"0x([0-9a-f]+)", ins.args).group(1), 16)
            groups = groups[max(0, len(groups) - keep) :] if keep else ()
        never, always = ins.pred.startswith("@!PT"), ins.pred in ("", "@PT ")
        if never:
            work.append((pc + 1, groups, open_))
            continue
        if ins.op.startswith(("EXIT", "RET")) and always:
            continue
        if ins.op.startswith("BRA"):
            target = re.match(r"`?\(?[.\w]*\)?\s*0x([0-9a-f]+)", ins.args)
            if target and int(target.group(1), 16) in at:
                work.append((at[int(target.group(1), 16)], groups, open_))
            if always:
                continue
        work.append((pc + 1, groups, open_))
    return [
        f"{code[h].text()}  <-  {code[pc].text()}  (R{', R'.join(map(str, sorted(bad)))})"
        for (h, pc), bad in sorted(found.items())
    ]
