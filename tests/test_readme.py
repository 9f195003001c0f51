"""Every ```python block of the README runs as written: each block alone, as a script in a
fresh process, from a temporary folder outside the clone (so `import fuser` and
`fuser.examples` come from the installed package, not the current folder).

A block that needs a GPU starts with the line `# needs a GPU`; on CPU it is skipped, and
`python -m pytest tests/test_readme.py -rs` lists the skipped ones (a GPU run runs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS_GPU = "# needs a GPU"
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block of `text`."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _FENCE.finditer(text)]


BLOCKS = python_blocks(README.read_text())


def test_blocks_are_found_and_gpu_blocks_marked() -> None:
    blocks = python_blocks(
        "```python\nx = 1\n```\n\n```bash\nls\n```\n```python\n# needs a GPU\ny\n```\n"
    )
    assert [src for _, src in blocks] == ["x = 1\n", "# needs a GPU\ny\n"]
    assert [line for line, _ in blocks] == [1, 8]
    assert len(BLOCKS) >= 3  # the README's fusion, torch.compile and trace examples


@pytest.mark.parametrize("line,source", BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_readme_block_runs(line: int, source: str, tmp_path: Path) -> None:
    if source.startswith(NEEDS_GPU) and not torch.cuda.is_available():
        pytest.skip(f"README.md:{line} needs a GPU")
    script = tmp_path / f"readme_{line}.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"README.md:{line} failed:\n{done.stderr[-4000:]}"
