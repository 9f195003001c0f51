"""Host cost of one fused-kernel launch (issue 19's target: the call program's launch
within 1.5x of a bare `cuLaunchKernel` through cuda.bindings with the same arguments).

    python benchmarks/launch_cost.py --out $OUT/launch_cost.jsonl

One small pointwise fusion (y = x * 2 + b over [rows, cols], one block's worth) is
compiled for each backend, then each way of launching it is timed on the host:

- `bare-cuLaunchKernel`: the driver call alone, its parameter block prepared once: the
  CUDA C++ kernel of the same fusion (NVRTC), the same tensors, the same row count. It is
  the floor for both backends' launches (a Triton kernel's parameter list is Triton's
  own: a first try that rebuilt it by hand faulted with an illegal address on the H100,
  cause not found, so the floor is measured where fuser owns the parameter list).
- `program-triton`: the line the call program emits for a Triton kernel
  (fuser/dynamo/program/regions.py): Triton's compiled launcher called directly.
- `program-cuda`: `kernel.launch_unchecked(tensors)`, what the program emits for a
  CUDA C++ kernel (fuser's prepared cuLaunchKernel, fuser/runtime/cuda_backend.py).
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
        return {
            "bare-cuLaunchKernel": _bare_cuda(kernel, tensors),
            "program-cuda": lambda: kernel.launch_unchecked(tensors),
        }
    args = [*tensors, kernel.spec.rows]
    run, function, packed, (gx, gy, gz) = kernel._fast[0]
    stream = torch.cuda.current_stream().cuda_stream

    def program_line() -> None:
        run(gx, gy, gz, stream, function, packed, None, None, None, *args)

    return {"program-triton": program_line}


def _compiled_call(backend: str, x, b, want) -> Callable[[], None]:
    """One call of the same function through torch.compile(backend="fuser")."""
    import fuser

    fuser.config.backend = backend
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, b: x * 2 + b, backend="fuser", dynamic=False)
    torch.testing.assert_close(compiled(x, b), want)
    return lambda: compiled(x, b)


def measure(rows: int, cols: int, launches: int, batches: int, meta: dict) -> list[dict]:
    dtype = torch.bfloat16
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    b = torch.randn(cols, device="cuda", dtype=dtype)
    want = (x.float() * 2 + b.float()).to(dtype)
    out: list[dict] = []
    for backend in ("cuda", "triton"):  # the bare floor first
        fd = _fusion(dtype)
        (y,) = fd.execute([x, b], backend=backend)
        torch.testing.assert_close(y, want)
        (kernel,) = fd.kernels
        tensors = [x, b, torch.empty_like(x)]
        ways = _ways(backend, kernel, tensors)
        for name, fn in ways.items():
            fn()
            torch.cuda.synchronize()
            torch.testing.assert_close(tensors[2], want)  # the launch did the work
            tensors[2].zero_()
            us = host_us(fn, launches, batches)
            out.append({**meta, "backend": backend, "way": name, "host_us": round(us, 3)})
            print(f"{backend:7s} {name:22s} {us:8.2f} us/launch", flush=True)

        us = host_us(_compiled_call(backend, x, b, want), launches, batches)
        out.append({**meta, "backend": backend, "way": "compiled-fn", "host_us": round(us, 3)})
        print(f"{backend:7s} {'compiled-fn':22s} {us:8.2f} us/call", flush=True)
    bare = next(r["host_us"] for r in out if r["way"] == "bare-cuLaunchKernel")
    for backend in ("triton", "cuda"):
        rows_b = {r["way"]: r["host_us"] for r in out if r["backend"] == backend}
        prog = rows_b.get(f"program-{backend}")
        if prog and bare:
            ratio = prog / bare
            verdict = "PASS" if ratio <= 1.5 else "FAIL"
            print(f"{backend}: program launch / bare cuLaunchKernel = {ratio:.2f}x ({verdict})")
            out.append({**meta, "backend": backend, "way": "ratio", "ratio": round(ratio, 3)})
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
