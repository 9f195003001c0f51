"""The cross-entropy row kernel's schedule (fuser/schedulers/heuristics.py): the
aligned-start walk for rows that start unaligned (contiguous odd V), and the looped
kernel's resident rows kept within the L2 so that its second read hits there.

Structure on the H100 preset from meta tensors (both backends), and correctness of the
walk through Triton's interpreter and the CUDA emulator (which fails on a misaligned
packed access) on small odd shapes whose rows start at every offset modulo the vector.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fuser.backends.registry import get_backend
from fuser.bench.cases import cross_entropy_fusion
from fuser.dynamo.ce_region import one_pass_fusion
from fuser.schedulers.device import PRESETS
from fuser.schedulers.heuristics import L2_ROWS_SHARE, row_read_bytes

BF16, F32 = torch.bfloat16, torch.float32
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _row_kernel(rows: int, v: int, backend: str, dtype: torch.dtype = BF16):  # noqa: ANN202
    fd = cross_entropy_fusion(rows, dtype)
    x = torch.empty(rows, v, dtype=dtype, device="meta")
    t = torch.empty(rows, dtype=torch.int64, device="meta")
    return max(fd.compile([x, t], "h100", backend), key=lambda k: k.spec.cols)


def _enable(monkeypatch: pytest.MonkeyPatch, backend: str, **limits: bool) -> None:
    b = get_backend(backend)
    monkeypatch.setattr(b, "limits", replace(b.limits, **limits))


def _resident_bytes(k) -> int:  # noqa: ANN001
    est = k.schedule.estimate
    return PRESETS["h100"].sms * est.blocks_per_sm * row_read_bytes(k.spec)


@pytest.mark.parametrize("rows", [8192, 32768])
def test_50257_walks_aligned(rows: int) -> None:
    """Both backends walk the odd rows from an aligned column with 16-byte vectors where
    the gradient shares the logits' odd stride (Triton one chunk an iteration); with an
    aligned gradient Triton keeps vector 1 (element stores at the true column lost)."""
    k = _row_kernel(rows, 50257, "cuda")
    s, plan = k.schedule, k.plan
    assert s.kind == "inner_looped" and s.vector == 8 and s.align_walk, s.explain()
    assert "aligned-start walk" in s.explain()
    # the logits and the gradient (same odd stride) both move whole 16-byte vectors
    fulls = [a.name for a in k.spec.full_args()]
    assert set(plan.walk_args) == set(fulls), plan.text()
    assert plan.walk_align == 8 and plan.walk_stride == 50257
    t = _row_kernel(rows, 50257, "triton").schedule
    assert t.kind == "inner_looped" and t.vector == 8 and t.align_walk, t.explain()
    assert t.unroll == 1, t.explain()


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("v", [50257, 128256])
def test_l2_cap_when_enabled(monkeypatch: pytest.MonkeyPatch, backend: str, v: int) -> None:
    """With the (off by default) L2 cap on, the two-read row kernel's resident rows fit."""
    _enable(monkeypatch, backend, l2_rows_cap=True, aligned_walk=True)
    k = _row_kernel(8192, v, backend)
    assert k.schedule.kind == "inner_looped", k.schedule.explain()
    assert _resident_bytes(k) <= L2_ROWS_SHARE * PRESETS["h100"].l2_bytes, k.schedule.explain()


def test_32000_reads_once_where_the_row_fits() -> None:
    """CUDA keeps the row of 32000 in registers; Triton, whose kernel keeps two words an
    element here (x and exp(x - max), registers.row_live_words), would spill: it loops."""
    s = _row_kernel(8192, 32000, "cuda").schedule
    assert s.kind == "inner_persistent" and s.vector == 8, s.explain()
    s = _row_kernel(8192, 32000, "triton").schedule
    assert s.kind == "inner_looped" and s.vector == 8, s.explain()


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_128256_two_reads_aligned(backend: str) -> None:
    s = _row_kernel(8192, 128256, backend).schedule
    assert s.kind == "inner_looped" and s.vector == 8 and not s.align_walk, s.explain()


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_aligned_walk_cross_entropy_runs(
    monkeypatch: pytest.MonkeyPatch, backend: str, dtype: torch.dtype
) -> None:
    """The walk forced on both backends (Triton's takes it by default only for 2-byte
    rows whose gradient shares their stride). 9 rows of an odd V: row starts at every
    offset modulo the vector (8 bf16, 4 fp32); the targets include the first and last
    columns (the head's and the tail's)."""
    _enable(
        monkeypatch, backend, aligned_walk=True, aligned_walk_all_args=False, staged_walks=False
    )
    rows, v = 9, 20001 if dtype == F32 else 33001
    fd = cross_entropy_fusion(rows, dtype)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, v, generator=g) * 3).to(dtype).to(DEVICE)
    t = torch.randint(0, v, (rows,), generator=g)
    t[0], t[1], t[-1] = 0, v - 1, 1
    t = t.to(DEVICE)
    loss, grad = fd.execute([x, t], backend=backend)
    (k,) = [k for k in fd.kernels if k.spec.cols == v]
    assert k.schedule.align_walk, k.schedule.explain()
    xr = x.float().requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(xr, t, reduction="none")
    ref.mean().backward()
    torch.testing.assert_close(loss.float().cpu(), ref.detach().cpu(), rtol=1e-4, atol=1e-4)
    tol = 1.6e-2 if dtype == BF16 else 1e-5
    torch.testing.assert_close(
        grad.float().cpu(), xr.grad.cpu(), rtol=tol, atol=tol * xr.grad.abs().max().item()
    )


