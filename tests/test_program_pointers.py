"""Views that only kernels read are passed as pointers (fuser/dynamo/program/pointers.py):
the pointer a launch gets is the one the view tensor would have had, for views at an
offset, of other dtypes' sizes, transposed and folded from chains; a view that anything
else reads, or that the program returns, stays a tensor. Checked on hand-written steps
with real tensors: on CPU the kernels launch through the interpreter with tensors, so
the models' programs have no pointer launches to fold here."""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo.program.emit import emit_program
from fuser.dynamo.program.fold import fold_views
from fuser.dynamo.program.memory import plan_memory
from fuser.dynamo.program.pointers import pointer_views
from fuser.dynamo.program.step import Step
from fuser.dynamo.program.steps import Names, view_code

REINTERPRET = torch._C._dynamo.guards._reinterpret_tensor


def _view(name: str, base: str, shape, stride, offset: int) -> Step:
    view = ("reinterpret", tuple(shape), tuple(stride), offset)
    return Step("view", (name,), (base,), view_code(name, base, view), (base,), view=view)


def _launch(*names: str) -> Step:
    args = ", ".join(f"{n}.data_ptr()" for n in names)
    return Step("launch", (), names, f"record([{args}])")


def _run(steps: list[Step], inputs: list[str], returned: list[str], args: list) -> tuple:
    got: list = []
    names = Names(set(inputs) | {s for st in steps for s in st.defines})
    names.globals.update(record=got.append, reinterpret=REINTERPRET)
    result = "(" + "".join(f"{r}, " for r in returned) + ")"
    out = emit_program(
        "p", steps, plan_memory(steps, inputs, returned), names, inputs, result, {},
        torch.device("cpu"), lambda a: None,
    )  # fmt: skip
    return got, out.fn(list(args)), out.source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64])
def test_a_launch_gets_the_pointer_its_view_had(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 10, generator=g).to(dtype)[1:]  # a base at an offset
    steps = [
        _view("a", "x", (6, 4), (10, 1), 3),  # a slice at an offset
        _view("t", "a", (4, 6), (1, 10), 0),  # its transpose: a chain fold_views folds
        _view("r", "x", (60,), (1,), 0),  # a view at the base's own offset
        _view("s", "x", (2, 5), (20, 2), 11),  # a step slice
        _launch("t", "r", "s"),
        _launch("s", "x"),
    ]
    want, _, _ = _run(steps, ["x"], [], [x])
    folded = pointer_views(fold_views(steps, []), [], dict.fromkeys("atrs", dtype.itemsize))
    assert not any(s.kind == "view" for s in folded)
    got, _, source = _run(folded, ["x"], [], [x])
    assert got == want
    size = dtype.itemsize
    assert want[0][0] == x.data_ptr() + 3 * size and want[0][2] == x.data_ptr() + 11 * size
    assert f"x.data_ptr() + {11 * size}" in source  # readable: the base and a byte offset


def test_a_view_read_by_anything_else_or_returned_stays_a_tensor() -> None:
    x = torch.randn(4, 6)
    steps = [
        _view("a", "x", (6, 4), (1, 6), 0),
        _view("b", "x", (3, 6), (6, 1), 6),
        _view("c", "x", (24,), (1,), 0),
        _launch("a", "b", "c"),
        Step("call", ("d",), ("b",), "d = b.sum()"),  # b: read by an ATen call too
    ]
    itemsize = dict.fromkeys("abc", 4)
    folded = pointer_views(steps, ["c"], itemsize)  # c: returned
    assert [s.defines[0] for s in folded if s.kind == "view"] == ["b", "c"]
    want, _, _ = _run(steps, ["x"], ["c", "d"], [x])
    got, (c, d), _ = _run(folded, ["x"], ["c", "d"], [x])
    assert got == want
    torch.testing.assert_close(d, x[1:].sum())
    assert c.data_ptr() == x.data_ptr() and c.shape == (24,)
