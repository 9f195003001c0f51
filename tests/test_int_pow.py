"""Integer pow as torch computes it, on both backends: exact, wrapping around in the
integer type (3**40 in int32), a negative tensor exponent giving 1, +-1 or 0, and a
negative Python int exponent refused at definition, as torch refuses it."""

from __future__ import annotations

import pytest
import torch

from fuser import FusionDefinition
from fuser.errors import DefinitionError

INTS = [torch.int32, torch.int64]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Bases in [-9, 9] (0, 1 and -1 included), exponents in [-3, 70): past 31 and 63
    bits, so results wrap around; the base non-contiguous (a transposed view), odd sizes."""
    base = torch.randint(-9, 10, (37, 5), generator=g).to(dtype).t()
    exp = torch.randint(-3, 70, (5, 37), generator=g).to(dtype)
    base[0, :9] = torch.tensor([0, 0, 0, 1, 1, -1, -1, 2, -2], dtype=dtype)
    exp[0, :9] = torch.tensor([0, 5, -2, -7, 64, -3, -4, 31, 63], dtype=dtype)
    return base.to(DEVICE), exp.to(DEVICE)


@pytest.mark.parametrize("dtype", INTS, ids=["i32", "i64"])
def test_integer_pow_matches_torch(backend: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    base, exp = _operands(dtype, g)
    with FusionDefinition("int_pow") as fd:
        a, b = fd.from_torch(base), fd.from_torch(exp)
        fd.add_output(fd.ops.pow(a, b))
        fd.add_output(fd.ops.pow(a, 13))  # a literal exponent: 9**13 wraps in int32
        fd.add_output(fd.ops.pow(-3, b))  # a literal base
        fd.add_output(fd.ops.add(fd.ops.pow(a, 2), b))  # pow feeding more integer math
    got = fd.execute([base, exp])
    want = [torch.pow(base, exp), torch.pow(base, 13), torch.pow(-3, exp), base**2 + exp]
    for i, (x, y) in enumerate(zip(got, want)):
        assert x.dtype == y.dtype, f"output {i}: {x.dtype}, torch {y.dtype}"
        torch.testing.assert_close(x, y, atol=0, rtol=0, msg=lambda m, i=i: f"output {i}: {m}")


def test_negative_python_int_exponent_is_refused() -> None:
    with FusionDefinition("int_pow_neg") as fd:
        x = fd.define_tensor([-1], torch.int32)
        with pytest.raises(DefinitionError, match="negative integer powers"):
            fd.ops.pow(x, -2)
        fd.add_output(fd.ops.pow(x, 2))  # a float exponent or a float base stays legal
        fd.add_output(fd.ops.pow(fd.ops.cast(x, torch.float32), -2))
    with pytest.raises(RuntimeError, match="negative integer powers"):
        torch.pow(torch.ones(1, dtype=torch.int32), -2)  # what the refusal mirrors


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_integer_pow_compiles_for_sm90(backend: str) -> None:
    """The interpreter runs any dtype through numpy; the GPU compilers check types (the
    float pow helper refused int32 only there until integer pow had its own)."""
    if backend == "cuda":
        pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC through cuda-python")
    from fuser.runtime.resources import cuda_resources, triton_resources

    with FusionDefinition("int_pow_sm90") as fd:
        x, y = (fd.define_tensor([-1, -1], torch.int64) for _ in range(2))
        fd.add_output(fd.ops.pow(x, y))
    meta = [torch.empty(64, 1024, dtype=torch.int64, device="meta") for _ in range(2)]
    (k,) = fd.compile(meta, device="h100", backend=backend)
    r = (triton_resources if backend == "triton" else cuda_resources)(k)
    assert r["spill_bytes"] == 0, r
