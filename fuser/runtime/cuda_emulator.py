"""Run generated CUDA kernels on the CPU: a test tier for machines with no GPU.

The kernel source is compiled unchanged as C++20 with g++, after a small shim that
defines what CUDA provides: `threadIdx`/`blockIdx`, `__syncthreads` (a block-wide
std::barrier), `__shfl_xor_sync` (a per-warp exchange through memory), `__shared__`
(function statics: blocks run one after another) and the math intrinsics. Only the
16-bit conversion helpers (inline PTX) and the packed accesses are swapped for host
versions; those check the alignment a GPU would fault on.
Every CUDA thread is a std::thread, so the emulator is slow and meant for small shapes;
it checks what the kernels compute (indexing, predicates, packs, reductions), not how
fast. GPU runs remain the authority.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from fuser.codegen.cuda.templates import HELPERS, MEMORY, acc_type
from fuser.errors import CompileError, FuserError
from fuser.runtime.cache import atomic_write, digest
from fuser.runtime.specs import planned_alignment

SHIM = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx, blockIdx;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct BlockSync {
    std::barrier<> block;
    std::vector<std::barrier<>*> warps;
    std::vector<uint64_t> lanes;
    explicit BlockSync(int threads) : block(threads), lanes(threads) {
        for (int w = 0; w < threads / 32; ++w) warps.push_back(new std::barrier<>(32));
    }
    ~BlockSync() { for (auto* w : warps) delete w; }
};
static BlockSync* g_sync = nullptr;

inline void __syncthreads() { g_sync->block.arrive_and_wait(); }

template <typename T> inline T __shfl_xor_sync(unsigned, T x, int offset) {
    const int t = threadIdx.x, warp = t / 32;
    uint64_t bits = 0;
    std::memcpy(&bits, &x, sizeof(T));
    g_sync->lanes[t] = bits;
    g_sync->warps[warp]->arrive_and_wait();
    bits = g_sync->lanes[warp * 32 + ((t % 32) ^ offset)];
    g_sync->warps[warp]->arrive_and_wait();
    T y;
    std::memcpy(&y, &bits, sizeof(T));
    return y;
}

// index_error's minimum (a GPU's atomicMin on a word of global memory)
inline long long atomicMin(long long* p, long long value) {
    std::atomic_ref<long long> word(*p);
    long long old = word.load();
    while (value < old && !word.compare_exchange_weak(old, value)) {
    }
    return old;
}

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }

struct fp16 { unsigned short bits; };
inline float to_float(fp16 h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
inline fp16 to_fp16(float x) {
    _Float16 f = (_Float16)x;
    fp16 h;
    std::memcpy(&h.bits, &f, 2);
    return h;
}
inline float round_fp16(float f) { return to_float(to_fp16(f)); }

struct bf16 { unsigned short bits; };
inline float to_float(bf16 h) { return __uint_as_float(static_cast<unsigned>(h.bits) << 16); }
inline bf16 to_bf16(float f) {
    unsigned u; std::memcpy(&u, &f, 4);
    bf16 h;
    if (f != f) { h.bits = 0x7fc0; return h; }
    u += 0x7fff + ((u >> 16) & 1);
    h.bits = (unsigned short)(u >> 16);
    return h;
}
inline float round_bf16(float f) { return to_float(to_bf16(f)); }

// a GPU faults on a misaligned vector access; the host would not, so count them here,
// and keep the first one's address and width for the error to name its argument
static std::atomic<int> g_misaligned{0};
static std::atomic<uintptr_t> g_bad_address{0};
static std::atomic<size_t> g_bad_bytes{0};
static inline bool aligned(const void* p, size_t bytes) {
    uintptr_t at = reinterpret_cast<uintptr_t>(p);
    if (at % bytes == 0) return true;
    if (g_misaligned++ == 0) { g_bad_address = at; g_bad_bytes = bytes; }
    return false;
}
extern "C" unsigned long long fuser_bad_address() { return g_bad_address; }
extern "C" unsigned long long fuser_bad_bytes() { return g_bad_bytes; }
template <int BYTES> struct Word;
template <> struct Word<16> { typedef uint4 type; };
template <> struct Word<8> { typedef uint2 type; };
template <> struct Word<4> { typedef unsigned int type; };
template <> struct Word<2> { typedef unsigned short type; };
template <> struct Word<1> { typedef unsigned char type; };
template <int N, typename T> inline void load_pack(T* dst, const T* src) {
    if (aligned(src, N * sizeof(T))) std::memcpy(dst, src, N * sizeof(T));
}
template <int N, typename T> inline void store_pack(T* dst, const T* src) {
    if (aligned(dst, N * sizeof(T))) std::memcpy(dst, src, N * sizeof(T));
}
"""

