"""Check the CUDA backend on a GPU: correctness of every case, compile times, a quick sweep.

For every case of tests/test_cuda_cases.py (every scheduler kind, random data, odd
sizes, misaligned and non-contiguous inputs) the fusion runs with backend="cuda" and is
compared with fd.reference. For each kernel the script times a cold NVRTC compile (empty
memory and disk caches) and a compile served from the disk cache. A last section times
the seed fusion's sweep with both backends and eager (median of triton.testing.do_bench,
L2 flushed), so the two backends are seen side by side in one run.

    PYTHONPATH=. python benchmarks/gpu_cuda_check.py --out cuda.json [--no-timing]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_cuda_cases import GPU_CASES, SEED_SWEEP, compare  # noqa: E402

from fuser.config import config  # noqa: E402
from fuser.runtime import cuda_backend  # noqa: E402


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    for pkg in ("triton", "cuda-core", "cuda-bindings", "cuda-pathfinder", "nvidia-cuda-nvrtc"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "missing"
    try:
        out["nvrtc"] = cuda_backend.nvrtc_version()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["nvrtc"] = f"unavailable: {e}"
    return out


def compile_times(kernels: list, arch: str) -> list[dict]:
    """Per kernel: a cold NVRTC compile and one served by the disk cache (fresh folder)."""
    out = []
    saved = (config.cache_dir, config.disk_cache)
    with tempfile.TemporaryDirectory() as d:
        config.cache_dir, config.disk_cache = Path(d), True
        try:
            for k in kernels:
                row = {"kernel": k.name, "schedule": k.schedule.short()}
                for label in ("cold", "disk"):
                    cuda_backend.clear_memory_cache()
                    t0 = time.perf_counter()
                    cuda_backend.compile_cubin(k.source, k.name, arch)
                    row[f"{label}_ms"] = (time.perf_counter() - t0) * 1e3
                    row[f"{label}_from"] = cuda_backend.last_compile[k.name].source
                r = k.resources(arch)
                row |= {"registers": r["registers"], "estimate": r["estimate"]}
                row |= {"spill_bytes": r["spill_bytes"], "shared": r["shared"]}
                out.append(row)
        finally:
            config.cache_dir, config.disk_cache = saved
            cuda_backend.clear_memory_cache()
    return out


def check_cases(arch: str, device: str = "cuda") -> list[dict]:
    results = []
    for case in GPU_CASES:
        if device == "cpu" and not case.emulate:
            continue
        row: dict = {"case": case.name}
        try:
            fd = case.fusion()
            inputs = case.inputs(device)
            t0 = time.perf_counter()
            out = fd.execute(inputs, backend="cuda")
            if device == "cuda":
                torch.cuda.synchronize()
            row["first_call_ms"] = (time.perf_counter() - t0) * 1e3
            err = compare(fd, case, inputs, out)
            row["kinds"] = sorted({k.schedule.kind for k in fd.kernels})
            row["ok"] = not err
            row["error"] = err
            row["kernels"] = compile_times(fd.kernels, arch)
        except Exception:  # noqa: BLE001 - one case failing must not hide the others
            row["ok"] = False
            row["error"] = traceback.format_exc()[-3000:]
        results.append(row)
        status = "PASS" if row["ok"] else "FAIL"
        kernels = row.get("kernels", [])
        times = ", ".join(f"{k['cold_ms']:.0f}/{k['disk_ms']:.1f} ms" for k in kernels)
        regs = ", ".join(f"{k['registers']}r(est {k['estimate']})" for k in kernels)
        print(f"{status}  {case.name:36s} {','.join(row.get('kinds', [])):34s} {times:24s} {regs}")
        if not row["ok"]:
            print("      " + row["error"].strip().replace("\n", "\n      ")[:2000])
    return results


def launcher_check() -> dict:
    """The plain cuda.bindings driver path, on a few cases."""
    from test_cuda_cases import CASES, run_case

    out = {}
    saved = cuda_backend.LAUNCHER
    cuda_backend.LAUNCHER = "bindings"
    cuda_backend.clear_memory_cache()
    try:
        for name in ("seed_3x5140", "column_sum_f32_split", "softmax_f16_50257"):
            case = next(c for c in CASES if c.name == name)
            try:
                err, _ = run_case(case, "cuda")
                out[name] = err or "ok"
            except Exception:  # noqa: BLE001
                out[name] = traceback.format_exc()[-1500:]
    finally:
        cuda_backend.LAUNCHER = saved
        cuda_backend.clear_memory_cache()
    return out


def sweep_timing(rows: int = 8192) -> list[dict]:
    """The seed fusion with backend cuda, backend triton and eager: median ms and GB/s."""
    import torch.nn.functional as F
    from triton.testing import do_bench

    from fuser.examples import seed_inputs, seed_layernorm_fusion

    def eager(t0, t1, t2, t3, t4):  # noqa: ANN001, ANN202
        t13 = (t1.float() + t0.float()).half().float() + t2.float()
        return (F.layer_norm(t13, t13.shape[-1:]) * t4.float() + t3.float()).half()

    out = []
    for h in SEED_SWEEP:
        inputs = seed_inputs(rows, h, device="cuda")
        nbytes = sum(t.numel() * t.element_size() for t in inputs) + rows * h * 2
        row: dict = {"hidden": h, "rows": rows, "bytes": nbytes}
        for label in ("cuda", "triton", "eager"):
            try:
                if label == "eager":
                    fn = lambda ins=inputs: eager(*ins)  # noqa: E731
                else:
                    fd = seed_layernorm_fusion()
                    fd.execute(inputs, backend=label)
                    row[f"{label}_schedule"] = fd.kernels[0].schedule.short()
                    fn = lambda fd=fd, b=label, ins=inputs: fd.execute(ins, backend=b)  # noqa: E731
                ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                row[f"{label}_ms"] = ms
                row[f"{label}_gbps"] = nbytes / ms / 1e6
            except Exception as e:  # noqa: BLE001
                row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:500]
        out.append(row)
        cells = "  ".join(
            f"{b} {row[f'{b}_gbps']:7.0f} GB/s" if f"{b}_gbps" in row else f"{b} error"
            for b in ("cuda", "triton", "eager")
        )
        print(f"H={h:6d}  {cells}  [{row.get('cuda_schedule', '')}]")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--no-timing", action="store_true", help="skip the sweep timing")
    ap.add_argument(
        "--emulate", action="store_true", help="no GPU: run the small cases in the g++ emulator"
    )
    args = ap.parse_args()
    if args.emulate:
        cuda_backend.EMULATE_ON_CPU = True
        device, arch, name = "cpu", "sm_90", "CPU (g++ emulation of the CUDA kernels)"
    elif not torch.cuda.is_available():
        print("no CUDA GPU here; --emulate runs the small cases on the CPU")
        return 2
    else:
        dev = torch.cuda.current_device()
        device, arch = "cuda", cuda_backend.device_arch(torch.device("cuda", dev))
        name = torch.cuda.get_device_name(dev)
    report: dict = {
        "device": name,
        "arch": arch,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
    }
    print(f"{report['device']} ({arch}), {report['versions']}")
    print(
        "case                                      kinds                              "
        "compile cold/disk        registers (CUDA estimate)"
    )
    report["cases"] = check_cases(arch, device)
    if device == "cuda":
        report["bindings_launcher"] = launcher_check()
        print(f"cuda.bindings launcher: {report['bindings_launcher']}")
        if not args.no_timing:
            report["sweep"] = sweep_timing()
    passed = sum(r["ok"] for r in report["cases"])
    report["summary"] = f"{passed} passed, {len(report['cases']) - passed} failed"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(report["summary"])
    print(f"wrote {args.out}")
    return 0 if passed == len(report["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
