# ruff: noqa: B023
"""Session 21, call A: hand-written rotary forward kernels (issue 21's q shape, bf16), to
choose how fuser's pointwise kernels should read an input broadcast over a row dim (cos and
sin over the heads) and a rotate_half (two column views of one input). Not fuser code: an
experiment whose table decides what the scheduler builds.

  A   fuser's kernel today: a 32-row tile of consecutive (b, h, t) rows; cos/sin read per
      tile; the rotated half as two masked loads at cols +- 64
  D   A, with the row cut in two halves: each half loaded once, no masks
  F   A with the tile's rows ordered (b, t, h): one tile's rows share few cos/sin rows
  FD  F and D
  B8  a loop over 8 heads inside the program, cos/sin loaded once before it
  B32 the same over all 32 heads
  C8  B8 and D
"""

import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

B, H, T, D = 8, 32, 2048, 128
BF = torch.bfloat16


@triton.jit
def _rope(
    q_ptr,
    c_ptr,
    s_ptr,
    o_ptr,
    sb,
    sh,
    st,
    H: tl.constexpr,
    T: tl.constexpr,
    RPB: tl.constexpr,
    HG: tl.constexpr,
    ORDER_BTH: tl.constexpr,
    LOOP: tl.constexpr,
    HALVES: tl.constexpr,
):
    half: tl.constexpr = 64
    if LOOP:
        pid = tl.program_id(0)
        nt = T // RPB
        b = pid // nt
        t = (pid % nt) * RPB + tl.arange(0, RPB)[:, None]
        h0 = tl.program_id(1) * HG
        crow = b * (T * 128) + t * 128
        if HALVES:
            ca = tl.arange(0, half)[None, :]
            c1 = tl.load(c_ptr + crow + ca).to(tl.float32)
            c2 = tl.load(c_ptr + crow + half + ca).to(tl.float32)
            s1 = tl.load(s_ptr + crow + ca).to(tl.float32)
            s2 = tl.load(s_ptr + crow + half + ca).to(tl.float32)
            for hh in range(HG):
                base = b * sb + (h0 + hh) * sh + t * st
                x1 = tl.load(q_ptr + base + ca).to(tl.float32)
                x2 = tl.load(q_ptr + base + half + ca).to(tl.float32)
                o1 = (x1 * c1).to(tl.bfloat16).to(tl.float32) + (-x2 * s1).to(tl.bfloat16).to(
                    tl.float32
                )
                o2 = (x2 * c2).to(tl.bfloat16).to(tl.float32) + (x1 * s2).to(tl.bfloat16).to(
                    tl.float32
                )
                tl.store(o_ptr + base + ca, o1.to(tl.bfloat16))
                tl.store(o_ptr + base + half + ca, o2.to(tl.bfloat16))
        else:
            cols = tl.arange(0, 128)[None, :]
            c = tl.load(c_ptr + crow + cols).to(tl.float32)
            s = tl.load(s_ptr + crow + cols).to(tl.float32)
            for hh in range(HG):
                base = b * sb + (h0 + hh) * sh + t * st
                x = tl.load(q_ptr + base + cols).to(tl.float32)
                xa = tl.load(q_ptr + base + cols + half, mask=cols < half, other=1.0).to(tl.float32)
                xb = tl.load(q_ptr + base + cols - half, mask=cols >= half, other=1.0).to(
                    tl.float32
                )
                rot = tl.where(cols < half, -xa, xb)
                o = (x * c).to(tl.bfloat16).to(tl.float32) + (rot * s).to(tl.bfloat16).to(
                    tl.float32
                )
                tl.store(o_ptr + base + cols, o.to(tl.bfloat16))
    else:
        rows = tl.program_id(0) * RPB + tl.arange(0, RPB)[:, None]
        if ORDER_BTH:
            h = rows % H
            t = (rows // H) % T
            b = rows // (H * T)
        else:
            t = rows % T
            h = (rows // T) % H
            b = rows // (H * T)
        base = b * sb + h * sh + t * st
        crow = b * (T * 128) + t * 128
        if HALVES:
            ca = tl.arange(0, half)[None, :]
            x1 = tl.load(q_ptr + base + ca).to(tl.float32)
            x2 = tl.load(q_ptr + base + half + ca).to(tl.float32)
            c1 = tl.load(c_ptr + crow + ca).to(tl.float32)
            c2 = tl.load(c_ptr + crow + half + ca).to(tl.float32)
            s1 = tl.load(s_ptr + crow + ca).to(tl.float32)
            s2 = tl.load(s_ptr + crow + half + ca).to(tl.float32)
            o1 = (x1 * c1).to(tl.bfloat16).to(tl.float32) + (-x2 * s1).to(tl.bfloat16).to(
                tl.float32
            )
            o2 = (x2 * c2).to(tl.bfloat16).to(tl.float32) + (x1 * s2).to(tl.bfloat16).to(tl.float32)
            tl.store(o_ptr + base + ca, o1.to(tl.bfloat16))
            tl.store(o_ptr + base + half + ca, o2.to(tl.bfloat16))
        else:
            cols = tl.arange(0, 128)[None, :]
            x = tl.load(q_ptr + base + cols).to(tl.float32)
            c = tl.load(c_ptr + crow + cols).to(tl.float32)
            s = tl.load(s_ptr + crow + cols).to(tl.float32)
            xa = tl.load(q_ptr + base + cols + half, mask=cols < half, other=1.0).to(tl.float32)
            xb = tl.load(q_ptr + base + cols - half, mask=cols >= half, other=1.0).to(tl.float32)
            rot = tl.where(cols < half, -xa, xb)
            o = (x * c).to(tl.bfloat16).to(tl.float32) + (rot * s).to(tl.bfloat16).to(tl.float32)
            tl.store(o_ptr + base + cols, o.to(tl.bfloat16))


def reference(q, c, s):
    c, s = c.unsqueeze(1), s.unsqueeze(1)
    rot = torch.cat((-q[..., 64:], q[..., :64]), dim=-1)
    return q * c + rot * s


VARIANTS = {  # name: (rows per block, heads a program, order (b,t,h), loop, halves, warps)
    "A": (32, 1, False, False, False, 8),
    "D": (32, 1, False, False, True, 8),
    "F": (32, 1, True, False, False, 8),
    "FD": (32, 1, True, False, True, 8),
    "F64": (64, 1, True, False, False, 8),
    "B8": (32, 8, False, True, False, 8),
    "B4": (32, 4, False, True, False, 8),
    "B32": (32, 32, False, True, False, 8),
    "C8": (32, 8, False, True, True, 8),
    "C4-16": (16, 4, False, True, True, 4),
    "A-w4": (32, 1, False, False, False, 4),
    "A16": (16, 1, False, False, False, 4),
    "A16-w8": (16, 1, False, False, False, 8),
}


@triton.jit
def _rope_qk(
    q_ptr,
    k_ptr,
    c_ptr,
    s_ptr,
    oq_ptr,
    ok_ptr,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    T: tl.constexpr,
    RPB: tl.constexpr,
):
    """A for q and k in one launch: programs below q's row blocks take q, the rest k."""
    pid = tl.program_id(0)
    nq = (HQ * T * 8) // RPB
    cols = tl.arange(0, 128)[None, :]
    if pid < nq:
        rows = pid * RPB + tl.arange(0, RPB)[:, None]
        crow = (rows // (HQ * T)) * (T * 128) + (rows % T) * 128
        x_ptr, o_ptr = q_ptr, oq_ptr
    else:
        rows = (pid - nq) * RPB + tl.arange(0, RPB)[:, None]
        crow = (rows // (HK * T)) * (T * 128) + (rows % T) * 128
        x_ptr, o_ptr = k_ptr, ok_ptr
    x = tl.load(x_ptr + rows * 128 + cols).to(tl.float32)
    c = tl.load(c_ptr + crow + cols).to(tl.float32)
    s = tl.load(s_ptr + crow + cols).to(tl.float32)
    xa = tl.load(x_ptr + rows * 128 + cols + 64, mask=cols < 64, other=1.0).to(tl.float32)
    xb = tl.load(x_ptr + rows * 128 + cols - 64, mask=cols >= 64, other=1.0).to(tl.float32)
    rot = tl.where(cols < 64, -xa, xb)
    o = (x * c).to(tl.bfloat16).to(tl.float32) + (rot * s).to(tl.bfloat16).to(tl.float32)
    tl.store(o_ptr + rows * 128 + cols, o.to(tl.bfloat16))


def q_and_k(copy: float, cos, sin, g) -> None:
    """q [8, 32, T, 128] and k [8, 8, T, 128] contiguous: two launches of A against one."""
    q = torch.randn(B, H, T, D, device="cuda", dtype=BF, generator=g)
    k = torch.randn(B, 8, T, D, device="cuda", dtype=BF, generator=g)
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    nbytes = 2 * (q.numel() + k.numel()) * 2

    def two():
        _rope[(B * H * T // 32,)](
            q,
            cos,
            sin,
            oq,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            H,
            T,
            32,
            1,
            False,
            False,
            False,
            num_warps=8,
        )
        _rope[(B * 8 * T // 32,)](
            k,
            cos,
            sin,
            ok,
            k.stride(0),
            k.stride(1),
            k.stride(2),
            8,
            T,
            32,
            1,
            False,
            False,
            False,
            num_warps=8,
        )

    def one():
        _rope_qk[(B * (H + 8) * T // 32,)](q, k, cos, sin, oq, ok, H, 8, T, 32, num_warps=8)

    for name, fn in (("q,k two launches", two), ("q+k one launch", one)):
        fn()
        torch.testing.assert_close(
            ok.float(), reference(k.float(), cos.float(), sin.float()), rtol=2**-7, atol=0.1
        )
        ms = do_bench(fn, return_mode="median")
        gbps = nbytes / ms / 1e6
        print(
            f"contiguous {name:18s} {ms * 1e3:7.1f} us {gbps:6.0f} GB/s "
            f"{100 * gbps / copy:5.1f}% of copy",
            flush=True,
        )


def main() -> None:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    src = torch.randn(B * H * T * D * 2, device=dev, dtype=BF, generator=g)
    copy_ms = do_bench(lambda: src.clone(), return_mode="median")
    copy = 2 * src.numel() * 2 / copy_ms / 1e6
    print(f"copy {copy:.0f} GB/s ({src.numel() * 2 / 1e6:.0f} MB)")
    cos = torch.randn(B, T, D, device=dev, dtype=BF, generator=g)
    sin = torch.randn(B, T, D, device=dev, dtype=BF, generator=g)
    for layout in ("contiguous", "transposed"):
        q = torch.randn(B, T, H, D, device=dev, dtype=BF, generator=g).transpose(1, 2)
        if layout == "contiguous":
            q = q.contiguous()
        want = reference(q.float(), cos.float(), sin.float())
        o = torch.empty_like(q)
        sb, sh, st = q.stride(0), q.stride(1), q.stride(2)
        nbytes = 2 * q.numel() * 2
        for name, (rpb, hg, bth, loop, halves, warps) in VARIANTS.items():
            if loop:
                grid = (B * T // rpb, H // hg)
            else:
                grid = (B * H * T // rpb,)

            def run(grid=grid, rpb=rpb, hg=hg, bth=bth, loop=loop, halves=halves, warps=warps):
                _rope[grid](
                    q, cos, sin, o, sb, sh, st, H, T, rpb, hg, bth, loop, halves, num_warps=warps
                )

            o.zero_()
            run()
            err = (o.float() - want).abs().max().item()
            ms = do_bench(run, return_mode="median")
            gbps = nbytes / ms / 1e6
            print(
                f"{layout:10s} {name:6s} {ms * 1e3:7.1f} us {gbps:6.0f} GB/s "
                f"{100 * gbps / copy:5.1f}% of copy  err {err:.3g}",
                flush=True,
            )
    q_and_k(copy, cos, sin, g)
    try:
        import torch._functorch.config as fc

        print(
            "guess_tangent_strides_as_outputs",
            getattr(fc, "guess_tangent_strides_as_outputs", "absent"),
        )
    except Exception as e:  # noqa: BLE001
        print("functorch config:", e, file=sys.stderr)


if __name__ == "__main__":
    main()
