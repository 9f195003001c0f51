"""Run a random program (generate.py) eager and through torch.compile(backend="fuser"),
forward and backward, and judge the difference.

The reference is eager in float64. The noise is the largest distance from it of eager
float32 and of two float64 runs with every op's result nudged by float32-sized errors
(noise.py: rounding anywhere, in any order); a result of fuser passes where its distance
is within NOISE_FACTOR times the noise plus a floor (FLOOR, relative to the tensor's
largest magnitude). A result that differs is checked against aot_eager (Dynamo and
AOTAutograd without a compiler): where that is as far off, the program shows a bug of
torch's, not fuser's (`as_aot_eager`). Under bf16 autocast (`amp`) the
reference is eager float32 without autocast, and eager's autocast run joins the nudged
float64 runs as noise: fuser may be as far from float32 as autocast and rounding move it,
with bf16's floor, and no further.

Each program is called three times with new values (the same shapes and layouts): the
first call plans, later ones run the generated call program, whose memory plan and
launch arguments only a second call exercises. A fourth call has a batch one larger where
eager takes it: Dynamo recompiles with a symbolic batch, which fuser specializes at run
time. The backward's upstream gradients are random too. NaN and infinity must sit where
the reference has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812  (the programs' own spelling)

from fuser.fuzz.programs.builder import Input, Program
from fuser.fuzz.programs.noise import Perturbed

NOISE_FACTOR = 8.0
FLOOR = {torch.float32: 2e-5, torch.bfloat16: 2e-3}
SCALE_FLOOR = 1e-3  # the smallest magnitude a distance is taken relative to
CALLS = 3
IGNORED = -100  # cross-entropy's ignore_index, given to some targets


@dataclass
class Verdict:
    """What one program did: `ok`, or `problem` (the first mismatch or the error) with
    `detail`; `regions`: fused regions fuser made (0: it left the program to ATen)."""

    seed: int
    ok: bool
    problem: str = ""
    detail: str = ""
    regions: int = 0
    as_aot_eager: bool = False  # aot_eager is as far off: torch's bug, not fuser's
    resized: bool = False  # a call with a batch one larger ran (and passed)
    fallbacks: list[str] = field(default_factory=list)  # regions left to ATen, and why
    checked: list[str] = field(default_factory=list)


def _storage(spec: Input, g: torch.Generator, device: str) -> torch.Tensor:
    shape = spec.shape
    if spec.kind == "ids":
        t = torch.randint(0, spec.high, shape, generator=g)
        if spec.ignore and t.numel() > 1:  # a cross-entropy target ignored
            t[torch.randint(0, t.numel(), (1,), generator=g)] = IGNORED
        return t.to(device)
    if spec.kind == "positive":
        return (torch.rand(shape, generator=g) + 0.5).to(device)
    if spec.layout == "transposed":
        base = torch.randn(shape[:-2] + (shape[-1], shape[-2]), generator=g)
        return base.to(device).transpose(-1, -2)
    if spec.layout == "sliced" and shape:
        base = torch.randn(shape[:-1] + (shape[-1] + 3,), generator=g)
        return base.to(device)[..., 1 : 1 + shape[-1]]
    if spec.layout == "offset":
        return torch.randn(math.prod(shape) + 1, generator=g).to(device)[1:].view(shape)
    return torch.randn(shape, generator=g).to(device)


def make_inputs(program: Program, seed: int, device: str) -> list[torch.Tensor]:
    """Float32 inputs of `program` in the layouts it asks for, drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    return [_storage(spec, g, device) for spec in program.inputs]


def _leaves(inputs: list[torch.Tensor], program: Program, dtype: torch.dtype) -> list[torch.Tensor]:
    """Fresh copies of the float inputs in `dtype`, each in its input's layout (strides,
    storage offset), requiring grad where the program says."""
    out = []
    for t, spec in zip(inputs, program.inputs):
        if spec.kind == "ids":
            out.append(t)
            continue
        size = t.untyped_storage().nbytes() // t.element_size()
        leaf = torch.empty(size, dtype=dtype, device=t.device)
        leaf = leaf.as_strided(t.shape, t.stride(), t.storage_offset())
        leaf.copy_(t)
        out.append(leaf.requires_grad_(spec.grad))
    return out


