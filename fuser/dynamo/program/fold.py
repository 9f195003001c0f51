"""Views of views, folded: each view the program keeps is taken from the tensor whose
storage it reads, not through a chain of views nobody else reads.

A view step is `v = reinterpret(base, shape, strides, offset)`, the layout the first
call saw (steps.py), its offset counted from base's. A view whose base is itself a view
(or a clone written as a name, copies.py) that nothing else reads and the program does
not return is taken from that base's base instead, offsets added, and the inner view is
dropped: one reinterpret instead of two (transpose -> expand -> view chains of attention,
a reshape of a transpose). A view that nothing reads is dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from fuser.dynamo.program.step import Step
from fuser.dynamo.program.steps import view_code


def fold_views(steps: list[Step], returned: list[str]) -> list[Step]:
    """`steps` with chains of views folded and unread views dropped."""
    reads = Counter(u for s in steps for u in s.uses) + Counter(returned)
    link: dict[str, Step] = {}  # views and names that may be folded into a later view
    out: list[Step | None] = []
    where: dict[str, int] = {}
    for s in steps:
        if s.kind == "view" and len(s.uses) == 1:
            inner = link.get(s.uses[0])
            if inner is not None and reads[s.uses[0]] == 1:
                out[where[s.uses[0]]] = None  # read by this view only: folded into it
                s = _compose(inner, s)
            where[s.defines[0]] = len(out)
            link[s.defines[0]] = s
        out.append(s)
    kept = [s for s in out if s is not None]
    # a view nobody reads (the last read of its base was folded away, or none was)
    reads = Counter(u for s in kept for u in s.uses) + Counter(returned)
    kept = [s for s in kept if not (_is_link(s) and reads[s.defines[0]] == 0)]
    return _returned_views(kept, set(returned))


def _returned_views(steps: list[Step], returned: set[str]) -> list[Step]:
    """Views the program returns, made by as_strided, a view op: reinterpret's tensor
    shares its base's storage, but autograd does not know it as a view (no `_base`).
    Eager's expand of an intermediate has one, and Dynamo guards a later graph that takes
    it on its base's strides: the program's tensor failed that guard on every call after
    the first and recompiled that graph (marian's and pegasus's decoder masks)."""
    out = []
    for s in steps:
        if _is_link(s) and s.view is not None and s.defines[0] in returned:
            _, shape, stride, offset = s.view
            base, name = s.uses[0], s.defines[0]
            where = f"{base}.storage_offset() + {offset}"
            s = replace(s, code=f"{name} = {base}.as_strided({shape}, {stride}, {where})")
        out.append(s)
    return out


def _is_link(s: Step) -> bool:
    return s.kind == "view" and len(s.uses) == 1 and len(s.defines) == 1


def _compose(inner: Step, outer: Step) -> Step:
    """`outer` (a view or a name of inner's result) taken from inner's base instead."""
    base, name = inner.uses[0], outer.defines[0]
    if outer.view is not None and inner.view is not None:
        fn, shape, stride, offset = outer.view
        view = (fn, shape, stride, offset + inner.view[3])
    else:  # one of them is a name (an elided clone): the other's layout, as it is
        view = outer.view or inner.view
    if view is None:
        code = f"{name} = {base}"
        return replace(outer, uses=(base,), aliases=(base,), code=code)
    return replace(
        outer, uses=(base,), aliases=(base,), code=view_code(name, base, view), view=view
    )