def _lowered_row_kernel(rows: int, v: int, stride: int, backend: str):  # noqa: ANN202
    x = torch.empty_strided((rows, v), (stride, 1), dtype=BF16, device="meta")
    t = torch.empty(rows, dtype=torch.int64, device="meta")
    return max(one_pass_fusion(x, t).compile([x, t], "h100", backend), key=lambda k: k.spec.cols)


def test_lone_persistent_row_is_walked_where_l2_hints_are_written() -> None:
    """fuser's own cross-entropy of 32000 fits one 512-thread block a SM (64 registers of
    row a thread): Triton walks it instead, twice, the second read from L2 (H100: 1.10
    -> 0.87 ms); CUDA, which writes no L2 hints, keeps it in registers."""
    k = _lowered_row_kernel(16384, 32000, 32000, "triton")
    assert k.schedule.kind == "inner_looped" and k.plan.walk_evict, k.schedule.explain()
    assert "not persistent" in k.schedule.explain()
    assert 'eviction_policy="evict_last"' in k.source and "evict_first" in k.source
    c = _lowered_row_kernel(16384, 32000, 32000, "cuda")
    assert c.schedule.kind == "inner_persistent", c.schedule.explain()
    # a shorter row (8000: 3 blocks a SM) stays in registers
    short = _lowered_row_kernel(8192, 8000, 8000, "triton")
    assert short.schedule.kind == "inner_persistent", short.schedule.explain()


def test_narrow_accesses_take_more_chunks_an_iteration() -> None:
    """Odd bf16 rows (vector 1 on Triton): 4 chunks an iteration (8 bytes of loads in
    flight a thread); aligned rows (vector 8) keep 2."""
    odd = _lowered_row_kernel(8192, 50257, 50257, "triton").schedule
    assert odd.vector == 1 and odd.unroll == 4, odd.explain()
    assert "4 chunks an iteration: 2-byte accesses" in odd.explain()
    wide = _lowered_row_kernel(8192, 50257, 50264, "triton").schedule
    assert wide.vector == 8 and wide.unroll == 2, wide.explain()


def test_lone_rule_leaves_three_reads_and_few_rows_alone() -> None:
    """The walk replaces a lone persistent row only where it reads the row twice and has
    rows enough: a LayerNorm (mean, then variance: three reads) and 64 rows of 32000
    stay in registers."""
    from fuser.examples import seed_layernorm_fusion

    fd = seed_layernorm_fusion()
    m = lambda *s: torch.empty(*s, dtype=torch.float16, device="meta")  # noqa: E731
    ins = [m(32768), m(8192, 32768), m(32768), m(32768), m(32768)]
    (ln,) = fd.compile(ins, "h100", "triton")
    assert ln.schedule.kind == "inner_persistent", ln.schedule.explain()
    few = _lowered_row_kernel(64, 32000, 32000, "triton")
    assert few.schedule.kind == "inner_persistent", few.schedule.explain()


def _one_pass_kernel(v: int, aligned_grad: bool, dtype: torch.dtype = BF16):  # noqa: ANN202
    x = torch.empty(4096, v, dtype=dtype, device="meta")
    t = torch.empty(4096, dtype=torch.int64, device="meta")
    ks = one_pass_fusion(x, t, aligned=aligned_grad).compile([x, t], "h200", "triton")
    return max(ks, key=lambda k: k.spec.cols)


def test_triton_walk_only_where_every_full_argument_shares_the_row_start() -> None:
    """Triton's aligned-start walk (one chunk an iteration) is taken for the one-pass
    cross-entropy whose gradient has the logits' odd stride (logits that are a graph
    input), not where the gradient's rows are aligned and its stores would be 2-byte
    element stores at the true column (measured slower on an H200)."""
    same = _one_pass_kernel(50257, aligned_grad=False)
    s = same.schedule
    assert s.align_walk and s.vector == 8 and s.unroll == 1, s.explain()
    assert set(same.plan.walk_args) == {a.name for a in same.spec.full_args()}
    other = _one_pass_kernel(50257, aligned_grad=True).schedule
    assert not other.align_walk and other.vector == 1, other.explain()


def test_triton_keeps_the_staged_walk_of_4_byte_rows() -> None:
    """An fp32 row of odd width keeps Triton's narrow walk, which cp.async can stage
    (4-byte accesses); 2-byte rows, which it cannot, take the aligned-start walk."""
    with_fp32 = _one_pass_kernel(20001, aligned_grad=False, dtype=F32).schedule
    assert not with_fp32.align_walk and with_fp32.vector == 1, with_fp32.explain()
    with_bf16 = _one_pass_kernel(20001, aligned_grad=False).schedule
    assert with_bf16.align_walk, with_bf16.explain()


def test_triton_walk_edges_load_whole_vectors_on_a_gpu_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk's masked head and tail load whole 16-byte vectors in the source a GPU
    compiles (the head unmasked, the tail masked a vector at a time) and exact masks in
    the interpreter's, whose last row would read past the CPU allocation; stores keep
    exact masks in both."""
    from fuser.codegen.triton.source import render_triton
    from tests.golden.cases import gpu_variant

    k = _one_pass_kernel(50257, aligned_grad=False)
    with gpu_variant():
        gpu = render_triton(k.plan)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter's, on a GPU host too
    cpu = render_triton(k.plan)
    x = k.spec.full_args()[0].name  # the logits
    assert f"{x}_head = tl.load({x}_ptr + row_base + pos_head, eviction" in gpu
    assert "mask=vec_ok_tail" in gpu and "mask=vec_ok_tail" not in cpu
    assert f"{x}_head = tl.load({x}_ptr + row_base + pos_head, mask=col_ok_head" in cpu
    assert "mask=col_ok_tail)" in gpu  # the gradient's tail stores stay exact
