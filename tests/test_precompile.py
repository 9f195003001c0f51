"""The compile pool's work ahead of a graph's first call (fuser/runtime/precompile.py)."""

from __future__ import annotations

import threading


def test_the_pool_builds_one_launcher_per_signature(monkeypatch) -> None:
    """Triton makes a C launcher per argument signature at a kernel's first launch; the
    pool builds them ahead (precompile.prebuild_launchers): once per signature, futures
    resolved, failures left to the first launch."""
    import sys
    import types

    import triton.runtime.driver  # noqa: F401  (the module, shadowed by its `driver`)

    from fuser.runtime.precompile import prebuild_launchers

    triton_driver = sys.modules["triton.runtime.driver"]

    built: list[str] = []

    def launcher_cls(src, meta):  # noqa: ANN001, ANN202
        if src.signature == "bad":
            raise RuntimeError("no C compiler")
        built.append(src.signature)

    fake = types.SimpleNamespace(active=types.SimpleNamespace(launcher_cls=launcher_cls))
    monkeypatch.setattr(triton_driver, "driver", fake)

    def kernel(sig: str) -> types.SimpleNamespace:
        src = types.SimpleNamespace(signature=sig, constants={})
        return types.SimpleNamespace(src=src, metadata=types.SimpleNamespace())

    class Future:  # as Triton's FutureKernel: the kernel once its compile is done
        def __init__(self, k):  # noqa: ANN001
            self.k = k

        def result(self, ignore_errors: bool = False):  # noqa: ANN202
            return self.k

    compiled = [kernel("a"), Future(kernel("a")), kernel("b"), kernel("bad"), None]
    assert prebuild_launchers(compiled, 2) == 3  # a, b and the failing one were tried
    assert sorted(built) == ["a", "b"]


def test_triton_key_is_hashed_once_in_a_thread(monkeypatch) -> None:
    """prefetch_triton_key hashes Triton's installation in a thread (started once) and
    precompile waits for it: the key is computed once, not again beside the thread."""
    import triton.runtime.cache as triton_cache

    from fuser.runtime import precompile

    calls: list[str] = []

    def key() -> str:
        calls.append(threading.current_thread().name)
        return "key"

    monkeypatch.setattr(triton_cache, "triton_key", key)
    monkeypatch.setattr(precompile, "_key_thread", None)
    precompile.prefetch_triton_key()
    precompile.prefetch_triton_key()  # a second graph's compile: the same thread
    precompile._wait_triton_key()
    assert calls == ["fuser-triton-key"]
    assert not precompile._key_thread.is_alive()
