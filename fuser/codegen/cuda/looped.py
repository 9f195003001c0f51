"""CUDA inner looped kernels: one long row per block, walked a few chunks at a time once
per reduction pass; softmax-like max-and-sum pairs in one online pass."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from fuser.codegen.cuda.render import (
    PER_THREAD,
    CudaKernelWriter,
    Nest,
    row_nodes,
    slot_region,
)
from fuser.codegen.cuda.templates import COMPUTE, acc_type, combine, from_memory, literal, render_op
from fuser.ir.dtypes import DType
from fuser.ir.graph import Node
from fuser.ir.ops import Op
from fuser.schedulers.online import OnlinePair
from fuser.segmenter import Kind


def inner_looped(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, unroll = s.vector, s.threads_per_row, s.unroll
    plan = s.looped
    chunk = s.chunk
    width, full_end = s.walk_width, s.walk_end
    rem = spec.cols - full_end
    tail_slots = s.walk_tail_slots
    w.line(kw.signature(spec.name, tpr))
    with w.block("{", "}"):
        w.comment(
            f"one row per block of {tpr} threads, walked {width} columns at a time "
            f"({len(plan.passes)} reduction pass(es), then the output pass)",
            "//",
        )
        kw.constants(COLS=spec.cols, V=v, CHUNK=chunk, WIDTH=width, FULL_END=full_end)
        w.line("const int lane = threadIdx.x;")
        w.line(f"const {kw.idx} row = blockIdx.x;")
        start, sh = ("WIDTH", " - shift") if s.walk_align else ("0", "")
        if s.walk_align:
            w.comment(
                f"aligned-start walk: the row starts `shift` elements past a {s.walk_align}-"
                "element boundary;\nits columns are walked from there (a masked head, then "
                "whole vectors)",
                "//",
            )
            w.line(f"const int shift = (int)((row * {s.walk_stride}) % {s.walk_align});")
        kw.scalar_prologue()
        kw.thread_inputs((Kind.ROW,), None)
        kw.thread_nodes(row_nodes(kw, 0), "lane == 0")

        def walk(nodes: list[Node], reds: list[Node], pairs: list[OnlinePair] = ()) -> None:
            nest = Nest([], unroll, "u", nodes, reductions=reds, store_when={Kind.COL: "row == 0"})
            if s.walk_align:
                w.comment("the head: the columns before the first aligned one are off", "//")
                with w.block("{", "}"):
                    setup = [f"const int col = u * CHUNK + lane * V{sh};"]
                    nest.regions = [replace(slot_region("u", unroll, setup, v), head=True)]
                    _emit_looped_nest(kw, nest, pairs)
            if full_end > (width if s.walk_align else 0):
                w.line("#pragma unroll 1")
                with w.block(f"for (int off = {start}; off < FULL_END; off += WIDTH) {{", "}"):
                    setup = [f"const int col = off + u * CHUNK + lane * V{sh};"]
                    nest.regions = [slot_region("u", unroll, setup, v)]
                    _emit_looped_nest(kw, nest, pairs)
            if s.walk_tail:  # the aligned walk's has the shift's columns even where rem is 0
                exact = not s.col_guard  # the tail is whole chunks
                setup = [f"const int col = FULL_END + u * CHUNK + lane * V{sh};"]
                setup += [] if exact else ["const bool col_ok = col < COLS;"]
                what = f"the last {rem} columns" if rem else "the last `shift` columns"
                w.comment(what + ("" if exact else ", predicated"), "//")
                with w.block("{", "}"):
                    nest.slots = tail_slots
                    nest.regions = [
                        slot_region("u", tail_slots, setup, v, col_ok=None if exact else "col_ok")
                    ]
                    _emit_looped_nest(kw, nest, pairs)

        for rounds in plan.passes:
            pairs = plan.pairs_in(rounds, spec)
            if pairs:
                reds = plan.reductions(rounds, spec)
                maxes = _maxes(pairs)
                targets = [n.inputs[0] for n in reds + maxes]
            else:
                reds = [n for n in spec.reductions if spec.depth[n.out.id] == rounds[0]]
                targets = [n.inputs[0] for n in reds]
            cone = kw.cone(targets, lambda x: kw.kind(x) in PER_THREAD)
            w.line()
            if pairs:
                _online_comment(kw, rounds, reds, pairs)
            else:
                w.comment(
                    f"pass {rounds[0]}: "
                    + ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds),
                    "//",
                )
            for n in reds + (maxes + [p.sum for p in pairs] if pairs else []):
                kw.declare_acc(n)
            walk(cone, reds, pairs)
            for n in reds:
                kw.row_reduce(n, tpr, 1)
                kw.store_value(n.out, "lane == 0")
            if pairs:
                _online_finish(kw, maxes, pairs)
            for rnd in rounds:
                kw.thread_nodes(row_nodes(kw, rnd), "lane == 0")
        outs = [a.value for a in spec.outputs if a.kind in (Kind.FULL, Kind.COL)]
        if outs:
            w.line()
            w.comment("output pass", "//")
            walk(kw.cone(outs, lambda x: kw.kind(x) in PER_THREAD), [])
    return w.text()


def _maxes(pairs: list[OnlinePair]) -> list[Node]:
    return list({id(p.max): p.max for p in pairs}.values())


def _online_comment(
    kw: CudaKernelWriter, rounds: tuple[int, ...], reds: list[Node], pairs: list[OnlinePair]
) -> None:
    what = [f"{n.op.value} -> {n.out.name}" for n in reds + _maxes(pairs)]
    what += [f"sum(exp(x - max)) -> {p.sum.out.name}" for p in pairs]
    kw.w.comment(
        f"pass {'+'.join(map(str, rounds))}, online: {', '.join(what)}\n"
        "each thread keeps a running max and a running sum of exp(x - max), rescaled when\n"
        "its max grows: the row is read once for both rounds, not once per round\n"
        "(every exponent is <= 0, so nothing overflows that the two-pass form does not)",
        "//",
    )


def _emit_looped_nest(kw: CudaKernelWriter, nest: Nest, pairs: list[OnlinePair]) -> None:
    """emit_nest, plus (for an online pass) a second element loop per slot updating the
    running max and sums from the same loaded registers."""
    if not pairs:
        kw.emit_nest(nest)
        return
    maxes = _maxes(pairs)
    # the maxes' operands are loaded too (the nest's plain reductions may not need them)
    everything = replace(nest, reductions=nest.reductions + maxes)
    kw.declare_loads(everything)
    kw.emit_loads(everything)
    kw.slot_var = nest.var
    loads = kw.nest_inputs(everything)
    slot = f"[{nest.var}]"
    x_cone = kw.cone([m.inputs[0] for m in maxes], lambda x: kw.kind(x) in PER_THREAD)
    used = {x.id for n in [*x_cone, *maxes] for x in n.inputs}
    for r in nest.regions:
        with kw.region(r):
            kw.nest_body(nest, r, loads, slot)
            kw.w.line("#pragma unroll")
            with kw.w.block(f"for (int i = 0; i < {r.width}; ++i) {{", "}"):
                for a in loads:
                    if a.value.id in used and a.kind != Kind.ROW:
                        arr = f"{a.name}_v" + (slot if a.kind == Kind.FULL else "")
                        e = from_memory(f"{arr}[i]", a.dtype)
                        kw.w.line(f"const {COMPUTE[a.dtype]} {a.name} = {e};")
                for n in x_cone:
                    kw.define(n)
                ok = kw.element_ok(r)
                with kw.w.block(f"if ({ok}) {{", "}") if ok else nullcontext():
                    _online_update(kw, maxes, pairs)


def _online_update(kw: CudaKernelWriter, maxes: list[Node], pairs: list[OnlinePair]) -> None:
    w = kw.w
    for m in maxes:
        x, at = m.inputs[0], acc_type(m.inputs[0].dtype)
        mx, xm, grow = f"acc_{m.out.name}", f"x_{m.out.name}", f"grow_{m.out.name}"
        w.line(f"const {at} {xm} = {kw.operand(x, at)};")
        w.line(f"const bool {grow} = {xm} > {mx};")
        w.comment(
            "a thread's max is -inf until the thread meets a value: 0 stands in for a max "
            "that is not\nfinite, so a -inf x adds exp(-inf) = 0 without computing -inf - "
            "-inf (a +inf or NaN\nmax makes the row's sum NaN below, whatever it adds)",
            "//",
        )
        fin = f"fin_{m.out.name}"
        w.line(f"const {at} {fin} = {render_op(Op.ABS, [mx], at)} < POS_INF ? {mx} : ({at})0;")
        for p in pairs:
            if p.max is not m:
                continue
            sm, e = f"acc_{p.sum.out.name}", f"e_{p.sum.out.name}"
            st = acc_type(p.sum.inputs[0].dtype)
            # one exp per element, of -|x - m|: exp(c * (x - m)) if the max stays, else
            # the rescale exp(c * (m - x)) of the sum so far (and x adds 1)
            d = f"-{render_op(Op.ABS, [f'{xm} - {fin}'], st)}"
            w.line(f"const {st} {e} = {_cuda_exp(p, d, st)};")
            w.line(f"{sm} = {grow} ? {sm} * {e} + 1 : {sm} + {e};")
        w.line(f"{mx} = {combine(Op.MAX, mx, xm)};")


def _online_finish(kw: CudaKernelWriter, maxes: list[Node], pairs: list[OnlinePair]) -> None:
    """The row max from the threads' maxes; each thread's sum rescaled to it, then summed."""
    w, tpr = kw.w, kw.s.threads_per_row
    for m in maxes:
        kw.row_reduce(m, tpr, 1)
        kw.store_value(m.out, "lane == 0")
    for p in pairs:
        st = acc_type(p.sum.inputs[0].dtype)
        sm, big = f"acc_{p.sum.out.name}", p.max.out.name
        w.comment(
            "eager's sum is NaN where the max is not finite (inf - inf, -inf - -inf, NaN)", "//"
        )
        scaled = f"{sm} * {_cuda_exp(p, f'(acc_{big} - ({st}){big})', st)}"
        w.line(f"{sm} = {render_op(Op.ABS, [big], st)} < POS_INF ? {scaled} : NAN_F;")
        kw.row_reduce(p.sum, tpr, 1)
        kw.store_value(p.sum.out, "lane == 0")


def _cuda_exp(p: OnlinePair, d: str, ct: str) -> str:
    """The pair's exp op of c * d in C type `ct`."""
    dtype = DType.float64 if ct == "double" else DType.float32
    arg = d if p.scale == 1.0 else f"{d} * {literal(p.scale, dtype)}"
    return render_op(p.exp, [arg], ct)
