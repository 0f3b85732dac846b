"""The README's "Use" snippets, run as written in a fresh interpreter (one program, in order, as a
reader would paste them), so that what it promises a newcomer keeps working: on a machine without
a GPU they print "none 0 0 3" and True, every call eager with eager's results."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

_README = Path(__file__).resolve().parents[2] / "README.md"


def _use_snippets() -> str:
    text = _README.read_text(encoding="utf-8")
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, f"the Use section has {len(blocks)} python blocks, not 2"
    return "\n".join(blocks)


def test_the_use_snippets_run_as_written_and_print_what_the_readme_says():
    result = subprocess.run(
        [sys.executable, "-c", _use_snippets()],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    printed = result.stdout.split()
    assert printed[-1] == "True", result.stdout
    if not torch.cuda.is_available():
        assert result.stdout.splitlines()[0] == "none 0 0 3", result.stdout
        assert "eager: unavailable" in result.stderr, result.stderr