RUNNER = r"""
extern "C" int fuser_emulate_{name}(void** args, unsigned gx, unsigned gy, unsigned gz,
                                     int threads) {{
    g_misaligned = 0;
    g_bad_address = 0;
    g_bad_bytes = 0;
    for (unsigned bz = 0; bz < gz; ++bz)
        for (unsigned by = 0; by < gy; ++by)
            for (unsigned bx = 0; bx < gx; ++bx) {{
                BlockSync sync(threads);
                g_sync = &sync;
                std::vector<std::thread> pool;
                for (int t = 0; t < threads; ++t)
                    pool.emplace_back([=] {{
                        threadIdx.x = t;
                        blockIdx.x = bx; blockIdx.y = by; blockIdx.z = bz;
                        {name}({call});
                    }});
                for (auto& th : pool) th.join();
            }}
    return g_misaligned;
}}
"""

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}


def available() -> bool:
    """Whether a C++20 compiler is here to emulate kernels with."""
    return shutil.which("g++") is not None


def host_source(source: str, kernels: list[tuple[str, list[str]]]) -> str:
    """`source` with the shim in front, the PTX helpers swapped out and one runner per
    kernel ((name, C types of its pointer arguments))."""
    body = source
    for name in ("fp16", "bf16", "pack"):
        body = body.replace(HELPERS[name], "")
    runners = []
    for name, types in kernels:
        call = ", ".join(f"({t}*)args[{i}]" for i, t in enumerate(types))
        runners.append(RUNNER.format(name=name, call=call))
    return SHIM + "\n" + body + "\n" + "\n".join(runners)


def _build(text: str) -> ctypes.CDLL:
    key = digest(text)
    with _lock:
        if key in _libs:
            return _libs[key]
        folder = Path(tempfile.gettempdir()) / "fuser_emulate"
        folder.mkdir(exist_ok=True)
        src, lib = folder / f"k_{key}.cpp", folder / f"k_{key}.so"
        if not lib.exists():
            # other processes may build the same kernel at once (pytest-xdist's workers):
            # the source lands whole, and each process builds into a file of its own
            atomic_write(src, text.encode())
            tmp = folder / f"k_{key}.{os.getpid()}.{threading.get_ident()}.so"
            cmd = ["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-pthread"]
            cmd += ["-w", str(src), "-o", str(tmp)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(
                    f"g++ could not build the emulated kernel:\n{proc.stderr[-4000:]}"
                )
            tmp.replace(lib)
        _libs[key] = ctypes.CDLL(str(lib))
        return _libs[key]


def emulate(kernel: Any, tensors: list[Any], checks: list[Any] = ()) -> None:
    """Run `kernel` (backend "cuda") on CPU `tensors`, as launch_cuda does on a GPU
    (`checks`: its error record and flag, when it has check_index nodes)."""
    if not available():
        raise FuserError("emulating CUDA kernels needs g++ (C++20)")
    s, spec = kernel.plan, kernel.spec
    types = [MEMORY[a.dtype] for a in spec.args]
    types += [acc_type(ws.reduction.inputs[0].dtype) for ws in kernel.plan.workspaces]
    types += ["long long" for _ in checks]
    kernels = [(kernel.name, types)]
    if kernel.workspaces:
        kernels.append((kernel.name + "_finalize", types))
    lib = _build(host_source(kernel.source, kernels))
    work = kernel._workspace_tensors(tensors[0].device)
    ptrs = [t.data_ptr() for t in [*tensors, *work, *checks]]
    args = (ctypes.c_void_p * len(ptrs))(*ptrs)
    grid = (*s.grid, 1, 1)[:3]
    launches = [(kernel.name, grid, s.threads)]
    if kernel.workspaces:
        fin = kernel.plan
        fin_grid = (*fin.finalize_grid, 1, 1)[:3]
        launches.append((kernel.name + "_finalize", fin_grid, fin.finalize_threads))
    named = list(zip(spec.args, tensors)) + [(None, t) for t in [*work, *checks]]
    for name, g, threads in launches:
        bad = getattr(lib, f"fuser_emulate_{name}")(args, *map(ctypes.c_uint, g), threads)
        if bad:
            raise FuserError(
                f"emulated kernel {name} made {bad} misaligned packed accesses "
                f"(a GPU would fault: 'misaligned address'); the first: {_bad_access(lib, named)}"
            )


def _bad_access(lib: ctypes.CDLL, named: list[tuple[Any, Any]]) -> str:
    """The first misaligned access of the last emulated launch in words: its width, the
    argument it fell in, the element offset and the pointer's actual and planned alignment
    (a pointer less aligned than planned is the planner's mistake; one as planned leaves
    the width the renderer chose for the access)."""
    lib.fuser_bad_address.restype = ctypes.c_ulonglong
    lib.fuser_bad_bytes.restype = ctypes.c_ulonglong
    address, width = lib.fuser_bad_address(), lib.fuser_bad_bytes()
    for arg, t in named:
        start = t.data_ptr()
        if start <= address < start + t.numel() * t.element_size():
            which = arg.name if arg is not None else "a workspace"
            offset = (address - start) // t.element_size()
            planned = f", planned {arg.align}" if arg is not None else ""
            return (
                f"a {width}-byte pack of {which} at element {offset} "
                f"(pointer aligned to {planned_alignment(t)} bytes{planned})"
            )
    return f"a {width}-byte pack at address {address:#x}, in no argument"
