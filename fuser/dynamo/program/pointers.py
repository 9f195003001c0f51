"""Views that only kernels read, passed as pointers: no view tensor is made for them.

A call program's launches pass each tensor as its pointer (`t.data_ptr()`, regions.py),
and a kernel is compiled for the layout the first call saw, strides included. So a view
`v = reinterpret(base, shape, strides, offset)` (steps.py) that nothing but launches
reads, and that the program does not return, needs no tensor at all: the launches take
`base.data_ptr() + offset * itemsize` instead, and the view step goes. What a view costs
is the tensor object (about a microsecond of host time each; T5 makes ~2200 a step, of
which about 40% only feed kernels). Alignment is what the first call saw: the program
already checks its inputs' pointers (emit.py), and the buffers it allocates are aligned
by the allocator.
"""

from __future__ import annotations

import re
from dataclasses import replace

from fuser.dynamo.program.step import Step


def pointer_views(steps: list[Step], returned: list[str], itemsize: dict[str, int]) -> list[Step]:
    """`steps` with each view that only direct launches read folded into their pointers.
    `itemsize`: bytes per element of each view (StepBuilder.itemsize)."""
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for u in set(s.uses):
            readers.setdefault(u, []).append(i)
    out = list(steps)
    dropped: set[int] = set()
    keep = set(returned)
    for i, s in enumerate(steps):
        if s.kind != "view" or s.view is None or len(s.defines) != 1 or len(s.uses) != 1:
            continue
        v, base = s.defines[0], s.uses[0]
        at = readers.get(v, [])
        if v in keep or v not in itemsize or not at:
            continue
        pointer = re.compile(rf"\b{re.escape(v)}\.data_ptr\(\)")
        if not all(out[j].kind == "launch" and pointer.search(out[j].code) for j in at):
            continue
        offset = s.view[3] * itemsize[v]
        shift = f" + {offset}" if offset > 0 else (f" - {-offset}" if offset < 0 else "")
        text = f"{base}.data_ptr(){shift}"
        for j in at:
            t = out[j]
            uses = tuple(dict.fromkeys(base if u == v else u for u in t.uses))
            code = pointer.sub(lambda _m, text=text: text, t.code)
            out[j] = replace(t, code=code, uses=uses)
        dropped.add(i)
    return [s for i, s in enumerate(out) if i not in dropped]
