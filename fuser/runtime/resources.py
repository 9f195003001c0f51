"""What the real compiler makes of a kernel: registers, stack/spills, shared memory.

Works without a GPU: Triton compiles for GPUTarget("cuda", 90, 32), NVRTC compiles the
CUDA backend's source for sm_90, and either cubin is read with the cuobjdump that ships
inside the Triton wheel. Triton's interpreter mode (chosen at import) cannot compile, so
in that mode a Triton compile runs in a child process; NVRTC runs in-process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fuser.config import use_interpreter
from fuser.errors import CompileError
from fuser.runtime.cuda_backend import compile_cubin
from fuser.runtime.triton_backend import TRITON_OPTIONS
from fuser.schedulers.spec import CHECK_PARAMS

TL_PTR = {
    "float32": "*fp32",
    "float16": "*fp16",
    "bfloat16": "*bf16",
    "float64": "*fp64",
    "int32": "*i32",
    "int64": "*i64",
    "bool": "*i1",
}


def cuobjdump() -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def parse_resource_usage(text: str) -> dict[str, dict[str, int]]:
    """{function: {registers, stack, shared, local}} from `cuobjdump --dump-resource-usage`."""
    out, fn = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        if fn and "REG:" in line:
            vals = dict(re.findall(r"(\w+):(\d+)", line))
            out[fn] = {
                "registers": int(vals.get("REG", 0)),
                "stack": int(vals.get("STACK", 0)),
                "shared": int(vals.get("SHARED", 0)),
                "local": int(vals.get("LOCAL", 0)),
            }
    return out


def _cuobjdump(cubin: bytes, flag: str) -> str:
    """What cuobjdump `flag` prints about `cubin`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        return subprocess.run(
            [cuobjdump(), flag, path], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.unlink(path)


def cubin_resources(cubin: bytes) -> dict[str, dict[str, int]]:
    return parse_resource_usage(_cuobjdump(cubin, "--dump-resource-usage"))


def sass(cubin: bytes) -> str:
    """The machine code of `cubin` as cuobjdump prints it (what ptxas made of the PTX)."""
    return _cuobjdump(cubin, "-sass")


def _cuda_cubin(kernel: Any, arch: str) -> bytes:
    return compile_cubin(kernel.source, kernel.name, arch)


def cuda_sass(kernel: Any, arch: str = "sm_90") -> str:
    """A CUDA kernel's machine code for `arch`, compiled through NVRTC; no GPU."""
    return sass(_cuda_cubin(kernel, arch))


def triton_sass(kernel: Any, arch: str = "sm_90") -> str:
    """A Triton kernel's machine code for `arch`, compiled as the runtime compiles it."""
    job = _job(kernel, arch)
    if not use_interpreter():
        return _triton_sass(job)
    return _in_child("sass", [job])[0]


def _triton_sass(job: dict) -> str:
    return sass(triton_cubin(job))


def _job(kernel: Any, arch: str) -> dict:
    sig = {f"{a.name}_ptr": TL_PTR[a.dtype.value] for a in kernel.spec.args}
    ptr = {"torch.float32": "*fp32", "torch.float64": "*fp64", "torch.int64": "*i64"}
    sig.update(
        {f"{w}_ptr": ptr[str(dt)] for w, dt in zip(kernel.workspaces, kernel.workspace_dtypes)}
    )
    if kernel.spec.checks:
        sig.update({name: "*i64" for name in CHECK_PARAMS})
    sig["n_rows"] = "i32"
    aligned = [i for i, a in enumerate(kernel.spec.args) if a.align == 16]
    extra = len(kernel.workspaces) + (len(CHECK_PARAMS) if kernel.spec.checks else 0)
    aligned += [len(kernel.spec.args) + i for i in range(extra)]
    return {
        "source": kernel.source,
        "name": kernel.name,
        "signature": sig,
        "aligned": aligned,
        "num_warps": kernel.plan.num_warps,
        "arch": int(arch.removeprefix("sm_")),
    }


def _compile_triton(job: dict) -> dict:
    res = cubin_resources(triton_cubin(job))
    return _with_spills(res.get(job["name"]) or next(iter(res.values())))


def triton_cubin(job: dict) -> bytes:
    """The cubin Triton compiles from a `_job`, with the runtime's own options."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{job['name']}.py"
        path.write_text(job["source"])
        spec = importlib.util.spec_from_file_location(f"_res_{job['name']}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = getattr(mod, job["name"])
        attrs = {(i,): [["tt.divisibility", 16]] for i in job["aligned"]}
        src = ASTSource(fn=fn, signature=job["signature"], constexprs={}, attrs=attrs)
        compiled = triton.compile(
            src,
            target=GPUTarget("cuda", job["arch"], 32),
            options={"num_warps": job["num_warps"], **TRITON_OPTIONS},
        )
        return compiled.asm["cubin"]


def _with_spills(r: dict[str, int]) -> dict:
    return {**r, "spill_bytes": r["stack"] + r["local"]}


def cuda_resources(kernel: Any, arch: str = "sm_90") -> dict:
    """NVRTC compiles the CUDA source to a cubin for `arch` (no GPU needed); cuobjdump
    reads it. A split column reduction's finalize kernel is reported under "finalize"."""
    res = cubin_resources(_cuda_cubin(kernel, arch))
    out = _with_spills(res.get(kernel.name) or next(iter(res.values())))
    fin = res.get(kernel.name + "_finalize")
    if fin is not None:
        out["finalize"] = _with_spills(fin)
    return out


def triton_resources(kernel: Any, arch: str = "sm_90") -> dict:
    """Triton compiles the kernel for `arch` (no GPU needed); cuobjdump reads the cubin."""
    job = _job(kernel, arch)
    if not use_interpreter():
        return _compile_triton(job)
    return resources_in_child([job])[0]


def resources_in_child(jobs: list[dict]) -> list[dict]:
    return _in_child("resources", jobs)


def _in_child(what: str, jobs: list[dict]) -> list[Any]:
    """`what` ("resources" or "sass") of Triton `jobs`, compiled in a child process: the
    interpreter, once on in this one, replaces the JIT that triton.compile needs."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "fuser.runtime.resources", what],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise CompileError(f"compiling for resources failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def many_resources(kernels: list[Any], arch: str = "sm_90") -> list[dict]:
    """Resources of many Triton kernels in one child process (fast for sweeps)."""
    jobs = [_job(k, arch) for k in kernels]
    results = (
        [_compile_triton(j) for j in jobs] if not use_interpreter() else resources_in_child(jobs)
    )
    for k, r in zip(kernels, results):
        k._resources[arch] = r
    return results


if __name__ == "__main__":
    work = {"resources": _compile_triton, "sass": _triton_sass}[sys.argv[1]]
    print(json.dumps([work(j) for j in json.loads(sys.stdin.read())]))
