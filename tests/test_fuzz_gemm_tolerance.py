"""The GEMM fuzz checker's reference and tolerance (fuser/fuzz/gemm_check.py).

Fuser is judged against the exact result of the operands eager gives its matmul (A after
the prologue's cast and scale, rounded as eager and the template's prologue both round
it), not a float64 run that skips the casts: the operands' rounding is shared, and
charging it to both flagged fuser where eager's own error happened to cancel it. The GPU
soak of seed 26 (an H200) reported three such outputs, fuser the exactly rounded answer
at each; at their elements (their row of A and column of B, sliced from the cases' data)
they pass now, and an error of the size reported is still caught. The fp32 accumulation
allowance is per element, from the terms it sums, not the output's largest value."""

from __future__ import annotations

import torch

from fuser.fuzz.case import InputSpec
from fuser.fuzz.gemm import GemmCase, make_inputs
from fuser.fuzz.gemm_check import judge, references

F32, F16, BF16 = "float32", "float16", "bfloat16"


def _case(
    lines: tuple[str, ...], inputs: dict[str, InputSpec], seed: int, outputs: tuple = ()
) -> GemmCase:
    outputs = outputs or (lines[-1].split(" = ")[0],)
    return GemmCase(tuple(inputs), tuple(inputs.values()), lines, outputs, seed)


# the soak's three reports: the case, the element, and fuser's, eager's and the old
# float64 (casts skipped) values there, as the H200 printed them
SOAK = [
    (  # relu(y0 + r1) cancels to 0.0003 for x cast to fp16, to -0.002 in float64
        _case(
            (
                "y0 = F.linear(cast(x, 'float16'), w, b)",
                "y1 = y0 + r1",
                "y2 = y1 * (cast(m2 > 0.43, 'float16') * 1.25)",
                "y3 = torch.relu(y2)",
            ),
            {
                "x": InputSpec((2950, 33), F32, "row_sliced"),
                "w": InputSpec((4096, 33), F16),
                "b": InputSpec((4096,), F16, "strided"),
                "r1": InputSpec((2950, 4096), F16),
                "m2": InputSpec((2950, 4096), F32),
            },
            1,
        ),
        (245, 2907),
        (0.00037670135, 0.0, 0.0),
    ),
    (  # x cast to bf16 moves this element by 0.047: 456 elements flagged
        _case(
            ("y0 = (cast(x, 'bfloat16')) @ w",),
            {
                "x": InputSpec((1536, 257), F32, "strided"),
                "w": InputSpec((257, 3009), BF16, "strided"),
            },
            0,
        ),
        (1158, 869),
        (-0.21484375, -0.25976562, -0.26129242),
    ),
    (  # K = 4096: the fp16 cast moves y1 by 0.055, eager's cuBLAS was 0.057 off its operands
        _case(
            ("y0 = F.linear(cast(x, 'float16') * -1.5, w, b)", "y1 = y0 * 1.5"),
            {
                "x": InputSpec((4096, 4096), F32),
                "w": InputSpec((33, 4096), F16),
                "b": InputSpec((33,), F16),
            },
            374,
        ),
        (281, 22),
        (-2.2226562, -2.28125, -2.2798804),
    ),
]


def _at(case: GemmCase, row: int, col: int) -> list[torch.Tensor]:
    """The case's inputs cut to what element (row, col) of its output reads."""
    linear = case.lines[0].startswith("y0 = F.linear")
    out = []
    for name, t in zip(case.names, make_inputs(case)):
        if name == "x":
            t = t[row : row + 1]
        elif name == "w":
            t = t[col : col + 1] if linear else t[:, col : col + 1]
        elif name == "b":
            t = t[col : col + 1]
        else:
            t = t[row : row + 1, col : col + 1]
        out.append(t)
    return out


def _judge(refs, got: float, eager: torch.Tensor) -> list[str]:
    g = torch.tensor(got, dtype=eager.dtype).reshape(eager.shape)
    return judge(
        [g], [eager], refs.ref[:1], [m[:1] for m in refs.moved], [a[:1] for a in refs.accumulated]
    )


