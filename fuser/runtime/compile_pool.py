"""Worker processes that compile Triton kernels into Triton's disk cache (the parent's side;
runtime/compile_worker.py is the worker's).

Triton compiles a kernel in Python (the AST walk, MLIR passes) with the GIL held for most
of it, so the thread pool of precompile.py ran a graph's compilations one after another in
effect: 16 threads were no faster than 8 on an H100 host, and a cold GPT-2 124M first
step spent ~5 s there. Here each of a few worker processes warms up kernels for the same
arguments as the main process will (runtime/precompile.py's warm-up), which leaves the
binary and its C launcher in TRITON_CACHE_DIR; the main process's own warm-up then finds
them on disk and only loads them. Workers only fill a cache: whatever one fails to do,
the main process compiles itself, as it did before, and meets any error where it always
did.

Workers are plain subprocesses running compile_worker.py as a script, not
multiprocessing's spawn or forkserver children: those import the parent's `__main__`
again, which runs a user's training script a second time when it has no
`if __name__ == "__main__"` guard; and fork is unsafe once CUDA and threads are up. A
worker imports Triton alone (ready in ~0.3 s) and never touches the GPU.

The pool starts when the first graph with CUDA inputs reaches the backend
(fuser/dynamo/backend.py), where config.compile_processes (FUSER_COMPILE_PROCESSES=1)
asks for it. It is off by default. Measured on an H100 host (GPT-2 124M B=16, cold caches,
two runs each way in one lease, benchmarks/results/h100-2026-11-27-session10): the compile
phase went from 5.04 and 5.09 s to 3.52 and 3.41 s, but the tracing beside the starting
workers went from 5.67 and 4.44 s to 7.23 and 6.71 s, so the whole first step was slower
(18.96 and 16.49 s against 16.84 and 15.11). Why tracing slows (the workers' start-up
compile on a host whose cores are shared, or their imports) is not measured yet; starting
them later, or fewer of them, is the next thing to try.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fuser.runtime.compile_worker import receive, send

WORKER = Path(__file__).with_name("compile_worker.py")


class WorkerPool:
    """`n` worker processes; `submit` returns a Future of a job's answer (None when it
    ran, the error's text when it raised; the Future's exception when the worker died).
    `setup` (module, function, arguments) runs once in each worker before its jobs."""

    def __init__(self, n: int, setup: tuple[str, str, tuple] | None = None) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        self.closed = False
        self._lock = threading.Lock()
        self._serving = n  # server threads still feeding a worker
        env = dict(os.environ, TRITON_INTERPRET="0")  # workers compile, never interpret
        for i in range(n):
            proc = subprocess.Popen(
                [sys.executable, str(WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            self.procs.append(proc)
            if setup is not None:
                send(proc.stdin, setup)
            t = threading.Thread(target=self._serve, args=(proc, setup is not None), daemon=True)
            t.name = f"fuser-compile-worker-{i}"
            t.start()

    def submit(self, module: str, function: str, *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self.closed or not self._serving:
                future.set_exception(RuntimeError("the compile pool is closed"))
            else:
                self.jobs.put((future, (module, function, args)))
        return future

    def _serve(self, proc: subprocess.Popen, setup: bool) -> None:
        """Feed `proc` one job at a time; when it dies, fail its job and stop."""
        try:
            if setup:
                receive(proc.stdout)  # the setup's answer: the worker is ready
        except Exception:
            return self._retire(proc)
        while True:
            future, job = self.jobs.get()
            if future is None:  # close()
                return self._retire(proc)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                send(proc.stdin, job)
                future.set_result(receive(proc.stdout))
            except Exception as e:
                # the worker reaped first: whoever sees its job fail sees it gone (alive())
                self._retire(proc)
                future.set_exception(e)
                return None

    def _retire(self, proc: subprocess.Popen) -> None:
        """Stop `proc`; the last server to stop fails the jobs still queued (nobody would
        ever take them: their waiters would wait for nothing)."""
        try:
            proc.stdin.close()
        except Exception:
            pass
        try:
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
        with self._lock:
            self._serving -= 1
            last = self._serving == 0
        while last:
            try:
                future, _ = self.jobs.get_nowait()
            except queue.Empty:
                return
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("every compile worker has stopped"))

    def alive(self) -> int:
        """How many workers are still running."""
        return sum(p.poll() is None for p in self.procs)

    def close(self) -> None:
        self.closed = True
        for _ in self.procs:
            self.jobs.put((None, None))
