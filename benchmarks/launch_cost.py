"""Host cost of one fused-kernel launch (issue 19's target: the call program's launch
within 1.5x of a bare `cuLaunchKernel` through cuda.bindings with the same arguments).

    python benchmarks/launch_cost.py --out $OUT/launch_cost.jsonl

One small pointwise fusion (y = x * 2 + b over [rows, cols], one block's worth) is
compiled for each backend, then each way of launching it is timed on the host:

- `bare-cuLaunchKernel`: the driver call alone through cuda.bindings, its parameter block
  prepared once, per backend: for Triton, the function Triton loaded with the same
  arguments (the ones that are not constexprs, then the two null scratch pointers every
  Triton 3.x CUDA kernel takes; an earlier try without those faulted); for CUDA C++,
  fuser's NVRTC kernel of the same fusion. Each backend's floor.
- `program-triton-c`, `program-static`, `program-python`: the line the call program
  emits for a Triton kernel with each launcher of fuser/runtime/launchers.py (the
  tensors passed as their pointers, as the program does; `*-tensors`: the tensors
  themselves, which the launcher turns into checked pointers).
- `program-cuda`: the line the program emits for a CUDA C++ kernel: fuser's prepared
  cuLaunchKernel (fuser/runtime/cuda_backend.py) called with the pointers;
  `launch_unchecked`: the kernel's general launch, which the program called before.
- `compiled-fn-*`: a whole `torch.compile(backend="fuser")` call of the same function
  (Dynamo's guards, AOTAutograd's wrapper, the program): the per-call cost a user sees.

Host time per launch: a batch of launches timed with perf_counter (the GPU keeps up:
the kernel is shorter than a launch), median of the batches; the device is synchronized
between batches, outside the timed region.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from fuser.frontend.fusion_definition import FusionDefinition


def _fusion(dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition("scale_add") as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=dtype)
        b = fd.define_tensor(shape=[-1], dtype=dtype)
        ops = fd.ops
        bb = ops.broadcast_in_dim(b, shape=x.shape, broadcast_dims=[1])
        fd.add_output(ops.add(ops.mul(x, 2.0), bb))
    return fd


def host_us(fn: Callable[[], None], launches: int, batches: int) -> float:
    """Median host microseconds per call of `fn` over `batches` batches of `launches`."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(launches):
            fn()
        per.append((time.perf_counter() - t0) / launches * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def _bare_cuda(kernel, tensors: list[torch.Tensor]) -> Callable[[], None]:
    from fuser.runtime.cuda_backend import _launcher

    pointers = [t.data_ptr() for t in tensors]  # the row count is compiled in
    launcher = _launcher(kernel, torch.cuda.current_device(), len(pointers))
    launcher.values[:] = pointers
    (fn, (gx, gy, gz), block) = launcher.launches[0]
    stream = torch.cuda.current_stream().cuda_stream
    at, call, ok = launcher.params_at, launcher.launch, launcher.ok

    def launch() -> None:
        (err,) = call(fn, gx, gy, gz, block, 1, 1, 0, stream, at, 0)
        if err != ok:
            raise RuntimeError(f"cuLaunchKernel: {err!r}")

    return launch


def _ways(backend: str, kernel, tensors: list[torch.Tensor]) -> dict[str, Callable[[], None]]:
    """The bare driver call and the call program's launch of `kernel` on `tensors`."""
    if backend == "cuda":
        from fuser.runtime.cuda_backend import direct_launcher

        launcher = direct_launcher(kernel, tensors[0].device)
        stream = torch.cuda.current_stream().cuda_stream
        x, y, z = tensors
        return {
            "bare-cuLaunchKernel": _bare_cuda(kernel, tensors),
            # the program's line (program/regions.py): the prepared launch, the pointers
            "program-cuda": lambda: launcher([x.data_ptr(), y.data_ptr(), z.data_ptr()], stream),
            "launch_unchecked": lambda: kernel.launch_unchecked(tensors),  # the general way
        }
    from fuser.runtime.launchers import WAYS, direct_launch

    nargs = len(tensors) + 1  # the tensors, then the row count
    out: dict[str, Callable[[], None]] = {}
    for way in WAYS:
        d = direct_launch(kernel._compiled, nargs, kernel._grid3, way)
        if d.way != way:
            print(f"triton  {way}: not available here ({d.way} instead)")
            continue
        out[f"program-{way}"] = _program_line(d, tensors, kernel.spec.rows, pointers=True)
        out[f"{way}-tensors"] = _program_line(d, tensors, kernel.spec.rows, pointers=False)
    return out


def _program_line(d, tensors: list[torch.Tensor], rows: int, pointers: bool) -> Callable:
    """A function whose body is the line the call program emits for DirectLaunch `d`
    (fuser/dynamo/program/regions.py _launch_line), its tensors as closure variables as a
    program's are locals. `pointers`: each tensor passed as its data_ptr(), as the
    program passes them (False: the tensors themselves, a variant measured)."""
    from fuser.dynamo.program.regions import _launch_line
    from fuser.dynamo.program.steps import Names

    class Builder:
        names = Names(set())

    names = [f"t{i}" for i in range(len(tensors))]
    call_args = [f"{n}.data_ptr()" if pointers else n for n in names] + [str(rows)]
    line = _launch_line(d, call_args, "kernel", Builder)
    src = (
        f"def make({', '.join(names)}, stream):\n"
        f"    def launch():\n        {line}\n"
        "    return launch\n"
    )
    scope = dict(Builder.names.globals)
    exec(src, scope)
    return scope["make"](*tensors, torch.cuda.current_stream().cuda_stream)


def _compiled_call(backend: str, x, b, want) -> Callable[[], None]:
    """One call of the same function through torch.compile(backend="fuser")."""
    import fuser

    fuser.config.backend = backend
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b: x * 2 + b, backend="fuser", dynamic=False)
    torch.testing.assert_close(compiled(x, b), want)
    return lambda: compiled(x, b)