def test_the_soak_reports_pass_and_errors_of_their_size_are_caught() -> None:
    for n, (case, (row, col), (fuser, gpu_eager, float64)) in enumerate(SOAK):
        refs = references(case, _at(case, row, col))
        ref, eager = refs.ref[0].item(), refs.eager[0]
        # fuser gave the exactly rounded answer for its operands, within an output ulp
        assert abs(fuser - ref) <= torch.finfo(eager.dtype).eps * max(abs(ref), 1e-3), (n, ref)
        # the casts' rounding is what the float64 run charged to fuser
        assert abs(fuser - ref) < 0.1 * abs(fuser - float64), (n, ref)
        assert _judge(refs, fuser, eager) == [], n  # this eager: rounding only (CPU)
        gpu = torch.tensor(gpu_eager, dtype=eager.dtype).reshape(eager.shape)
        assert _judge(refs, fuser, gpu) == [], n  # the H200's (its partials rounded)
        if n == 0:
            continue  # 0.0004 is eager's own rounding of y0 (-1.622) there: any bound allows it
        wrong = ref + abs(fuser - float64) * (1 if fuser < float64 else -1)
        (msg,) = _judge(refs, wrong, eager)
        assert "1/1 element(s) out of tolerance" in msg, (n, msg)


def test_the_reference_reads_eagers_rounded_operands() -> None:
    """A cast to bf16 and a scale on A: the reference is the float64 product of exactly
    the bf16 operand eager computed (and the template's prologue computes alike)."""
    case = _case(
        ("y0 = (cast(x, 'bfloat16') * 0.37) @ w",),
        {"x": InputSpec((33, 257), F32, "strided"), "w": InputSpec((257, 45), BF16, "transposed")},
        3,
    )
    x, w = make_inputs(case)
    refs = references(case, [x, w])
    a = x.to(torch.bfloat16) * 0.37  # eager's operand, rounded twice
    assert torch.equal(refs.ref[0], a.double() @ w.double())
    assert refs.eager[0].dtype == torch.bfloat16 and refs.ref[0].dtype == torch.float64
    # skipping the casts moves it by more than an output rounding: what fuser was charged
    skipped = (x.double() * 0.37) @ w.double()
    assert ((skipped - refs.ref[0]).abs() > refs.ref[0].abs() * 2**-8).any()


def test_the_accumulation_allowance_is_per_element() -> None:
    """fp32 sums of K=512 terms, one row of A 1000x the others: the allowance of each
    element follows its own terms, so an error the large row's allowance would cover is
    caught in a small row (a bound from the output's largest value let it through)."""
    case = _case(
        ("y0 = x @ w",), {"x": InputSpec((40, 512), F32), "w": InputSpec((512, 24), F32)}, 5
    )
    x, w = make_inputs(case)
    x[7] *= 1000.0
    refs = references(case, [x, w])
    ref, eager = refs.ref[0], refs.eager[0]
    got = ref.float()
    assert judge([got], [eager], refs.ref, refs.moved, refs.accumulated) == []
    allowance = (refs.accumulated[0][0] - ref).abs()
    assert allowance[7].min() > 100 * allowance[:7].max()
    wrong = got.clone()
    wrong[3, 5] += float(allowance[7].min()) / 2  # within row 7's allowance, not row 3's
    (msg,) = judge([wrong], [eager], refs.ref, refs.moved, refs.accumulated)
    assert "1/960 element(s) out of tolerance; worst at (3, 5)" in msg, msg


def test_sums_beside_the_matmul_get_their_own_allowance() -> None:
    """dW with the bias gradient: db = dy.sum(0) over 301 rows is an accumulation too."""
    case = _case(
        ("y0 = dy.t() @ x", "db = dy.sum(0)"),
        {"dy": InputSpec((301, 37), BF16), "x": InputSpec((301, 29), BF16, "offset")},
        5,
        ("y0", "db"),
    )
    refs = references(case, make_inputs(case))
    db_ref, db_moved = refs.ref[1], refs.accumulated[0][1]
    assert ((db_moved - db_ref).abs() > 0).all()
    assert torch.allclose(refs.ref[1], make_inputs(case)[0].double().sum(0))
