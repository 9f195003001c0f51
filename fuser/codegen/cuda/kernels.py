"""CUDA kernel bodies per schedule kind: pointwise, inner persistent, inner looped, outer.

Each function writes one `extern "C" __global__` kernel (two for a split column
reduction) with the CudaKernelWriter and returns the source text.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from fuser.codegen.cuda.render import CudaKernelWriter, Nest, Region
from fuser.codegen.cuda.templates import (
    COMPUTE,
    REDUCE_FN,
    acc_type,
    combine,
    from_memory,
    literal,
    render_op,
    round_to,
)
from fuser.ir.dtypes import DType
from fuser.ir.graph import Node, Value
from fuser.ir.ops import REDUCE, Op
from fuser.schedulers.online import OnlinePair
from fuser.schedulers.schedule import Schedule
from fuser.segmenter import Kind

PER_THREAD = (Kind.ROW, Kind.SCALAR)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _slot_region(
    var: str, count: int, setup: list[str], width: int, **guards: str | None
) -> Region:
    """A region looping `var` over `count` slots (or naming the single slot 0)."""
    if count == 1:
        return Region("", [f"const int {var} = 0;", *setup], width, **guards)
    return Region(f"for (int {var} = 0; {var} < {count}; ++{var})", setup, width, **guards)


# -- inner persistent ------------------------------------------------------------------------
def inner_persistent(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, rpb, batch = s.vector, s.threads_per_row, s.rows_per_block, s.persistent_batch
    chunk = s.chunk
    tail_v = s.tail_vector
    nchunks = batch + (1 if tail_v else 0)
    threads = tpr * rpb
    row_guard = s.row_guard
    nests, kept = [list(p.nodes) for p in s.passes], dict(s.kept)
    w.line(kw.signature(spec.name, threads))
    with w.block("{", "}"):
        w.comment(
            f"{rpb} row(s) per block, {tpr} threads per row; a thread keeps {batch} chunk(s) "
            f"of {v} columns" + (f" and a tail of {tail_v}" if tail_v else "") + " in registers",
            "//",
        )
        names = dict(ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, RPB=rpb, CHUNK=chunk)
        names |= dict(BATCH=batch) | (dict(TAIL_V=tail_v) if tail_v else {})
        kw.constants(**names)
        w.line(
            "const int lane = threadIdx.x % TPR;" if rpb > 1 else "const int lane = threadIdx.x;"
        )
        row_ok = "row_ok" if row_guard else None
        full_guard = batch * chunk > spec.cols
        regions = [
            _slot_region(
                "c",
                batch,
                ["const int col = c * CHUNK + lane * V;"]
                + (["const bool col_ok = col < COLS;"] if full_guard else []),
                v,
                row_ok=row_ok,
                col_ok="col_ok" if full_guard else None,
            )
        ]
        if tail_v:
            tail_guard = batch * chunk + tpr * tail_v > spec.cols
            regions.append(
                Region(
                    "",
                    [
                        "const int c = BATCH;  // the tail chunk",
                        "const int col = BATCH * CHUNK + lane * TAIL_V;",
                    ]
                    + (["const bool col_ok = col < COLS;"] if tail_guard else []),
                    tail_v,
                    row_ok=row_ok,
                    col_ok="col_ok" if tail_guard else None,
                )
            )
        kw.scalar_prologue()
        rows = _PersistentRows(kw, nests, kept, regions, nchunks)
        if not s.programs:
            first = f"({kw.idx})blockIdx.x * RPB" + (" + threadIdx.x / TPR" if rpb > 1 else "")
            w.line(f"const {kw.idx} row = {first};")
            if row_guard:
                w.line("const bool row_ok = row < ROWS;")
            rows.emit(row_ok)
        else:
            _prefetching_rows(kw, rows)
    return w.text()


def _prefetching_rows(kw: CudaKernelWriter, rows: _PersistentRows) -> None:
    """PROGRAMS resident blocks, each walking rows PROGRAMS apart (rows_per_block is 1)."""
    w = kw.w
    programs = kw.s.grid[0]
    w.comment(
        f"{programs} resident blocks walk the rows {programs} apart; each loads its next "
        "row while it reduces this one",
        "//",
    )
    w.line(f"constexpr int PROGRAMS = {programs};")
    kw.declare_loads(rows.nest(0))
    with w.block("{", "}"):
        w.line(f"const {kw.idx} row = blockIdx.x;")
        kw.emit_loads(rows.nest(0))
    w.line("#pragma unroll 1")
    with w.block(f"for ({kw.idx} row = blockIdx.x; row < ROWS; row += PROGRAMS) {{", "}"):
        rows.emit(None, prefetch=True)


class _PersistentRows:
    """The passes over one row of an inner persistent kernel."""

    def __init__(self, kw: CudaKernelWriter, nests: list, kept: dict, regions: list, n: int):
        self.kw, self.nests, self.kept, self.regions, self.nchunks = kw, nests, kept, regions, n

    def reductions(self, d: int) -> list[Node]:
        spec = self.kw.spec
        return [n for n in spec.reductions if spec.depth[n.out.id] == d + 1]

    def nest(self, d: int) -> Nest:
        keep = {vid for vid, nest in self.kept.items() if nest == d}
        return Nest(
            self.regions,
            self.nchunks,
            "c",
            self.nests[d],
            reductions=self.reductions(d),
            keep=keep,
            store_when={Kind.COL: "row == 0"},
        )

    def emit(self, row_ok: str | None, prefetch: bool = False) -> None:
        kw, w = self.kw, self.kw.w
        s = kw.s
        kw.thread_inputs((Kind.ROW,), row_ok)
        store_row = " && ".join(c for c in ("lane == 0", row_ok) if c)
        kw.thread_nodes(_row_nodes(kw, 0), store_row)
        for d in range(len(self.nests)):
            nest, reds = self.nest(d), self.reductions(d)
            w.line()
            what = ", ".join(f"{n.op.value} -> {n.out.name}" for n in reds) or "the outputs"
            w.comment(f"pass {d} over the row's registers: {what}", "//")
            for vid in sorted(nest.keep):
                val = kw.value(vid)
                w.line(
                    f"{COMPUTE[val.dtype]} {val.name}[{self.nchunks}][V];  // kept for later passes"
                )
            kw.arrays |= nest.keep
            for n in reds:
                kw.declare_acc(n)
            if prefetch and d == 0:
                kw.emit_compute(nest)
                w.comment("the next row's loads, in flight through this row's reductions", "//")
                w.line(f"const {kw.idx} next = row + PROGRAMS;")
                with w.block("{", "}"):
                    w.line(f"const {kw.idx} row = next;")
                    w.line("const bool row_ok = row < ROWS;")
                    kw.emit_loads(nest, row_ok="row_ok")
            else:
                kw.emit_nest(nest)
            for n in reds:
                kw.row_reduce(n, s.threads_per_row, s.rows_per_block)
                kw.store_value(n.out, store_row)
            kw.thread_nodes(_row_nodes(kw, d + 1), store_row)


def _row_nodes(kw: CudaKernelWriter, depth: int) -> list[Node]:
    """ROW nodes (not reductions) computed `depth` rounds in: one value per thread."""
    spec = kw.spec
    return [
        n
        for n in spec.nodes
        if n.op not in REDUCE and kw.kind(n.out) == Kind.ROW and spec.depth[n.out.id] == depth
    ]


# -- inner looped ----------------------------------------------------------------------------
def inner_looped(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, unroll = s.vector, s.threads_per_row, s.unroll
    plan = s.looped
    chunk = s.chunk
    width = chunk * unroll
    full_end = spec.cols // width * width
    rem = spec.cols - full_end
    tail_slots = _cdiv(rem, chunk)
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
        kw.scalar_prologue()
        kw.thread_inputs((Kind.ROW,), None)
        kw.thread_nodes(_row_nodes(kw, 0), "lane == 0")

        def walk(nodes: list[Node], reds: list[Node], pairs: list[OnlinePair] = ()) -> None:
            nest = Nest([], unroll, "u", nodes, reductions=reds, store_when={Kind.COL: "row == 0"})
            if full_end:
                w.line("#pragma unroll 1")
                with w.block("for (int off = 0; off < FULL_END; off += WIDTH) {", "}"):
                    setup = ["const int col = off + u * CHUNK + lane * V;"]
                    nest.regions = [_slot_region("u", unroll, setup, v)]
                    _emit_looped_nest(kw, nest, pairs)
            if rem:
                exact = rem == tail_slots * chunk
                setup = ["const int col = FULL_END + u * CHUNK + lane * V;"]
                setup += [] if exact else ["const bool col_ok = col < COLS;"]
                w.comment(f"the last {rem} columns" + ("" if exact else ", predicated"), "//")
                with w.block("{", "}"):
                    nest.slots = tail_slots
                    nest.regions = [
                        _slot_region("u", tail_slots, setup, v, col_ok=None if exact else "col_ok")
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
                kw.thread_nodes(_row_nodes(kw, rnd), "lane == 0")
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


# -- pointwise -------------------------------------------------------------------------------
def pointwise(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, rpb, threads = s.vector, s.threads_per_row, s.rows_per_block, s.threads
    tile = tpr * rpb  # vectors per tile
    per_thread = max(1, tile // threads)
    row_guard = spec.rows % rpb != 0 or tile < threads
    col_guard = spec.cols % s.chunk != 0
    w.line(kw.signature(spec.name, threads))
    with w.block("{", "}"):
        w.comment(
            f"a {rpb} x {s.chunk} tile per block: {tile} vectors of {v}, "
            f"{per_thread} per thread" + ("" if row_guard or col_guard else ", no predicates"),
            "//",
        )
        kw.constants(
            ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, RPB=rpb, CHUNK=s.chunk, THREADS=threads
        )
        kw.scalar_prologue()
        # vector k = threadIdx.x + j * THREADS of the tile sits in row k / TPR, lane k % TPR;
        # both powers of two, so each is fixed per thread or a constant step per slot j
        first_row = f"({kw.idx})blockIdx.x * RPB"
        if threads >= tpr:
            w.line("const int lane = threadIdx.x % TPR;")
            w.line("const int col = blockIdx.y * CHUNK + lane * V;")
            if col_guard:
                w.line("const bool col_ok = col < COLS;")
            setup = [f"const {kw.idx} row = {first_row} + threadIdx.x / TPR + j * (THREADS / TPR);"]
        else:
            setup = [
                f"const {kw.idx} row = {first_row} + j * THREADS / TPR;",
                "const int col = blockIdx.y * CHUNK + (threadIdx.x + j * THREADS % TPR) * V;",
            ]
            if col_guard:
                setup.append("const bool col_ok = col < COLS;")
        if row_guard:
            ok = (f"threadIdx.x < {tile} && " if tile < threads else "") + "row < ROWS"
            setup.append(f"const bool row_ok = {ok};")
        region = _slot_region(
            "j",
            per_thread,
            setup,
            v,
            row_ok="row_ok" if row_guard else None,
            col_ok="col_ok" if col_guard else None,
        )
        nodes = [n for n in spec.nodes if kw.kind(n.out) != Kind.SCALAR and n.op != Op.CONST]
        kw.emit_nest(
            Nest(
                [region],
                per_thread,
                "j",
                nodes,
                row_level=True,
                store_when={Kind.ROW: "col == 0", Kind.COL: "row == 0"},
            )
        )
    return w.text()


# -- outer (column) reduction ----------------------------------------------------------------
def outer_reduction(kw: CudaKernelWriter) -> str:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr, threads, split = s.vector, s.threads_per_row, s.threads, s.split_rows
    ty_count = threads // tpr  # thread rows
    rows_per_step = max(s.rows_per_block, ty_count)
    in_flight = rows_per_step // ty_count
    step = rows_per_step * split
    trips = _cdiv(spec.rows, step)
    row_guard = spec.rows % step != 0
    col_guard = spec.cols % s.chunk != 0
    reds = list(spec.reductions)
    ws = kw.workspaces()

    loop_targets = [n.inputs[0] for n in reds] + [
        a.value for a in spec.outputs if a.kind in (Kind.FULL, Kind.ROW)
    ]
    loop_nodes = kw.cone(loop_targets, lambda x: kw.kind(x) in (Kind.COL, Kind.SCALAR))
    col_used = {
        x.id
        for n in [*loop_nodes, *reds]
        for x in n.inputs
        if kw.kind(x) == Kind.COL and x.id not in kw.consts
    }
    col_values = [kw.value(i) for i in sorted(col_used)]

    w.line(kw.signature(spec.name, threads))
    with w.block("{", "}"):
        w.comment(
            f"column tile {s.chunk} = {tpr} threads x {v}; {ty_count} thread rows take "
            f"{rows_per_step} rows per step ({in_flight} in flight each); "
            f"{split} block(s) split the rows",
            "//",
        )
        kw.constants(
            ROWS=spec.rows, COLS=spec.cols, V=v, TPR=tpr, TY=ty_count, CHUNK=s.chunk, SPLIT=split
        )
        w.line("const int tx = threadIdx.x % TPR, ty = threadIdx.x / TPR;")
        w.line("const int col = blockIdx.x * CHUNK + tx * V;")
        col_ok = "col_ok" if col_guard else None
        if col_guard:
            w.line("const bool col_ok = col < COLS;")
        kw.scalar_prologue()
        if col_values:
            _column_values(kw, col_values, col_ok)
        for n in reds:
            kw.declare_acc(n, v)
        w.line()
        w.comment(f"{trips} step(s) of {step} rows; this block takes every {split}th", "//")
        w.line("#pragma unroll 1")
        with w.block(f"for (int it = 0; it < {trips}; ++it) {{", "}"):
            setup = [
                f"const {kw.idx} row = (({kw.idx})it * SPLIT + blockIdx.y) * {rows_per_step}"
                " + r * TY + ty;"
            ]
            if row_guard:
                setup.append("const bool row_ok = row < ROWS;")
            region = _slot_region(
                "r", in_flight, setup, v, row_ok="row_ok" if row_guard else None, col_ok=col_ok
            )
            kw.emit_nest(
                Nest(
                    [region],
                    in_flight,
                    "r",
                    loop_nodes,
                    reductions=reds,
                    acc=lambda n: f"acc_{n.out.name}[i]",
                    reduce_guard="row",
                    row_level=True,
                    store_when={Kind.ROW: "col == 0"},
                )
            )
        w.line()
        if ty_count > 1:
            for n in reds:
                at = acc_type(n.inputs[0].dtype)
                w.line(f"__shared__ {at} part_{n.out.name}[{threads * v}];")
                w.line(
                    f"column_reduce<TPR, TY, V>(acc_{n.out.name}, {REDUCE_FN[n.op]}(), "
                    f"part_{n.out.name});"
                )
        with w.block("if (ty == 0) {", "}"):
            if split > 1:
                w.comment("this block's partial results; the finalize kernel adds them up", "//")
                with w.block(f"if ({col_ok}) {{", "}") if col_ok else nullcontext():
                    for n, (name, _) in zip(reds, ws):
                        w.line("#pragma unroll")
                        w.line(
                            f"for (int i = 0; i < V; ++i) "
                            f"{name}_ptr[blockIdx.y * COLS + col + i] = acc_{n.out.name}[i];"
                        )
            else:
                _epilogue(kw, reds, col_ok)
    if split > 1:
        w.line()
        _finalize(kw, reds, ws)
    return w.text()


def _column_values(kw: CudaKernelWriter, values: list[Value], col_ok: str | None) -> None:
    """COL values the row loop uses: computed once per thread into [V] arrays."""
    w = kw.w
    w.comment("column values every row uses: computed once, kept per thread", "//")
    for x in values:
        w.line(f"{COMPUTE[x.dtype]} {x.name}[V];")
    keep = {x.id for x in values}
    kw.col_arrays |= keep
    nodes = kw.cone(values, lambda x: kw.kind(x) == Kind.SCALAR)
    region = Region("", ["const int c = 0;"], kw.s.vector, col_ok=col_ok)
    kw.emit_nest(Nest([region], 1, "c", nodes, keep=keep))


def _epilogue(kw: CudaKernelWriter, reds: list[Node], col_ok: str | None) -> None:
    """Column results: the reductions rounded to their dtype, the column ops after them,
    the stores."""
    spec = kw.spec
    given = {}
    for n in reds:
        ct = COMPUTE[n.out.dtype]
        total = f"acc_{n.out.name}[i]"
        total = total if acc_type(n.inputs[0].dtype) == ct else f"({ct}){total}"
        given[n.out.id] = round_to(total, n.out.dtype)
    outs = [a.value for a in spec.outputs if a.kind == Kind.COL]
    nodes = kw.cone(outs, lambda x: x.id in kw.col_arrays or kw.kind(x) == Kind.SCALAR)
    region = Region("", ["const int c = 0;"], kw.s.vector, col_ok=col_ok)
    kw.emit_nest(Nest([region], 1, "c", nodes, given=given))


def finalize_threads(s: Schedule) -> int:
    """Threads of a split column reduction's finalize kernel: one per column vector of
    the tile, at least a warp."""
    return max(32, s.threads_per_row)


def _finalize(kw: CudaKernelWriter, reds: list[Node], ws: list[tuple[str, str]]) -> None:
    spec, s, w = kw.spec, kw.s, kw.w
    v, tpr = s.vector, s.threads_per_row
    threads = finalize_threads(s)
    kw.col_arrays = set()
    kw.arrays = set()
    w.line(kw.signature(spec.name + "_finalize", threads))
    with w.block("{", "}"):
        w.comment(f"add the {s.split_rows} partial results of each column in a fixed order", "//")
        kw.constants(COLS=spec.cols, V=v, CHUNK=s.chunk, SPLIT=s.split_rows)
        w.line("const int col = blockIdx.x * CHUNK + threadIdx.x * V;")
        conds = ([f"threadIdx.x < {tpr}"] if threads > tpr else []) + (
            ["col < COLS"] if spec.cols % s.chunk else []
        )
        col_ok = "col_ok" if conds else None
        if conds:
            w.line(f"const bool col_ok = {' && '.join(conds)};")
        kw.scalar_prologue()
        for n in reds:
            kw.declare_acc(n, v)
        with w.block(f"if ({col_ok}) {{", "}") if col_ok else nullcontext():
            w.line("#pragma unroll 1")
            with w.block("for (int p = 0; p < SPLIT; ++p) {", "}"):
                for n, (name, _) in zip(reds, ws):
                    acc = f"acc_{n.out.name}[i]"
                    part = f"{name}_ptr[p * COLS + col + i]"
                    w.line("#pragma unroll")
                    w.line(f"for (int i = 0; i < V; ++i) {acc} = {combine(n.op, acc, part)};")
        _epilogue(kw, reds, col_ok)


RENDERERS = {
    "pointwise": pointwise,
    "inner_persistent": inner_persistent,
    "inner_looped": inner_looped,
    "outer_reduction": outer_reduction,
}
