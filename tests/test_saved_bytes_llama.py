"""What the backward keeps, for a tiny Llama (RMSNorm, rotary embeddings, SwiGLU,
grouped-query attention): no more than AOTAutograd's min-cut partition with Inductor's
decompositions keeps (fuser/dynamo/saved.py; GPT-2's in tests/test_saved_bytes.py)."""

from __future__ import annotations

import pytest
import torch

from fuser.dynamo.backend import FuserBackend
from tests.test_saved_bytes import F32, _fresh_dynamo, _kept  # noqa: F401


def test_llama_keeps_no_more_than_the_min_cut_with_inductors_decompositions():
    """A tiny Llama (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention): fuser's
    partition keeps no more than AOTAutograd's min-cut partition with Inductor's
    decompositions (torch's aot_eager_decomp_partition backend) keeps, within 1%, and no
    more float32 activations of the hidden size."""
    pytest.importorskip("transformers")
    from fuser.suite import models

    model = models.build("llama", "tiny", "cpu")
    batch = models.batch("llama", "tiny", model, "cpu", 0)
    tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
    inputs = [*tensors, *model.parameters(), *model.buffers()]
    results = {}
    for name, backend in (("fuser", FuserBackend(strict=True)), ("min_cut", None)):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend or "aot_eager_decomp_partition")
        out, kept, listed = _kept(compiled, inputs, **batch)
        out.loss.backward()
        model.zero_grad()
        results[name] = (sum(kept.values()), listed)
    (ours, ours_listed), (ref, ref_listed) = results["fuser"], results["min_cut"]
    assert ours <= ref * 1.01, (ours, ref, ours_listed, ref_listed)
    hidden = model.config.hidden_size

    def wide_f32(listed: list) -> int:
        return sum(1 for shape, dtype in listed if dtype == F32 and shape[-1:] == (hidden,))

    assert wide_f32(ours_listed) <= wide_f32(ref_listed), (ours_listed, ref_listed)
