"""A GPU kernel's raised error flag is never cleared in silence: when the kernel that
raised it has been freed (its graph recompiled or reset), poll() still raises."""

from __future__ import annotations

import numpy as np
import pytest

from fuser.errors import OutOfBoundsError
from fuser.runtime import checks


def test_flag_of_a_freed_kernel_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    flag = np.zeros(1, dtype=np.int64)
    monkeypatch.setattr(checks, "_gpu_flag_view", flag)
    monkeypatch.setattr(checks, "_gpu_records", [])  # the kernel that reported is gone
    checks.poll()  # nothing reported: nothing raised
    flag[0] = 1
    with pytest.raises(OutOfBoundsError, match="freed since"):
        checks.poll()
    assert flag[0] == 0  # reported once
    checks.poll()
