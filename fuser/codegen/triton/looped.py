"""Triton inner looped kernels: one long row per program, walked a tile at a time once per
reduction pass; softmax-like max-and-sum pairs in one online pass."""

from __future__ import annotations

from contextlib import nullcontext

from fuser.codegen.triton.kernels import Emitter
from fuser.codegen.triton.render import Chunk, TritonKernelWriter, _acc_dtype, _cone, _identity
from fuser.codegen.triton.templates import render_op
from fuser.ir.graph import Node
from fuser.ir.ops import REDUCE, Op
from fuser.plan.build import pow2_ceil
from fuser.plan.kernel_plan import KernelPlan
from fuser.schedulers.online import OnlinePair
from fuser.segmenter import Kind


def inner_looped(kw: TritonKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    plan = s.looped
    width, full_end, tail = s.walk_width, s.walk_end, s.walk_tail
    # a pipelined walk (walk_stages) addresses its loads from the scalar `off` (Chunk.split):
    # a column tensor made for a load in one stage and read by the iota in a later one
    # was carried per stage in registers (the cross-entropy's at 3 stages, sm_90: 182
    # registers against 128, one resident block of 8 warps against two)
    body = Chunk(None, "off + ", width, False, split=s.walk_stages > 1)
    # the tail walk is one masked tile, the next power of two wide (a tl.arange's width;
    # IGNORED_BY says why not walk_tail_slots chunks); its names differ from the loop
    # body's: Triton wants a variable's shape to stay the same through a loop
    tail_chunk = Chunk("tail", f"{full_end} + ", pow2_ceil(tail) if tail else 0, True)
    # the aligned-start walk: a masked head iteration, then the loop from the next one
    # (its tail is up to vector - 1 columns longer: fuser/plan/build.py)
    start = width if s.walk_align else 0
    head = Chunk("head", "", width, True) if s.walk_align else None
    # walk_stages: every loop over the row issues its loads walk_stages - 1 iterations
    # ahead, staged in shared memory (Triton pipelines a loop without a dot only where
    # tl.range names num_stages); the head and the tail stay outside the loop
    steps = f"{start}, {full_end}, {width}"
    if s.walk_stages > 1:
        steps = f"tl.range({steps}, num_stages={s.walk_stages})"
    else:
        steps = f"range({steps})"
    loop = f"for off in {steps}:"
    w.line("@triton.jit")
    with w.block(kw.signature([])):
        w.comment(
            f"one row per program, walked {width} columns at a time "
            f"({len(plan.passes)} reduction pass(es) + the output pass)"
        )
        if s.walk_stages > 1:
            w.comment(
                f"each loop's loads issued {s.walk_stages - 1} iteration(s) ahead, staged in "
                "shared memory"
            )
        kw.row_setup("tl.program_id(0)")
        scalar_em = Emitter(kw)

        def row_nodes(depth: int) -> None:
            for n in spec.nodes:
                k = spec.kinds.get(n.out.id)
                if (
                    n.op not in REDUCE
                    and k in (Kind.ROW, Kind.SCALAR)
                    and spec.depth[n.out.id] == depth
                ):
                    scalar_em.node(n, None)

        row_nodes(0)
        # walk_evict: the reduction passes' reads stay in L2 for the output pass's
        kw.evict = "evict_last" if s.walk_evict else ""
        for rounds in plan.passes:
            if plan.pairs_in(rounds, spec):
                _online_pass(kw, scalar_em, rounds, body, full_end, tail, head, loop)
                for rnd in rounds:
                    row_nodes(rnd)
                continue
            rnd = rounds[0]
            reds = [n for n in _walked(s, spec.reductions) if spec.depth[n.out.id] == rnd]
            cone = _cone(spec, [n.inputs[0] for n in reds], {Kind.FULL, Kind.COL}, rnd)
            if reds:
                w.comment(
                    f"pass {rnd}: " + ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds)
                )
            for n in reds:
                w.line(
                    f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {width}), "
                    f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
                )
            if full_end > start and reds:
                with w.block(loop):
                    kw.col_setup(body)
                    em = Emitter(kw)
                    em.done |= scalar_em.done
                    for n in cone:
                        em.node(n, body)
                    for n in reds:
                        em.ensure_inputs(n, body)
                        x = kw.reduce_operand(n, body, None)
                        w.line(f"acc_{n.out.name} = {kw.combine(n.op, f'acc_{n.out.name}', x)}")
            for n in reds:
                w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=1)}")
            for edge in (head, tail_chunk if tail else None):
                if edge is None or not reds:
                    continue
                kw.col_setup(edge)
                em = Emitter(kw)
                em.done |= scalar_em.done
                for n in cone:
                    em.node(n, edge)
                for n in reds:
                    em.ensure_inputs(n, edge)
                    term = kw.reduce_term(n, edge)
                    w.line(f"{n.out.name} = {kw.combine(n.op, n.out.name, term)}")
            _picks(kw, scalar_em, (rnd,))
            for n in reds:
                w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
                scalar_em.done.add((n.out.id, None))
                scalar_em.maybe_store(n, None)
            row_nodes(rnd)
        full_outs = [a.value for a in spec.outputs if a.kind in (Kind.FULL, Kind.COL)]
        if full_outs:
            cone = _cone(spec, full_outs, {Kind.FULL, Kind.COL}, spec.rounds + 1)
            w.comment("output pass")
            kw.evict = "evict_first" if s.walk_evict else ""
            edges = ((head, head is not None), (body, full_end > start), (tail_chunk, tail))
            for chunk, ctx in edges:
                if not ctx:
                    continue
                header = loop if chunk is body else None
                with w.block(header) if header else nullcontext():
                    kw.col_setup(chunk)
                    em = Emitter(kw)
                    em.done |= scalar_em.done
                    for n in cone:
                        em.node(n, chunk)
        kw.flush_reports()  # the row's index checks, once its work is done
    return w.text()


