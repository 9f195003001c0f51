"""How far float32 rounding alone can move a program's results: the float64 program run
again with every op's result nudged by a float32-sized relative error.

Eager float32's distance from float64 understates that where eager happens to compute a
quantity in a form that cancels exactly (the gradient of a bias broadcast along a softmax's
own dim is 0 for any input; eager's float32 gets ~1e-15, any other summation order ~1e-7
of its terms). Under `Perturbed`, each ATen op that makes a new tensor (not a view, not
written in place) has its floating operands and results multiplied by 1 + d, d uniform in
+-ULPS float32 ulps, forward and backward alike: the spread of such runs is the
sensitivity of each result to rounding anywhere in the program, whatever order a
compiler sums in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from fuser.dynamo.tidy import is_view

ULPS = 2.0
EPS32 = 2.0**-24  # a float32 unit roundoff


def _new_result(func: Any) -> bool:
    """Whether `func` returns fresh tensors (no alias of an argument, nothing in place)."""
    return not func._schema.is_mutable and not is_view(func)


class Perturbed(TorchDispatchMode):
    """Nudge every fresh floating result by up to ULPS float32 ulps (see the module
    docstring); `seed` fixes the nudges."""

    def __init__(self, seed: int):
        super().__init__()
        self.gen = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not _new_result(func):
            return func(*args, **(kwargs or {}))
        # the operands too: a composite op (layer_norm) computes exactly inside, where a
        # compiler's decomposition rounds (x - mean of a constant row is 0 only exactly)
        args, kwargs = tree_map(self._nudge, (args, kwargs or {}))
        out = func(*args, **kwargs)
        inputs = {id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        return tree_map(lambda t: t if id(t) in inputs else self._nudge(t), out)

    def _nudge(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        if t.device.type != "cpu" or t.numel() == 0:
            return t
        d = torch.rand(t.shape, generator=self.gen, dtype=t.dtype) * 2 - 1
        return t * (1 + d * (ULPS * EPS32))
