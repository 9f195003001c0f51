"""The outer (column) reduction's cost model against the H100 sweeps, offline (no GPU).

For every schedule an outer_sweep.py run timed, the model's prediction
(fuser.schedulers.outer.cost with the backend's register estimate); per form, shape and
backend: the rank correlation of predicted and measured times, the model's pick among the
measured schedules and its regret (its measured time / the fastest measured - 1; confirm
medians where the sweep re-timed a schedule, its quick time elsewhere).

    PYTHONPATH=. python benchmarks/outer_fit.py              # the table (the model as it is)
    PYTHONPATH=. python benchmarks/outer_fit.py --fit        # search the Triton constants
    PYTHONPATH=. python benchmarks/outer_fit.py --registers  # ptxas registers vs the estimate
    PYTHONPATH=. python benchmarks/outer_fit.py --sass       # sm_90 instructions an element

--fit searches the OuterModel fields it names (random multiplicative steps from the
backend's constants) for the lowest median + worst regret over the forms with a producer's
math, with no other form's regret above the current model's, and prints the best set.
--registers and --sass compile Triton kernels for sm_90 through ptxas (no GPU): the
figures quoted in fuser/schedulers/registers.py and fuser/schedulers/outer.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import statistics
import sys
from pathlib import Path

# --registers and --sass compile the GPU's source, not the interpreter's
os.environ.setdefault("TRITON_INTERPRET", "0")

import torch  # noqa: E402

from fuser.backends.registry import get_backend  # noqa: E402
from fuser.examples.bias_grad import bias_grad_fusion, bias_grad_inputs  # noqa: E402
from fuser.schedulers.common import registers  # noqa: E402
from fuser.schedulers.device import get_device  # noqa: E402
from fuser.schedulers.outer import _make, _pick, cost, outer_candidates  # noqa: E402

ROOT = Path(__file__).parent / "results"
SWEEPS = [
    ROOT / "h100-2026-11-25-outer-sweep/sweep.jsonl",
    ROOT / "h100-2026-11-28-session12/1-gelu-bias-sweep/results.jsonl",
]
SCHEDULE = re.compile(
    r"outer_reduction v(\d+) tpr(\d+) rpb(\d+)(?: split(\d+))?(?: fin(\d+))? warps(\d+)(?: i64)?"
)
BF16 = torch.bfloat16


def kernel(form: str, rows: int, cols: int, backend: str):  # noqa: ANN201
    """The bias-gradient fusion's one kernel on the h100 preset (spec and heuristic pick)."""
    ins = [torch.empty(rows, cols, dtype=BF16, device="meta")] * bias_grad_inputs(form)
    (k,) = bias_grad_fusion(form, BF16).compile(ins, device="h100", backend=backend)
    return k


