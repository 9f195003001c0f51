"""The random-fusion fuzzer in its CI budget, on both backends.

Split by subject: the fuzzer's own machinery is tested in test_fuzz_machinery.py, the
bugs it found in test_fuzz_found_codegen.py and test_fuzz_found_soak.py (a strict xfail
while a bug is open; fuser/fuzz/known.py lists the open ones so long runs count them
instead of stopping).

Longer runs: `python -m fuser.fuzz --seconds 600 --seed N` (see fuser/fuzz/__main__.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
from fuzz_helpers import DEVICE, cuda_backend_or_skip
from hypothesis import HealthCheck, Phase, given, settings

from fuser.fuzz.case import FuzzCase, build, repro
from fuser.fuzz.generator import CPU, GPU, fuzz_cases
from fuser.fuzz.known import known_issue
from fuser.fuzz.runner import check_case

# the interpreter on one core: 800 cases take ~117 s (2026-11-27; 230 s before interpreted
# launches stopped re-patching Triton per helper call, checking int32 overflow and folding
# float max/min element by element: runtime/triton_backend.py) (median case: 5 ops over
# 512 elements; 7% of rows 1000 to 50257 long); on a GPU every case compiles its kernels
CI_EXAMPLES = 800 if DEVICE == "cpu" else 100
# the CUDA C++ backend: ~1.3 s a case in the g++ emulator when it compiles (139 s), 7 s once
# its builds are cached (tempdir/fuser_emulate)
CUDA_CI_EXAMPLES = 100


# -- the CI fuzz budget -------------------------------------------------------------------
@pytest.mark.nonfinite  # its data holds NaN and inf, and its scales overflow exp and pow
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_random_fusions(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI_EXAMPLES random fusions (CUDA_CI_EXAMPLES on the CUDA backend), derandomized
    (the same ones every run), all agreeing with eager; the schedules they reached cover
    every scheduler kind. Without a GPU the CUDA kernels run in the g++ emulator."""
    examples = CI_EXAMPLES
    if backend == "cuda":
        examples = CUDA_CI_EXAMPLES
        cuda_backend_or_skip(monkeypatch)
    seen: Counter = Counter()
    fallbacks = []

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_cases(GPU if DEVICE == "cuda" else CPU, (backend,)))
    def one(case: FuzzCase) -> None:
        out = check_case(case, DEVICE, runs=2 if DEVICE == "cuda" else 1)
        assert out.status != "invalid", f"the generator made an invalid case: {out.problems}"
        if out.status != "ok" and known_issue("\n".join(out.problems), case):
            return  # a known bug, xfailed below
        assert out.status == "ok", "\n".join(out.problems) + "\n" + repro(case, device=DEVICE)
        seen.update(out.kinds)
        fallbacks.append(out.fallbacks)

    one()
    kinds = {"pointwise", "inner_persistent", "inner_looped", "outer_reduction"}
    assert kinds <= set(seen), f"schedule kinds reached: {dict(seen)}"
    if examples >= 800:  # the CPU's 800 cases; 100 may all fit one kernel
        assert any(fallbacks), "no fusion needed an ATen segment: the generator lost odd dims"


# -- the layout pattern -------------------------------------------------------------------
LAYOUT_OPS = ("slice", "pad", "cat")


def _uses_layout(case: FuzzCase) -> bool:
    return any(s.op in LAYOUT_OPS for s in case.steps)


def test_generator_draws_layout_cases() -> None:
    """Without focus, the generator draws the layout pattern (slices, pads and cats:
    fuzz/patterns.py `_layout`); with it, most cases hold one, with symbolic row sizes
    next to a static last dim, and some domains hold k * 1024 elements in rows that do not
    (where contiguous pointwise kernels run flattened: today's wrong rotary gradient)."""
    drawn: list[FuzzCase] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None)
    @given(fuzz_cases(CPU) | fuzz_cases(dataclasses.replace(CPU, focus="layout")))
    def one(case: FuzzCase) -> None:
        build(case)  # layout ops of a symbolic size would raise here
        drawn.append(case)

    one()
    layout = [c for c in drawn if _uses_layout(c)]
    assert len(layout) >= len(drawn) // 4, f"{len(layout)} of {len(drawn)}"
    assert any(i.symbolic and i.static_last for c in layout for i in c.inputs)
    flat = [c.domain for c in drawn if len(c.domain) >= 2 and math.prod(c.domain) % 1024 == 0]
    assert any(d[-1] % 1024 for d in flat), flat


@pytest.mark.nonfinite  # its data holds NaN and inf
def test_layout_cases_agree_with_eager() -> None:
    """A few cases drawn with the layout pattern in focus (in a few seconds on the
    interpreter) agree with eager; most of them slice, pad or cat."""
    profile = dataclasses.replace(CPU, focus="layout", gemm_pct=0)
    checked: list[FuzzCase] = []

    @settings(max_examples=12, deadline=None, derandomize=True, database=None)
    @given(fuzz_cases(profile, ("triton",)))
    def one(case: FuzzCase) -> None:
        out = check_case(case, DEVICE)
        assert out.status == "ok", "\n".join(out.problems) + "\n" + repro(case, device=DEVICE)
        checked.append(case)

    one()
    assert sum(map(_uses_layout, checked)) >= len(checked) // 2
