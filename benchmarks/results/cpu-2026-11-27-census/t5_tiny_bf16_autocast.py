# ruff: noqa  (a record of the script as it was run)
import torch, re
from fuser.suite import models as suite
from fuser.suite.run import compiled
from fuser.dynamo import CAPTURES
from fuser.dynamo.program.census import census, programs_of, table

m = suite.build("t5", "tiny", "cpu")
kw = suite.batch("t5", "tiny", m, "cpu", 1)
sm, _ = compiled(m, "fuser")
for _ in range(2):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = sm(**kw).loss
    loss.backward()
progs = list(programs_of(CAPTURES))
print(table({"t5amp": census(progs)}, 12))
for p in progs:
    src = p.source.splitlines()
    for i, l in enumerate(src):
        if ".clone()" in l or "no clone" in l:
            print(p.name, "|", l.strip()[:150])
for p in progs:
    for l in p.source.splitlines():
        if "getitem_13 " in l or "getitem_13)" in l or "getitem_13," in l or "mm_36" in l:
            print(p.name[:12], "|", l.strip()[:160])