def schedule_of(spec, text: str):  # noqa: ANN001, ANN201
    """The scheduler's Schedule for a sweep row's schedule string."""
    v, tpr, rpb, split, fin, warps = (int(x or 0) for x in SCHEDULE.fullmatch(text).groups())
    thread_rows = max(warps * 32 // tpr, 1)
    s = _make(spec, v, tpr, warps, max(rpb // thread_rows, 1), split or 1, fin)
    assert s.short() == text, f"{text} rebuilt as {s.short()}"
    return s


def load(paths: list[Path]) -> dict[tuple, dict[str, dict[str, float]]]:
    """(form, shape, backend) -> schedule -> {"sweep": ms, "confirm": ms}."""
    out: dict[tuple, dict[str, dict[str, float]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            kind, _, backend = r["impl"].partition("-")
            if kind not in ("sweep", "confirm") or not r.get("ms"):
                continue
            case = (r["op"].removeprefix("bias_grad_"), r["shape"], backend)
            out.setdefault(case, {}).setdefault(r["schedule"], {})[kind] = r["ms"]
    return out


class Case:
    """One swept (form, shape, backend): its measured schedules, rebuilt and estimated."""

    def __init__(self, key: tuple, timed: dict[str, dict[str, float]]) -> None:
        self.form, self.shape, self.backend = key
        rows, cols = (int(x) for x in self.shape.split("x"))
        self.spec = kernel(self.form, rows, cols, self.backend).spec
        self.rows = []  # (schedule, registers, quick ms, ms for the regret)
        for text, t in timed.items():
            if "sweep" in t:
                s = schedule_of(self.spec, text)
                regs = registers(self.spec, s, self.backend)
                self.rows.append((s, regs, t["sweep"], t.get("confirm", t["sweep"])))
        self.best = min(r[3] for r in self.rows)

    def evaluate(self, model=None) -> dict:  # noqa: ANN001
        """The model's pick among the measured schedules (`model`: OuterModel constants in
        place of the backend's), its measured time and regret, and the rank correlation."""
        dev = get_device("h100")
        kw = {"model": model} if model else {}  # (a checkout before `model` takes none)
        scored = [
            (s, regs, cost(self.spec, dev, s, regs, self.backend, **kw))
            for s, regs, _, _ in self.rows
        ]
        s, _, c = _pick(scored)
        ms = next(r[3] for r in self.rows if r[0] == s)
        rho = spearman([c.total_us for _, _, c in scored], [r[2] for r in self.rows])
        return {"pick": s.short(), "ms": ms, "regret": ms / self.best - 1, "rho": rho}

    def heuristic(self, model=None) -> str:  # noqa: ANN001
        """The heuristic's pick among every candidate it scores (not only those timed)."""
        dev = get_device("h100")
        kw = {"model": model} if model else {}
        cands = outer_candidates(self.spec, dev, self.backend)
        scored = [
            (
                s,
                s.estimate.registers,
                cost(self.spec, dev, s, s.estimate.registers, self.backend, **kw),
            )
            for s in cands
        ]
        return _pick(scored)[0].short()


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[int]:
        order = sorted(range(len(x)), key=x.__getitem__)
        r = [0] * len(x)
        for i, j in enumerate(order):
            r[j] = i
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def table(cases: list[Case], model=None) -> list[dict]:  # noqa: ANN001
    print(
        "| form | shape | backend | schedules | rank corr. | the model's pick | its ms "
        "| fastest ms | regret | heuristic's pick (all candidates) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for c in cases:
        r = c.evaluate(model)
        full = c.heuristic(model)
        same = "same" if full == r["pick"] else full.removeprefix("outer_reduction ")
        print(
            f"| {c.form} | {c.shape} | {c.backend} | {len(c.rows)} | {r['rho']:.2f} | "
            f"{r['pick'].removeprefix('outer_reduction ')} | {r['ms']:.4f} | {c.best:.4f} | "
            f"{r['regret']:.1%} | {same} |"
        )
        out.append(r)
    return out


def fit(cases: list[Case], backend: str, names: list[str], steps: int, seed: int) -> None:
    """Random multiplicative search of `names` of `backend`'s OuterModel."""
    mine = [c for c in cases if c.backend == backend]
    math_forms = [c for c in mine if c.form == "gelu"]
    base = get_backend(backend).limits.outer
    floor = {id(c): c.evaluate(base)["regret"] for c in mine if c not in math_forms}

    def score(m) -> float:  # noqa: ANN001
        regrets = [c.evaluate(m)["regret"] for c in math_forms]
        worse = sum(
            max(0.0, c.evaluate(m)["regret"] - floor[id(c)]) for c in mine if id(c) in floor
        )
        return statistics.median(regrets) + max(regrets) + 10 * worse

    rnd = random.Random(seed)
    best, best_score = base, score(base)
    for _ in range(steps):
        change = {n: getattr(best, n) * math.exp(rnd.gauss(0, 0.3)) for n in rnd.sample(names, 2)}
        m = dataclasses.replace(best, **change)
        if (sc := score(m)) < best_score:
            best, best_score = m, sc
            print(f"{sc:.4f} " + ", ".join(f"{n}={getattr(m, n):.3g}" for n in names), flush=True)
    table(mine, best)


def compile_probe(spec, text: str) -> tuple[int, str]:  # noqa: ANN001
    """(ptxas registers, sm_90 SASS) of `spec` under schedule `text`, compiled offline."""
    from fuser.runtime.executor import render_kernel
    from fuser.runtime.resources import triton_resources, triton_sass

    k = render_kernel(spec, schedule_of(spec, text), "triton")
    return triton_resources(k)["registers"], triton_sass(k)


def _scaled_rows():  # noqa: ANN202
    """y = x * r[:, None] stored, with its column max and sum (two accumulators)."""
    from fuser import FusionDefinition

    with FusionDefinition("probe_scaled_rows") as fd:
        o = fd.ops
        x = fd.define_tensor([-1, -1], BF16)
        r = fd.define_tensor([-1], torch.float32)
        y = o.mul(
            o.cast(x, torch.float32), o.broadcast_in_dim(r, shape=x.shape, broadcast_dims=[0])
        )
        fd.add_output(o.cast(y, BF16))
        fd.add_output(o.max(y, dims=[0]))
        fd.add_output(o.sum(y, dims=[0]))
    ins = [torch.empty(8192, 3072, dtype=BF16, device="meta")]
    (k,) = fd.compile(ins + [torch.empty(8192, device="meta")], "h100", "triton")
    return k.spec


def check_registers() -> None:
    """ptxas against the Triton estimate at 8, 16 and 32 elements a thread (4 warps)."""
    print("| kernel | elements a thread | ptxas (sm_90) | estimate |")
    print("|---|---|---|---|")
    specs = {
        f"bias_grad {f}": kernel(f, 8192, 3072, "triton").spec for f in ("f32", "same", "gelu")
    }
    specs["column sum of x * sigmoid(x)"] = _unary("silu", PROBES["x * sigmoid"])
    specs["x * r[:, None], its column max and sum"] = _scaled_rows()
    for name, spec in specs.items():
        for rpb in (1, 2, 4):
            text = f"outer_reduction v8 tpr128 rpb{rpb} split44 fin16 warps4"
            regs, _ = compile_probe(spec, text)
            est = registers(spec, schedule_of(spec, text), "triton")
            print(f"| {name} | {8 * rpb} | {regs} | {est} |", flush=True)


def _unary(name: str, op) -> object:  # noqa: ANN001
    from fuser import FusionDefinition

    with FusionDefinition(f"probe_{name}") as fd:
        x = fd.ops.cast(fd.define_tensor([-1, -1], BF16), torch.float32)
        fd.add_output(fd.ops.sum(op(fd.ops, x), dims=[0]))
    (k,) = fd.compile([torch.empty(8192, 3072, dtype=BF16, device="meta")], "h100", "triton")
    return k.spec


PROBES = {
    "x (the plain column sum)": lambda o, x: x,
    "exp": lambda o, x: o.exp(x),
    "exp2": lambda o, x: o.exp2(x),
    "log": lambda o, x: o.log(x),
    "log2": lambda o, x: o.log2(x),
    "log1p": lambda o, x: o.log1p(x),
    "tanh": lambda o, x: o.tanh(x),
    "erf": lambda o, x: o.erf(x),
    "x * sigmoid": lambda o, x: o.mul(x, o.sigmoid(x)),
    "x / (x + 3)": lambda o, x: o.div(x, o.add(x, 3.0)),
    "reciprocal": lambda o, x: o.reciprocal(x),
    "sqrt": lambda o, x: o.sqrt(x),
    "rsqrt": lambda o, x: o.rsqrt(x),
    "pow(x, x + 1)": lambda o, x: o.pow(x, o.add(x, 1.0)),
    "sin": lambda o, x: o.sin(x),
    "maximum(x, 0.5)": lambda o, x: o.maximum(x, 0.5),
}


def loop_instructions(sass: str, loads_a_step: int) -> float:
    """SASS instructions an element in the main loop (the longest backward branch's
    body; its elements from its 16-byte loads, 8 bf16 elements each)."""
    ins = [
        (int(m.group(1), 16), m.group(2))
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    ]
    loops = [
        (a, int(t.group(1), 16))
        for a, txt in ins
        if (t := re.search(r"BRA (0x[0-9a-f]+)", txt)) and int(t.group(1), 16) < a
    ]
    end, start = max(loops, key=lambda x: x[0] - x[1])
    body = [txt for a, txt in ins if start <= a <= end]
    loads = sum(1 for txt in body if "LDGSTS" in txt or re.search(r"\bLDG\.", txt))
    return len(body) / (loads / loads_a_step * 8)


def check_sass() -> None:
    """sm_90 instructions an element of each probe (the OP_INSTRUCTIONS table's source)."""
    print("| kernel | instructions an element (sm_90) |")
    print("|---|---|")
    text = "outer_reduction v8 tpr128 rpb1 split44 fin16 warps4"
    for form in ("f32", "gelu"):
        spec = kernel(form, 8192, 3072, "triton").spec
        n_in = sum(1 for a in spec.full_args() if not a.is_output)
        print(f"| bias_grad {form} | {loop_instructions(compile_probe(spec, text)[1], n_in):.1f} |")
    for name, op in PROBES.items():
        sass = compile_probe(_unary(name.split(" ")[0], op), text)[1]
        print(f"| column sum of {name} | {loop_instructions(sass, 1):.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fit", action="store_true", help="search the backend's constants")
    ap.add_argument("--backend", default="triton", help="--fit: whose constants")
    fields = "in_flight_kb,in_flight_exp,warps,warps_exp,combine_us,launch_us,finalize_us"
    ap.add_argument("--fields", default=fields + ",math_warps,math_warps_exp,overlap")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--registers", action="store_true", help="ptxas vs the register estimate")
    ap.add_argument("--sass", action="store_true", help="sm_90 instructions an element")
    ap.add_argument("--sweeps", nargs="*", type=Path, default=SWEEPS)
    args = ap.parse_args()
    if args.registers or args.sass:
        check_registers() if args.registers else check_sass()
        return 0
    cases = [Case(key, timed) for key, timed in load(args.sweeps).items()]
    if args.fit:
        fit(cases, args.backend, args.fields.split(","), args.steps, args.seed)
        return 0
    print("H100 sweeps: " + ", ".join(map(str, args.sweeps)))
    rows = table(cases)
    for form in sorted({c.form for c in cases}):
        regrets = [r["regret"] for c, r in zip(cases, rows) if c.form == form]
        print(f"{form}: median regret {statistics.median(regrets):.1%}, worst {max(regrets):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
