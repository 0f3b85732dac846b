"""The README's "Use" snippet, run as written in a fresh interpreter (as a reader would paste it),
so that what it promises a newcomer keeps working: on a machine without a GPU it prints
"none 0 0 3", every call eager with eager's results, and the report (on standard output, where a
script's reader sees it) has the row "eager: unavailable"."""

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
    assert len(blocks) == 1, f"the Use section has {len(blocks)} python blocks, not 1"
    return blocks[0]


def test_the_use_snippets_run_as_written_and_print_what_the_readme_says():
    result = subprocess.run(
        [sys.executable, "-c", _use_snippets()],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "graphed: runners of this process" in lines, result.stdout
    if not torch.cuda.is_available():
        assert lines[0] == "none 0 0 3", result.stdout
        assert "eager: unavailable" in result.stdout, result.stdout
    else:
        assert lines[0].split()[1:] in (["1", "2", "0"], ["1", "3", "0"]), result.stdout
        assert "enabled" in result.stdout, result.stdout