def _bare_triton(kernel, tensors: list[torch.Tensor]) -> Callable[[], None]:
    """cuLaunchKernel through cuda.bindings on the function Triton loaded, its parameter
    block built once: the arguments that are not constexprs, then the two scratch
    pointers every Triton 3.x CUDA kernel takes (null: fuser's kernels use none)."""
    import ctypes

    from cuda.bindings.driver import CUfunction, CUresult, CUstream, cuLaunchKernel

    c = kernel._compiled
    args = [*tensors, kernel.spec.rows]
    values: list = []
    for a, ty in zip(args, c.src.signature.values()):
        if ty == "constexpr":
            continue
        if str(ty).startswith("*"):
            values.append(ctypes.c_void_p(a.data_ptr()))
        elif ty in ("i32", "i64"):
            values.append((ctypes.c_int32 if ty == "i32" else ctypes.c_int64)(a))
        else:
            raise NotImplementedError(f"argument type {ty}")
    values += [ctypes.c_void_p(0), ctypes.c_void_p(0)]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    at = ctypes.addressof(params)
    fn = CUfunction(c.function)
    stream = CUstream(torch.cuda.current_stream().cuda_stream)
    (gx, gy, gz), threads, shared = kernel._grid3, 32 * c.metadata.num_warps, c.metadata.shared
    ok = CUresult.CUDA_SUCCESS

    def launch() -> None:
        (err,) = cuLaunchKernel(fn, gx, gy, gz, threads, 1, 1, shared, stream, at, 0)
        if err != ok:
            raise RuntimeError(f"cuLaunchKernel: {err!r}")

    launch.keep = (values, params)  # the block stays alive with the function
    return launch


def measure(rows: int, cols: int, launches: int, batches: int, meta: dict) -> list[dict]:
    dtype = torch.bfloat16
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    b = torch.randn(cols, device="cuda", dtype=dtype)
    want = (x.float() * 2 + b.float()).to(dtype)
    out: list[dict] = []
    for backend in ("triton", "cuda"):
        fd = _fusion(dtype)
        (y,) = fd.execute([x, b], backend=backend)
        torch.testing.assert_close(y, want)
        (kernel,) = fd.kernels
        # the kernel's arguments in its spec's order (inputs, then the output)
        tensors = [
            torch.empty_like(x) if is_out else (b if len(shape) == 1 else x)
            for is_out, _, shape, _ in kernel.arg_plan
        ]
        ways = _ways(backend, kernel, tensors)
        if backend == "triton":
            ways = {"bare-cuLaunchKernel": _bare_triton(kernel, tensors), **ways}
        for name, fn in ways.items():
            tensors[-1].zero_()
            row = {**meta, "backend": backend, "way": name}
            try:
                fn()
                torch.cuda.synchronize()
                torch.testing.assert_close(tensors[-1], want)  # the launch did the work
                row["host_us"] = round(host_us(fn, launches, batches), 3)
                print(f"{backend:7s} {name:22s} {row['host_us']:8.2f} us/launch", flush=True)
            except Exception as e:  # a way that fails is reported, the others still run
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{backend:7s} {name:22s} FAILED {row['error']}", flush=True)
            out.append(row)
        us = host_us(_compiled_call(backend, x, b, want), launches, batches)
        out.append({**meta, "backend": backend, "way": "compiled-fn", "host_us": round(us, 3)})
        print(f"{backend:7s} {'compiled-fn':22s} {us:8.2f} us/call", flush=True)
    for backend in ("triton", "cuda"):
        mine = [r for r in out if r["backend"] == backend and "host_us" in r]
        bare = next((r["host_us"] for r in mine if r["way"] == "bare-cuLaunchKernel"), None)
        for r in [r for r in mine if r["way"].startswith("program-") and bare]:
            ratio = r["host_us"] / bare
            verdict = "PASS" if ratio <= 1.5 else "FAIL"
            print(f"{backend} {r['way']}: launch / bare cuLaunchKernel = {ratio:.2f}x ({verdict})")
            out.append({**meta, "backend": backend, "way": f"ratio {r['way']}", "ratio": ratio})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--cols", type=int, default=256)
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--batches", type=int, default=7)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_cost.py measures GPU launches: no CUDA device here")
    import triton

    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "rows": a.rows,
        "cols": a.cols,
    }
    rows = measure(a.rows, a.cols, a.launches, a.batches, meta)
    if a.out:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
