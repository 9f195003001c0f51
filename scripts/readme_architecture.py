"""Rewrite the output block of the README's architecture section: run its python block
and put what it prints in the ```text block after it (nobody types the output by hand).

    python scripts/readme_architecture.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Architecture: one fusion through the pipeline"
BLOCKS = re.compile(r"(```python\n)(.*?)(```\n\n```text\n)(.*?)(```\n)", re.S)


def main() -> int:
    text = README.read_text()
    start = text.index(SECTION)
    m = BLOCKS.search(text, start)
    done = subprocess.run(
        [sys.executable, "-c", m.group(2)], capture_output=True, text=True, check=True
    )
    out = done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"
    README.write_text(text[: m.start(4)] + out + text[m.end(4) :])
    print(f"README.md: {out.count(chr(10))} lines of output written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