def _run(
    fn: Any, args: list[torch.Tensor], program: Program, ups_seed: int, amp: bool
) -> dict[str, Any]:
    """By name: the forward's outputs, the gradient of every input that requires grad
    (None where it gets none) for random upstream gradients drawn from `ups_seed`, and
    the inputs that do not, after the call (a program may change them in place)."""
    dev = args[0].device.type
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
        outs = list(fn(*args))
    got: dict[str, Any] = {f"output {i}": o.detach() for i, o in enumerate(outs)}
    wrt = [(s.name, a) for s, a in zip(program.inputs, args) if a.requires_grad]
    diff = [o for o in outs if o.requires_grad]
    g = torch.Generator().manual_seed(ups_seed)
    ups = [torch.randn(o.shape, generator=g).to(o) for o in diff]
    if wrt and diff:
        grads = torch.autograd.grad(diff, [a for _, a in wrt], ups, allow_unused=True)
        got.update({f"grad {n}": gr for (n, _), gr in zip(wrt, grads)})
    for spec, a in zip(program.inputs, args):
        if spec.kind != "ids" and not a.requires_grad:
            got[f"input {spec.name} after the call"] = a
    return got


def _distance(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| over the reference's largest magnitude (at least SCALE_FLOOR); inf
    where NaN or infinity differ in place."""
    got, ref = got.double(), ref.double()
    if (got.isnan() != ref.isnan()).any():
        return math.inf
    inf = ref.isinf()
    if (got[inf] != ref[inf]).any() or got[~inf].isinf().any():
        return math.inf
    fin = ref.isfinite()
    if not fin.any():
        return 0.0
    g, r = got[fin], ref[fin]
    # a floor on the scale: a variance of equal values is 0 exactly in float64 and a few
    # ulps of the values in float32, however it is summed
    scale = max(r.abs().max().item(), SCALE_FLOOR)
    return (g - r).abs().max().item() / scale


def _compare(got: dict, noise_runs: list[dict], ref: dict, floor: float) -> tuple[str, str, str]:
    """(problem, detail, the result's name) of the first result of `got` out of the noise
    of `noise_runs` around `ref`; empty strings where all agree."""
    eager = noise_runs[0]
    if list(got) != list(ref):
        return f"results {list(got)}, eager's {list(ref)}", "", ""
    for name, r in ref.items():
        a, n = got[name], eager[name]
        if r is None or a is None:
            if (a is None) != (r is None):
                return f"{name}: {'no' if a is None else 'a'} gradient, unlike eager", "", name
            continue
        if a.shape != r.shape:
            return f"{name}: shape {tuple(a.shape)}, eager {tuple(r.shape)}", "", name
        if a.dtype != n.dtype:
            return f"{name}: dtype {a.dtype}, eager {n.dtype}", "", name
        if not a.is_floating_point():
            # an argmax among near-equal values: where a run within the noise picks
            # another index than the reference, so may fuser
            unstable = torch.zeros(r.shape, dtype=torch.bool, device=r.device)
            for run in noise_runs:
                unstable |= run[name].to(r.device) != r
            wrong = (a != r) & ~unstable
            if wrong.any():
                places = int(wrong.sum())
                return f"{name} differs", f"{name}: integers differ at {places} places", name
            continue
        err = _distance(a, r)
        noise = max(_distance(run[name], r) for run in noise_runs)
        if err > NOISE_FACTOR * noise + floor:
            detail = f"{name}: relative distance {err:.3g} from the reference, noise {noise:.3g}"
            return f"{name} differs", detail, name
    return "", "", ""


def _aot_eager_too(
    fn: Any, base: list, program: Program, ups: int, amp: bool, ref: dict, name: str, got: dict
) -> bool:
    """Whether aot_eager's `name` is at least half as far from `ref` as fuser's."""
    if not name or got.get(name) is None or ref.get(name) is None:
        return False
    torch._dynamo.reset()
    try:
        other = _run(
            torch.compile(fn, backend="aot_eager"),
            _leaves(base, program, torch.float32),
            program,
            ups,
            amp,
        )
    except Exception:  # noqa: BLE001  (aot_eager failing is not fuser's result)
        return False
    o = other.get(name)
    if o is None or not o.is_floating_point():
        return o is not None and torch.equal(o.cpu(), got[name].cpu())
    return _distance(o, ref[name]) >= 0.5 * _distance(got[name], ref[name])


def _resized(program: Program) -> Program | None:
    """`program` with its batch dim one larger: every input x* whose first dim is the first
    input's (the batch) gets one more row. Eager decides later whether the program still
    runs (a reshape to a literal shape does not); None where there is no batch dim."""
    first = program.inputs[0].shape
    if not first or first[0] == 0:
        return None
    batch = first[0]
    inputs = [
        replace(i, shape=(batch + 1,) + i.shape[1:])
        if i.name.startswith("x") and i.shape and i.shape[0] == batch
        else i
        for i in program.inputs
    ]
    return replace(program, inputs=inputs)


def _call(
    v: Verdict, fn: Any, compiled: Any, program: Program, call: int, device: str, amp: bool
) -> bool:
    """One call of `compiled` on new inputs of `program`, judged; False where it failed
    (v says how)."""
    base = make_inputs(program, program.seed * 7919 + call, device)
    ups = program.seed * 31 + call
    wide = [t.cpu() for t in base]
    if amp:  # the reference: float32 without autocast; the noise: eager's autocast
        ref = _run(fn, _leaves(base, program, torch.float32), program, ups, False)
        noise_runs = [_run(fn, _leaves(base, program, torch.float32), program, ups, True)]
    else:
        ref = _run(fn, _leaves(wide, program, torch.float64), program, ups, False)
        noise_runs = [_run(fn, _leaves(base, program, torch.float32), program, ups, False)]
    for k in range(2):  # and rounding anywhere, in any order (noise.py)
        with Perturbed(program.seed * 3 + k):
            run = _run(fn, _leaves(wide, program, torch.float64), program, ups, False)
        noise_runs.append({n: t.to(device) if t is not None else None for n, t in run.items()})
    try:
        got = _run(compiled, _leaves(base, program, torch.float32), program, ups, amp)
    except Exception as e:  # noqa: BLE001  (every error of fuser's is a finding)
        v.ok, v.problem = False, f"call {call}: {type(e).__name__}"
        v.detail = str(e).strip().splitlines()[0][:400] if str(e).strip() else ""
        return False
    ref = {k: r.to(device) if r is not None else None for k, r in ref.items()}
    floor = FLOOR[torch.bfloat16 if amp else torch.float32]
    problem, detail, name = _compare(got, noise_runs, ref, floor)
    if problem:
        v.ok, v.problem, v.detail = False, f"call {call}: {problem}", detail
        v.as_aot_eager = _aot_eager_too(fn, base, program, ups, amp, ref, name, got)
        return False
    v.checked = list(got)
    return True


def judge(
    program: Program, backend: Any, device: str, amp: bool = False, dynamic: bool = False
) -> Verdict:
    """Compile `program` with `backend` (a FuserBackend; with symbolic sizes where
    `dynamic`, which fuser specializes at run time) and check CALLS calls of it, then one
    with a batch one larger where eager still runs the program: Dynamo recompiles that
    with a symbolic batch, as when a training loop's last batch is short."""
    scope: dict[str, Any] = {"torch": torch, "F": F}
    exec(compile(program.source, f"<program {program.seed}>", "exec"), scope)  # noqa: S102
    fn = scope["program"]
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic or None)
    v = Verdict(program.seed, True)
    before = len(backend.captures)
    ok = all(_call(v, fn, compiled, program, call, device, amp) for call in range(CALLS))
    bigger = _resized(program) if ok else None
    if bigger is not None:
        try:  # eager must take the new batch (a literal reshape may not)
            _run(
                fn, _leaves(make_inputs(bigger, 0, "cpu"), bigger, torch.float64), bigger, 0, False
            )
        except Exception:  # noqa: BLE001  (the program, not fuser)
            bigger = None
    if bigger is not None:
        v.resized = _call(v, fn, compiled, bigger, CALLS, device, amp)
    graphs = [g for c in backend.captures[before:] for g in c.graphs]
    v.regions = sum(len(g.fused) for g in graphs)
    v.fallbacks = [str(f) for g in graphs for f in g.fallbacks]
    return v