def _online_pass(
    kw: TritonKernelWriter,
    scalar_em: Emitter,
    rounds: tuple[int, ...],
    body: Chunk,
    full_end: int,
    tail: int,
    head: Chunk | None,
    loop: str,
) -> None:
    """One pass over the row for rounds r and r + 1, whose sums of exp(c * (x - max))
    are computed online (fuser/schedulers/online.py): every lane keeps a running max and
    a running sum rescaled when its max grows; the lanes combine after the loop. Plain
    reductions of round r ride along. The tail is one masked tile as wide as the loop's,
    so it updates the same lane state."""
    spec, s, w = kw.spec, kw.s, kw.w
    plan = s.looped
    pairs = plan.pairs_in(rounds, spec)
    reds = _walked(s, plan.reductions(rounds, spec))
    maxes = list({id(p.max): p.max for p in pairs}.values())
    width = body.width
    cone = _cone(spec, [n.inputs[0] for n in reds + maxes], {Kind.FULL, Kind.COL}, rounds[0])
    w.comment(
        f"pass {'+'.join(map(str, rounds))}, online: "
        + ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds + maxes)
        + ", "
        + ", ".join(f"sum(exp(x - max)) -> {p.sum.out.name}" for p in pairs)
    )
    w.comment(
        "each lane keeps a running max and a running sum of exp(x - max), rescaled when\n"
        "its max grows: the row is read once for both rounds, not once per round\n"
        "(every exponent is <= 0, so nothing overflows that the two-pass form does not)"
    )
    for n in reds:
        w.line(
            f"acc_{n.out.name} = tl.full(({s.rows_per_block}, {width}), "
            f"{_identity(n.op, n.inputs[0].dtype)}, {_acc_dtype(n.inputs[0].dtype)})"
        )
    for m in maxes:
        w.line(
            f"m_{m.out.name} = tl.full(({s.rows_per_block}, {width}), NEG_INF, "
            f"{_acc_dtype(m.inputs[0].dtype)})"
        )
    for p in pairs:
        w.line(
            f"s_{p.sum.out.name} = tl.full(({s.rows_per_block}, {width}), 0, "
            f"{_acc_dtype(p.sum.inputs[0].dtype)})"
        )

    def step(chunk: Chunk) -> None:
        kw.col_setup(chunk)
        em = Emitter(kw)
        em.done |= scalar_em.done
        for n in cone:
            em.node(n, chunk)
        mask = f"col_ok{chunk.suffix()}" if chunk.masked else None
        for n in reds + maxes:
            em.ensure_inputs(n, chunk)
        for n in reds:
            x = kw.reduce_operand(n, chunk, mask)
            w.line(f"acc_{n.out.name} = {kw.combine(n.op, f'acc_{n.out.name}', x)}")
        for m in maxes:
            mx = f"m_{m.out.name}"
            # masked lanes read -inf: they neither grow the max nor add to the sum
            w.line(f"x_{m.out.name} = {kw.reduce_operand(m, chunk, mask)}")
            w.line(f"grow_{m.out.name} = x_{m.out.name} > {mx}")
            w.comment(
                "a lane's max is -inf until the lane meets a value: 0 stands in for a max "
                "that is not\nfinite, so a -inf x (masked off, or in the data) adds "
                "exp(-inf) = 0 without computing\n-inf - -inf (a +inf or NaN max makes "
                "the row's sum NaN below, whatever the lane adds)"
            )
            w.line(f"fin_{m.out.name} = tl.where(tl.abs({mx}) < POS_INF, {mx}, 0.0)")
            for p in pairs:
                if p.max is not m:
                    continue
                sm, x, grow = f"s_{p.sum.out.name}", f"x_{m.out.name}", f"grow_{m.out.name}"
                # one exp per element, of -|x - m|: exp(c * (x - m)) if the max stays,
                # else the rescale exp(c * (m - x)) of the sum so far (and x adds 1)
                d = f"-tl.abs({x} - fin_{m.out.name})"
                w.line(f"e_{p.sum.out.name} = {_exp(p, d)}")
                e = f"e_{p.sum.out.name}"
                w.line(f"{sm} = tl.where({grow}, {sm} * {e} + 1.0, {sm} + {e})")
            w.line(f"{mx} = {kw.combine(Op.MAX, mx, f'x_{m.out.name}')}")

    if head is not None:
        step(head)
    start = width if head is not None else 0
    if full_end > start:
        with w.block(loop):
            step(body)
    # the tail: tiles as wide as the loop's (the aligned walk's may need two)
    for k in range(-(-tail // width)):
        step(Chunk(f"tail{k}" if k else "tail", f"{full_end + k * width} + ", width, True))
    for n in reds:
        w.line(f"{n.out.name} = {kw.reduce(n, f'acc_{n.out.name}', axis=1)}")
    for m in maxes:
        w.line(f"{m.out.name} = {kw.reduce(m, f'm_{m.out.name}', axis=1)}")
    for p in pairs:
        mx, big = f"m_{p.max.out.name}", p.max.out.name
        lanes = f"s_{p.sum.out.name} * {_exp(p, f'({mx} - {big})')}"
        w.line(f"{p.sum.out.name} = tl.sum({lanes}, axis=1, keep_dims=True)")
        w.comment("eager's sum is NaN where the max is not finite (inf - inf, -inf - -inf, NaN)")
        w.line(f"{p.sum.out.name} = tl.where(tl.abs({big}) < POS_INF, {p.sum.out.name}, nan_())")
        kw.helpers.add("nan_")
    _picks(kw, scalar_em, rounds)
    for n in reds + maxes + [p.sum for p in pairs]:
        w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
        scalar_em.done.add((n.out.id, None))
        scalar_em.maybe_store(n, None)


def _exp(p: OnlinePair, d: str) -> str:
    """The pair's exp op of c * d."""
    arg = d if p.scale == 1.0 else f"({d}) * {p.scale!r}"
    return render_op(p.exp, [arg])


def _walked(s: KernelPlan, reductions: list[Node]) -> list[Node]:
    """`reductions` less the picks (plan.picks), which the row walk does not sum."""
    picked = {p.reduction.out.id for p in s.picks}
    return [n for n in reductions if n.out.id not in picked]


def _picks(kw: TritonKernelWriter, scalar_em: Emitter, rounds: tuple[int, ...]) -> None:
    """The picks of `rounds` (fuser/plan/picks.py), after their pass's walk: each one's
    summand computed at the one column its index names, as a masked tile one column
    wide (0 where the column is off the row, as the sum would be)."""
    spec, w, evict = kw.spec, kw.w, kw.evict
    kw.evict = ""  # one element a row: no hint
    for k, p in enumerate(x for x in kw.s.picks if spec.depth[x.reduction.out.id] in rounds):
        n = p.reduction
        chunk = Chunk(f"pick{k}" if k else "pick", "", 1, True)
        w.comment(f"{n.out.name}: {n.op.value} of a one-hot select, read at column {p.index.name}")
        arg = kw.args.get(p.index.id)  # an input not loaded yet (an output is computed)
        if arg is not None and not arg.is_output and (p.index.id, None) not in scalar_em.loaded:
            scalar_em.loaded.add((p.index.id, None))
            kw.load(arg, None)
        kw.pick_setup(chunk, p.index)
        em = Emitter(kw)
        em.done |= scalar_em.done
        em.loaded |= scalar_em.loaded
        for m in _cone(spec, [n.inputs[0]], {Kind.FULL, Kind.COL}, spec.depth[n.out.id]):
            em.node(m, chunk)
        em.ensure_inputs(n, chunk)
        w.line(f"{n.out.name} = {kw.reduce_term(n, chunk)}")
        w.line(f"{n.out.name} = {kw.to(n.out.name, n.out.dtype)}")
        scalar_em.done.add((n.out.id, None))
        scalar_em.maybe_store(n, None)
    kw.evict = evict
